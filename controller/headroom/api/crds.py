"""Generate the CRD manifests in `crds/` from the pydantic models.

pydantic's JSON Schema is the input; this module rewrites it into a Kubernetes
structural schema: `$ref` inlined, `anyOf` with null collapsed, titles and
`additionalProperties: false` dropped, OpenAPI 3.0 boolean `exclusiveMinimum`,
`const` as a one-value `enum`, null defaults removed.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from ruamel.yaml import YAML

from ..core import keys
from .models import (
    HeadroomConfigSpec,
    HeadroomConfigStatus,
    NodePoolProfileSpec,
    NodePoolProfileStatus,
)


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is not None:
        target = dict(defs[ref.rsplit("/", 1)[-1]])
        if "description" in node:  # the field's own words beat the class docstring
            target.pop("description", None)
        node = {**target, **node}
    branches = node.get("anyOf")
    if branches is not None:
        rest = [b for b in branches if b != {"type": "null"}]
        if len(rest) != len(branches):
            node.pop("anyOf")
            if len(rest) == 1:
                inner = _structural(rest[0], defs)
                node = {**inner, **{k: v for k, v in node.items() if k not in ("default",) or v is not None}}
            else:
                node["anyOf"] = rest
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "default" and value is None:
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
            continue
        if key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
            continue
        out[key] = _structural(value, defs)
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out.pop("additionalProperties", None)  # implied; structural schemas refuse both
    return out


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True)
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    return schema


def _col(name: str, kind: str, path: str, wide: bool = False) -> dict[str, Any]:
    """A printer column; `wide`: shown only by `kubectl get -o wide`."""
    col: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if wide:
        col["priority"] = 1
    return col


def _cond(name: str, condition: str, field: str, wide: bool = False) -> dict[str, Any]:
    """A printer column showing one field of one status condition."""
    return _col(name, "string", f'.status.conditions[?(@.type=="{condition}")].{field}', wide)


def _crd(
    kind: str,
    plural: str,
    short: str,
    spec: type[BaseModel],
    status: type[BaseModel],
    columns: list[dict[str, Any]],
    description: str,
    spec_required: bool,
    root_rules: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    spec_schema = schema_of(spec)
    if not spec_required:
        spec_schema["default"] = {}
    root: dict[str, Any] = {
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object: kube-headroom.dev/v1alpha1."},
            "kind": {"type": "string", "description": f"Kind of this object: {kind}."},
            # The API server allows nothing but `type` here (it owns metadata's schema).
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": schema_of(status),
        },
    }
    if spec_required:
        root["required"] = ["spec"]
    if root_rules:
        root["x-kubernetes-validations"] = root_rules
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{keys.GROUP}"},
        "spec": {
            "group": keys.GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["headroom"],
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": keys.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


_AGE = _col("Age", "date", ".metadata.creationTimestamp")


# An age in `kubectl get -o wide`: the leader renews it every minute, so more means no controller.
# A default column, beside Ready: a controller that stopped cannot turn its own Ready
# False, so the age of its last heartbeat (renewed every minute) is what shows it.
_HEARTBEAT = _col("Heartbeat", "date", ".status.lastHeartbeatTime")


def definitions() -> dict[str, dict[str, Any]]:
    """File name in `crds/` → CRD object."""
    config = _crd(
        keys.CONFIG_KIND,
        keys.CONFIG_PLURAL,
        "hrc",
        HeadroomConfigSpec,
        HeadroomConfigStatus,
        [
            _cond("Ready", "Ready", "status"),
            _HEARTBEAT,
            _col("Mode", "string", ".status.mode"),
            _col("Nodes", "integer", ".status.nodes"),
            _col("Managed", "integer", ".status.managedPods"),
            _col("At Target", "integer", ".status.podsAtTarget"),
            _AGE,
            _col("Pending", "integer", ".status.pendingResizes", wide=True),
            _cond("Reason", "Ready", "reason", wide=True),
            _cond("Message", "Ready", "message", wide=True),
        ],
        "HeadroomConfig is the cluster-wide Headroom configuration; exactly one, named cluster.",
        spec_required=False,
        root_rules=[
            {
                "rule": f"self.metadata.name == '{keys.SINGLETON_NAME}'",
                "message": f"HeadroomConfig is a singleton: metadata.name must be '{keys.SINGLETON_NAME}'",
            }
        ],
    )
    profile = _crd(
        keys.PROFILE_KIND,
        keys.PROFILE_PLURAL,
        "npp",
        NodePoolProfileSpec,
        NodePoolProfileStatus,
        [
            _cond("Ready", "Ready", "status"),
            _HEARTBEAT,
            _col("Priority", "integer", ".spec.priority"),
            _col("Nodes", "integer", ".status.matchedNodes"),
            _col("Managed", "integer", ".status.managedPods"),
            _col("Factor", "string", ".status.averageFactor"),
            _col("Effective", "string", ".status.effectiveFactor"),
            _col("Mode", "string", ".status.mode"),
            # A profile that loses its nodes to another must read as a problem at a glance.
            _cond("Conflict", "Conflict", "status"),
            _AGE,
            _col("Pending", "integer", ".status.pendingResizes", wide=True),
            _cond("Message", "Conflict", "message", wide=True),
            _cond("Ready Message", "Ready", "message", wide=True),
        ],
        "NodePoolProfile overrides Headroom settings for the nodes its selector picks.",
        spec_required=True,
    )
    return {
        f"{keys.GROUP}_headroomconfigs.yaml": config,
        f"{keys.GROUP}_nodepoolprofiles.yaml": profile,
    }


def render(obj: dict[str, Any]) -> str:
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 4096
    buf = io.StringIO()
    buf.write("# Generated by `headroom crds --write` from controller/headroom/api/models.py. Do not edit.\n")
    yaml.dump(obj, buf)
    return buf.getvalue()


def stale_files(directory: Path) -> list[str]:
    """Names of files in `directory` that differ from what the models generate."""
    out = []
    for name, obj in definitions().items():
        path = directory / name
        if not path.exists() or path.read_text() != render(obj):
            out.append(name)
    return out


def write(directory: Path) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    for name, obj in definitions().items():
        (directory / name).write_text(render(obj))
    return sorted(definitions())
