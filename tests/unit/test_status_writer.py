"""The status the controller writes on HeadroomConfig and NodePoolProfiles: the mode, the
heartbeat, profiles that tie on a node."""

from __future__ import annotations

from helpers.factories import Clock


def test_config_mode_is_mixed_when_pools_differ():
    from headroom.api.resolve import resolve
    from headroom.engine.status import NodeStat, StatusWriter

    res = resolve(
        [{"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}],
        [
            {
                "apiVersion": "kube-headroom.dev/v1alpha1",
                "kind": "NodePoolProfile",
                "metadata": {"name": "batch"},
                "spec": {"nodeSelector": {"matchLabels": {"pool": "batch"}}, "dryRun": True},
            }
        ],
    )
    sw = StatusWriter(None, lambda kind: [], lambda: res, lambda: {})  # type: ignore[arg-type]
    sw.nodes = {"a": NodeStat(pool="batch", managed=2), "b": NodeStat(pool="", managed=1)}
    status = sw.config_status({"metadata": {"name": "cluster", "generation": 1}})
    assert status["mode"] == "Mixed"
    assert {p["name"]: p["mode"] for p in status["pools"]} == {"(default)": "Active", "batch": "DryRun"}
    # without a HeadroomConfig nothing is written anywhere: the profile says Blocked, not Active
    profiles = [
        {
            "apiVersion": "kube-headroom.dev/v1alpha1",
            "kind": "NodePoolProfile",
            "metadata": {"name": "batch", "generation": 1},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "batch"}}},
        }
    ]
    blocked = resolve([], profiles)
    sw = StatusWriter(None, lambda kind: [], lambda: blocked, lambda: {})  # type: ignore[arg-type]
    sw.nodes = {"a": NodeStat(pool="batch", managed=0)}
    assert sw.profile_status(profiles[0])["mode"] == "Blocked"


def test_an_unchanged_status_is_rewritten_once_a_minute_as_a_heartbeat():
    from headroom.api.resolve import resolve
    from headroom.engine.status import StatusWriter

    class FakeWriter:
        def __init__(self):
            self.bodies = []

        def fence(self):
            pass

        def apply_status(self, body):
            self.bodies.append(body)

        def object_event(self, *a, **kw):
            pass

    clock = Clock()
    res = resolve(
        [{"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}], []
    )
    obj = {
        "apiVersion": "kube-headroom.dev/v1alpha1",
        "kind": "HeadroomConfig",
        "metadata": {"name": "cluster", "generation": 1},
    }
    w = FakeWriter()
    beats = []
    sw = StatusWriter(
        w,
        lambda kind: [obj] if kind == "HeadroomConfig" else [],
        lambda: res,
        lambda: {},
        clock=clock,
        on_heartbeat=lambda: beats.append(clock.t),
    )  # type: ignore[arg-type]
    assert sw.flush() == 1 and "lastHeartbeatTime" in w.bodies[-1]["status"]
    clock.t += 30
    assert sw.flush() == 0  # nothing changed, and the heartbeat is fresh
    clock.t += 31
    assert sw.flush() == 1 and len(beats) == 2  # a minute on: rewritten, heartbeat renewed


def test_profiles_that_tie_on_a_node_both_say_so():
    """Same priority, same nodes: the name that sorts first wins; the loser's Conflict says
    it lost only by name, the winner's says whom it beat that way; validate warns before."""
    from headroom.api.resolve import resolve
    from headroom.api.validate import tie_warnings
    from headroom.engine.status import StatusWriter

    def prof(name):
        return {
            "apiVersion": "kube-headroom.dev/v1alpha1",
            "kind": "NodePoolProfile",
            "metadata": {"name": name, "generation": 1},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "batch"}}},
        }

    config = {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}
    res = resolve([config], [prof("alpha"), prof("zeta")])
    labels = {"n1": {"pool": "batch"}, "n2": {"pool": "batch"}}
    sw = StatusWriter(None, lambda kind: [], lambda: res, lambda: labels)  # type: ignore[arg-type]

    def conflict(name):
        return next(c for c in sw.profile_status(prof(name))["conditions"] if c["type"] == "Conflict")

    loser, winner = conflict("zeta"), conflict("alpha")
    assert loser["status"] == "True" and "'alpha' on 2 node(s) (the same priority" in loser["message"], loser
    assert winner["status"] == "False" and winner["reason"] == "WinsTie" and "'zeta' on 2 node(s)" in winner["message"]
    (warning,) = tie_warnings([("f.yaml", prof("zeta")), ("f.yaml", prof("alpha"))])
    assert "NodePoolProfile/alpha and NodePoolProfile/zeta have the same nodeSelector at priority 0" in warning
    assert tie_warnings([("f", prof("zeta")), ("f", prof("alpha"))], [{"pool": "batch"}, {"pool": "other"}])[0].count(
        "1 node(s)"
    )
