"""The loop of every periodic thread of the two processes: the status flush, the
blocked-writes log, the capability refresh, the webhook certificate check, and the
webhook server's start once its certificate is there."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .client import ApiError

log = logging.getLogger("headroom.loop")


def every(
    seconds: float,
    stop: threading.Event,
    step: Callable[[], bool | None],
    what: str,
    component: str,
    on_error: Callable[[str], None],
    first: float | None = None,
) -> None:
    """Run `step` every `seconds` until `stop` is set or it returns True (done), the first
    time after `first` seconds (default: `seconds`). A failure never ends the loop: the API
    server's refusal is logged as "<what> failed; retrying", anything else with its
    traceback as "<what> crashed; retrying", and either is counted as an error of
    `component` (headroom_errors_total)."""
    wait = seconds if first is None else first
    while not stop.wait(wait):
        wait = seconds
        try:
            if step():
                return
        except ApiError as exc:
            log.warning(f"{what} failed; retrying", extra={"error": str(exc)})
            on_error(component)
        except Exception:
            log.exception(f"{what} crashed; retrying")
            on_error(component)
