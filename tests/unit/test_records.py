"""Slim records from raw JSON: booking rules, QoS, pod-level resources, errors."""

import json

import pytest

from headroom.core.records import (
    APP,
    BEST_EFFORT,
    BURSTABLE,
    GUARANTEED,
    INIT,
    SIDECAR,
    RecordError,
    node_from_dict,
    pod_from_dict,
)
from helpers.factories import container, node, pod


def test_booking_is_the_sum_of_app_containers():
    p = pod_from_dict(pod(containers=[container("a", "500m"), container("b", "1")]))
    assert p.booked_cpu == 1500
    assert [c.kind for c in p.containers] == [APP, APP]


def test_an_init_container_larger_than_the_app_books_its_own_request():
    p = pod_from_dict(pod(containers=[container("a", "500m")], init=[container("migrate", "2")]))
    assert p.booked_cpu == 2000
    assert p.containers[-1].kind == INIT


def test_sidecars_add_to_apps_and_to_later_init_containers():
    raw = pod(
        containers=[container("a", "1")],
        init=[
            container("log", "300m", sidecar=True),
            container("migrate", "1500m"),
            container("mesh", "200m", sidecar=True),
        ],
    )
    p = pod_from_dict(raw)
    # app 1000 + sidecars 500 = 1500; migrate 1500 + sidecars declared before it (300) = 1800
    assert p.booked_cpu == 1800
    assert {c.name: c.kind for c in p.containers} == {"a": APP, "log": SIDECAR, "migrate": INIT, "mesh": SIDECAR}


def test_overhead_is_added():
    assert pod_from_dict(pod(containers=[container("a", "1")], overhead="250m")).booked_cpu == 1250


def test_an_in_flight_resize_books_the_largest_of_spec_allocated_and_actual():
    raw = pod(
        containers=[container("a", "500m")],
        status={
            "containerStatuses": [
                {"name": "a", "allocatedResources": {"cpu": "800m"}, "resources": {"requests": {"cpu": "700m"}}}
            ]
        },
    )
    assert pod_from_dict(raw).booked_cpu == 800
    raw["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] = "900m"
    assert pod_from_dict(raw).booked_cpu == 900


def test_pod_level_request_replaces_the_container_sum():
    raw = pod(
        containers=[container("a", "100m"), container("b", None, mem=None, mem_limit=None)],
        pod_resources={"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
        overhead="100m",
    )
    p = pod_from_dict(raw)
    assert p.pod_level is not None and p.pod_level.cpu_request == 1000 and p.pod_level.cpu_limit == 2000
    assert p.booked_cpu == 1100
    assert p.qos == BURSTABLE


@pytest.mark.parametrize(
    "containers,qos",
    [
        ([container("a", "1", "1", "1Gi", "1Gi")], GUARANTEED),
        ([container("a", None, "1", None, "1Gi")], GUARANTEED),  # requests default to limits
        ([container("a", None, None, None, None)], BEST_EFFORT),
        ([container("a", "1", "2")], BURSTABLE),
        ([container("a", "1", "1", "1Gi", "1Gi"), container("b", "1", None, "1Gi", "1Gi")], BURSTABLE),
    ],
)
def test_qos_class_follows_kubernetes(containers, qos):
    assert pod_from_dict(pod(containers=containers)).qos == qos


def test_qos_class_reported_by_the_server_wins():
    raw = pod(containers=[container("a", "1", "2")], status={"qosClass": "Burstable"})
    assert pod_from_dict(raw).qos == BURSTABLE


def test_terminal_deleting_mirror_owner_and_mode_are_read():
    raw = pod(
        phase="Succeeded",
        deleting=True,
        owner_kind="Job",
        labels={"kube-headroom.dev/mode": "unmanaged"},
        annotations={"kubernetes.io/config.mirror": "x", "kube-headroom.dev/max-cpu": "2"},
    )
    p = pod_from_dict(raw)
    assert (p.terminal, p.deleting, p.mirror, p.owner_kind, p.mode, p.max_cpu) == (
        True,
        True,
        True,
        "Job",
        "unmanaged",
        "2",
    )


def test_infeasible_resize_is_noticed():
    raw = pod(status={"conditions": [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]})
    assert pod_from_dict(raw).resize_infeasible


def test_deferred_and_unobserved_resizes_are_in_flight():
    deferred = pod(status={"conditions": [{"type": "PodResizePending", "status": "True", "reason": "Deferred"}]})
    rec = pod_from_dict(deferred)
    assert (rec.resize_deferred, rec.resize_pending, rec.resize_infeasible) == (True, True, False)
    # 1.35+ kubelets report the generation they acted on: behind the pod's own, a resize is in flight
    behind = pod(status={"observedGeneration": 2})
    behind["metadata"]["generation"] = 3
    assert pod_from_dict(behind).resize_pending and not pod_from_dict(behind).resize_deferred
    behind["status"]["observedGeneration"] = 3
    assert not pod_from_dict(behind).resize_pending
    behind["status"]["observedGeneration"] = True  # not a generation: ignored
    assert not pod_from_dict(behind).resize_pending


def test_bad_quantity_names_object_and_field():
    raw = pod(name="web", containers=[container("a", "lots")])
    with pytest.raises(
        RecordError, match=r"Pod/team/web: spec\.containers\[0\]\.resources\.requests\.cpu: 'lots' is not a quantity"
    ):
        pod_from_dict(raw)


def test_node_record():
    n = node_from_dict(node("n1", "15500m", labels={"pool": "a"}, features=["X"]))
    assert (n.name, n.allocatable_cpu, n.ready, n.windows, n.declared_features) == ("n1", 15500, True, False, ("X",))
    assert node_from_dict(node(os="windows")).windows


def test_records_from_json_and_from_dicts_agree():
    raw = pod(containers=[container("a", "1", "2")], init=[container("s", "100m", sidecar=True)])
    assert pod_from_dict(json.loads(json.dumps(raw))) == pod_from_dict(raw)


def test_same_inputs_sees_every_field_but_version_and_our_annotation():
    import dataclasses

    base = pod_from_dict(pod(containers=[container("a", "1", "2")]))
    ignored = {"resource_version", "status_annotation", "original_limits", "resized_by_headroom", "resize_refusal"}
    changes = {
        "labels": {"x": "y"},
        "containers": (),
        "pod_level": object(),
        "deleting": True,
        "mirror": True,
        "resize_infeasible": True,
    }
    for f in dataclasses.fields(base):
        if f.name == "phase":  # only terminal or not is an input: the kubelet starting a pod is none
            assert base.same_inputs(dataclasses.replace(base, phase="Pending"))
            assert not base.same_inputs(dataclasses.replace(base, phase="Succeeded"))
            assert not base.same_decision(dataclasses.replace(base, phase="Failed"))
            continue
        other = dataclasses.replace(base, **{f.name: changes.get(f.name, "changed")})
        assert base.same_inputs(other) is (f.name in ignored), f.name
        # a decision stands across what only status counts: the kubelet's answer to a write
        assert base.same_decision(other) is (
            f.name in ignored | {"resize_pending", "resize_deferred", "unapplied", "applied"}
        ), f.name


def test_a_node_being_resized_counts_the_capacity_it_is_asked_to_shrink_to():
    base = {
        "metadata": {"name": "n"},
        "status": {"capacity": {"cpu": "16"}, "allocatable": {"cpu": "15"}},
    }
    assert node_from_dict(base).allocatable_cpu == 15000 and not node_from_dict(base).resizing
    asked = {**base, "spec": {"configuredCapacity": {"cpu": "8"}}}
    n = node_from_dict(asked)
    assert n.resizing and n.allocatable_cpu == 7000  # 8 less the 1 core reserved
    done = {**base, "spec": {"configuredCapacity": {"cpu": "16"}}}
    assert not node_from_dict(done).resizing
    cond = {"type": "CapacityConfigured", "status": "True", "reason": "InProgress"}
    in_progress = {**base, "status": {**base["status"], "conditions": [cond]}}
    assert node_from_dict(in_progress).resizing


def _kubelet_says(limit: str | None, generation: int = 2, observed: int = 2, conditions=None, running=True):
    """A pod whose spec CPU limit is 100m, with the kubelet's status as given (the shape the
    real kubelet wrote when a resize reached it while it restarted: observedGeneration
    caught up, no resize condition, the old limit still applied)."""
    applied = {"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}
    if limit is not None:
        applied["limits"]["cpu"] = limit
    raw = pod(
        containers=[container("app", cpu="100m", limit="100m", mem="16Mi", mem_limit="64Mi")],
        status={
            "observedGeneration": observed,
            "conditions": conditions or [],
            "containerStatuses": [
                {"name": "app", "state": {"running": {}} if running else {"waiting": {}}, "resources": applied}
            ],
        },
    )
    raw["metadata"]["generation"] = generation
    return pod_from_dict(raw)


def test_a_resize_the_kubelet_observed_but_never_applied_is_seen_and_counted_pending():
    lost = _kubelet_says("260m")
    assert lost.unapplied == (("app", 260),) and lost.resize_pending
    assert _kubelet_says(None).unapplied == (("app", 0),)  # applied without a CPU limit at all
    done = _kubelet_says("100m")
    assert done.unapplied is None and not done.resize_pending
    # a resize in flight is pending, not lost: not yet observed, or a condition says so
    assert _kubelet_says("260m", generation=3, observed=2).unapplied is None
    in_progress = [{"type": "PodResizeInProgress", "status": "True"}]
    assert _kubelet_says("260m", conditions=in_progress).unapplied is None
    assert _kubelet_says("260m", running=False).unapplied is None  # nothing applied to a container not running


def test_what_the_kubelet_applied_is_kept_whenever_it_differs_from_the_spec_in_flight_or_not():
    """`applied` is what plan and the resize-lag metric show: set whenever the kubelet
    reports another CPU limit applied to a running container, resize in flight or not."""
    assert _kubelet_says("260m").applied == (("app", 260),)
    assert _kubelet_says("260m", generation=3, observed=2).applied == (("app", 260),)
    deferred = [{"type": "PodResizePending", "status": "True", "reason": "Deferred"}]
    p = _kubelet_says("260m", conditions=deferred)
    assert p.applied == (("app", 260),) and p.resize_deferred and p.unapplied is None
    assert _kubelet_says("100m").applied is None
    assert _kubelet_says("260m", running=False).applied is None


def test_a_refused_resize_keeps_what_the_kubelet_said_and_its_cause():
    from headroom.core.records import CFS_BURST, ERROR_CAUSE, INFEASIBLE_CAUSE, refusal_cause, refusal_text

    def refused(kind: str, reason: str, message: str | None):
        raw = pod(containers=[container("a", "1", "2")])
        cond = {"type": kind, "status": "True", "reason": reason}
        if message is not None:
            cond["message"] = message
        raw["status"]["conditions"] = [cond]
        return pod_from_dict(raw)

    # What the v1.37 kubelet reports when the kernel refuses a quota below the burst (v2 node).
    burst = refused(
        "PodResizeInProgress",
        "Error",
        "failed to update container: ... write /sys/fs/cgroup/kubepods/.../cpu.max: invalid argument",
    )
    assert burst.resize_infeasible and refusal_cause(burst.resize_refusal) == CFS_BURST
    assert "CFS burst" in refusal_text(burst.resize_refusal) and "cpu.max: invalid argument" in refusal_text(
        burst.resize_refusal
    )
    v1 = refused("PodResizeInProgress", "Error", "write cpu.cfs_quota_us: invalid argument")
    assert refusal_cause(v1.resize_refusal) == CFS_BURST
    full = refused("PodResizePending", "Infeasible", "Node didn't have enough capacity: cpu, requested: 9000")
    assert refusal_cause(full.resize_refusal) == INFEASIBLE_CAUSE
    assert refusal_cause(refused("PodResizeInProgress", "Error", None).resize_refusal) == ERROR_CAUSE
    long = refused("PodResizeInProgress", "Error", "x" * 5000 + " write .../cpu.max: invalid argument").resize_refusal
    assert long is not None and len(long) < 320 and refusal_cause(long) == CFS_BURST  # bounded, its end kept
