"""Structured logs: one JSON object per line by default, `key=value` text for people.

Fields come from `extra={...}` on each call; tokens and credentials are never passed in
(the client's configuration is not logged anywhere).
"""

from __future__ import annotations

import logging
import sys
import time
import unicodedata
from typing import Any

import orjson

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def _unsafe(ch: str) -> bool:
    """A character that must not reach a terminal raw: a space, a quote or `=` (they would
    split or fake a field), a control character (C0, DEL, C1), a format character (the
    bidirectional overrides and isolates that reorder what is shown) or a line or paragraph
    separator."""
    return ch in ' "=' or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


def _escape(text: str) -> str:
    """JSON's escaping, and \\uXXXX for the characters it leaves raw (DEL, C1, format
    characters, separators)."""
    quoted = orjson.dumps(text).decode()
    return "".join(f"\\u{ord(ch):04x}" if ord(ch) >= 0x7F and _unsafe(ch) else ch for ch in quoted)


def _text(value: Any) -> str:
    """A field's value for a text line: quoted and escaped when it holds a character
    `_unsafe` names, so that a name from the cluster can neither start a line of its own,
    move the terminal's cursor nor show its text reordered."""
    text = str(value)
    if any(_unsafe(ch) for ch in text):
        return _escape(text)
    return text


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={_text(v)}" for k, v in _fields(record).items())
        line = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {record.getMessage()}"
        line = f"{line}  {extra}" if extra else line
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(fmt: str = "json", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logging.Formatter.converter = time.gmtime
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # urllib3 warns on every retried connection; our own lines say what failed and why
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
