"""What a check finds: a level, the check's name, and a message that says what to do."""

from __future__ import annotations

from dataclasses import dataclass

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"


@dataclass(frozen=True, slots=True)
class Finding:
    level: str
    check: str
    message: str

    def __str__(self) -> str:
        mark = {OK: "ok  ", INFO: "info", WARN: "WARN", FAIL: "FAIL"}[self.level]
        return f"{mark}  {self.check}: {self.message}"


def unreadable(check: str, what: str) -> Finding:
    return Finding(WARN, check, f"not checked: this identity may not list {what}; run doctor as a cluster admin")
