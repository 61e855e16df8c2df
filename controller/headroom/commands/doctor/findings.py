"""What a check finds: a level, the check's name, and a message that says what to do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...cluster.client import Api, ApiError

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"


@dataclass(frozen=True, slots=True)
class Finding:
    level: str
    check: str
    message: str

    def __str__(self) -> str:
        mark = {OK: "ok  ", INFO: "info", WARN: "WARN", FAIL: "FAIL"}[self.level]
        return f"{mark}  {self.check}: {self.message}"


def items(api: Api, path: str) -> list[dict[str, Any]] | None:
    """Every item, [] when the kind is not installed, None when this identity may not list it."""
    try:
        return [i for page in api.list_pages(path) for i in page.get("items") or ()]
    except ApiError as exc:
        if exc.status == 404:
            return []
        if exc.status == 403:
            return None
        raise


def unreadable(check: str, what: str) -> Finding:
    return Finding(WARN, check, f"not checked: this identity may not list {what}; run doctor as a cluster admin")
