"""Run the shipped Argo CD health.lua scripts the way Argo CD does: Lua 5.1, `obj` global."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lupa import lua51

ROOT = Path(__file__).resolve().parents[2]
CUSTOMIZATIONS = ROOT / "examples" / "gitops" / "argocd" / "resource_customizations" / "kube-headroom.dev"
APPLICATION = CUSTOMIZATIONS.parent / "argoproj.io" / "Application" / "health.lua"
KINDS = ("HeadroomConfig", "NodePoolProfile")


def health(obj: dict[str, Any]) -> dict[str, str]:
    script = (APPLICATION if obj["kind"] == "Application" else CUSTOMIZATIONS / obj["kind"] / "health.lua").read_text()
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(script)
    return {"status": str(hs["status"]), "message": str(hs["message"] or "")}
