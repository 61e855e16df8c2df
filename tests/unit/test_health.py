"""The controller's health: a dead thread or a silent watch fails /healthz."""

from __future__ import annotations

import threading


def test_healthz_fails_when_a_thread_died_or_a_watch_went_silent():
    from headroom.cluster.watch import Reflector
    from headroom.engine.controller import Controller, Options

    c = Controller(api=None, options=Options(leader_elect=False))  # type: ignore[arg-type]
    assert c.healthy() == (True, "ok")
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    c.inputs.threads["worker-0"] = dead
    assert c.healthy() == (False, "thread worker-0 has died")
    del c.inputs.threads["worker-0"]
    r = Reflector(None, "/api/v1/pods", lambda items: None, lambda k, o: None, c.stop, timeout_seconds=10)  # type: ignore[arg-type]
    c.watches.reflectors.append(r)
    r.last_contact -= 1000
    ok, why = c.healthy()
    assert not ok and why.startswith("nothing heard from the watch of /api/v1/pods")
    assert c.inputs_problem() == "the first list of /api/v1/pods has not completed"
