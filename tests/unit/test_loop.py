"""The loop every periodic thread runs: a failure is logged and counted, never the end."""

import logging
import threading

from headroom.cluster.client import ApiError
from headroom.cluster.loop import every


def test_a_failing_step_is_logged_counted_and_run_again_until_done(caplog):
    outcomes = [ApiError(503, "ServiceUnavailable", "etcd is busy"), RuntimeError("a bug"), None, True]
    counted: list[str] = []

    def step() -> bool | None:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    with caplog.at_level(logging.WARNING, logger="headroom.loop"):
        every(0.0, threading.Event(), step, "status update", "status", counted.append)
    assert outcomes == [] and counted == ["status", "status"]  # ended by the step, after two failures
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert messages == [("WARNING", "status update failed; retrying"), ("ERROR", "status update crashed; retrying")]
    assert caplog.records[1].exc_info is not None  # the bug's traceback is in the log


def test_the_loop_ends_when_stopped_and_waits_first_unless_told():
    stop, ran = threading.Event(), []
    stop.set()
    every(60.0, stop, lambda: ran.append(1), "check", "health", lambda c: None)
    assert ran == []  # stopped before the first wait ended: nothing run
    stop = threading.Event()

    def once() -> bool:
        ran.append(1)
        return True

    every(60.0, stop, once, "check", "health", lambda c: None, first=0.0)
    assert ran == [1]  # first=0: at once, without the 60 s wait
