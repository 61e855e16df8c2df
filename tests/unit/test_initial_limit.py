"""One arithmetic for a limit: the webhook's patch is the policy's initial target, and the
initial target is what the controller's own split gives for the same total.

Pure logic over generated pods (hypothesis); no cluster. The webhook's patch is applied to
the pod as the API server applies a JSONPatch of `add` operations, and the limits read
back from the patched pod."""

from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from headroom.api.resolve import resolve
from headroom.core import keys
from headroom.core.eligibility import computed_containers
from headroom.core.neighbours import EMPTY
from headroom.core.params import Resolver
from headroom.core.planner import user_cap
from headroom.core.policy import Managed, initial_target, pod_target, summarize
from headroom.core.quantity import cpu_milli
from headroom.core.records import BURSTABLE, namespace_from_dict, node_from_dict, pod_from_dict, qos_class
from headroom.webhook import mutation
from helpers.factories import container, namespace, node, pod

MANAGED = namespace_from_dict(namespace("team"))


def _apply(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """JSONPatch `add` operations, as the API server applies them."""
    out = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] == "add", op
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = out
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        target[parts[-1]] = op["value"]
    return out


def _resolver(spec: dict[str, Any]) -> Resolver:
    """The configuration as the processes resolve it from the cluster's objects."""
    config = {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}
    resolution = resolve([{**config, "spec": spec}], [])
    assert resolution.usable, resolution.problems
    return resolution.resolver


milli = st.integers(min_value=1, max_value=8000)


@st.composite
def new_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A pod being created: app containers and sidecars, some with CPU limits already,
    memory pinned or not, sometimes pod-level resources, sometimes a max-cpu annotation."""
    n = draw(st.integers(min_value=1, max_value=4))
    pinned = draw(st.booleans())
    made = []
    for i in range(n):
        req = draw(milli)
        has_limit = draw(st.integers(0, 3)) == 0
        limit = f"{req + draw(st.integers(0, 2000))}m" if has_limit else None
        mem = "128Mi"
        made.append(
            container(
                f"c{i}",
                cpu=f"{req}m",
                limit=limit,
                mem=mem,
                mem_limit=mem if pinned else draw(st.sampled_from(["256Mi", None])),
                sidecar=draw(st.integers(0, 4)) == 0,
            )
        )
    apps = [c for c in made if "restartPolicy" not in c] or [made[0]]
    sidecars = [c for c in made if "restartPolicy" in c and c is not made[0]]
    for c in apps:
        c.pop("restartPolicy", None)
    annotations = {}
    if draw(st.booleans()):
        annotations[keys.MAX_CPU_KEY] = f"{draw(st.integers(1, 20000))}m"
    pod_resources = None
    if draw(st.integers(0, 4)) == 0:
        cpu = draw(milli)
        pod_resources = {"requests": {"cpu": f"{cpu}m", "memory": "256Mi"}}
        if draw(st.booleans()):
            pod_resources["limits"] = {"memory": "256Mi"}
    raw = pod(node=None, containers=apps, init=sidecars or None, annotations=annotations, pod_resources=pod_resources)
    raw.pop("status")
    return raw


def _limits_of(raw: dict[str, Any]) -> tuple[dict[str, int | None], int | None]:
    spec = raw["spec"]
    out = {}
    for c in [*spec["containers"], *(spec.get("initContainers") or [])]:
        cpu = ((c.get("resources") or {}).get("limits") or {}).get("cpu")
        out[c["name"]] = None if cpu is None else cpu_milli(cpu)
    pod_cpu = ((spec.get("resources") or {}).get("limits") or {}).get("cpu")
    return out, None if pod_cpu is None else cpu_milli(pod_cpu)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=new_pods(),
    initial=st.sampled_from([1, 1.25, 1.5, 2, 3, 7.5]),
    max_mult=st.sampled_from([0, 1.5, 2, 4]),
    allocatable=st.integers(min_value=100, max_value=64000),
    excluded=st.sampled_from([(), ("c1",)]),
)
def test_the_webhooks_patch_is_the_policys_initial_target(raw, initial, max_mult, allocatable, excluded):
    res = _resolver(
        {
            "webhook": {"initialMultiplier": initial},
            "maxMultiplier": max_mult,
            "exclusions": {"containers": list(excluded)},
        }
    )
    nodes = {"n1": node_from_dict(node("n1", cpu=f"{allocatable}m"))}
    ops = mutation.patch_for(raw, MANAGED, res, EMPTY, nodes, lambda n: True)
    limits = [o for o in ops if not o["path"].startswith("/metadata/annotations")]
    before, before_pod = _limits_of(raw)
    after, after_pod = _limits_of(_apply(raw, ops))

    record = pod_from_dict({**raw, "spec": {**raw["spec"], "nodeName": "n1"}})
    settings_ = res.settings_for({})
    cap, problem = user_cap(record)
    if problem is not None:  # an unusable max-cpu: the controller leaves the pod alone, so does the webhook
        assert not limits and after == before and after_pod == before_pod
        return
    if record.pod_level is not None:
        expected = initial_target(Managed(record, (), cap), allocatable, settings_)
        assert after_pod == expected.target
        assert after == before  # containers keep what they had
        event("pod-level limit set")
        return
    unlimited = tuple(c for c in computed_containers(record, settings_) if c.cpu_limit is None)
    expected = initial_target(Managed(record, unlimited, cap), allocatable, settings_)
    want = dict(before)
    want.update({c.name: c.target for c in expected.containers})
    assert after == want
    if not unlimited:
        return  # every container had its limit already: nothing to give, nothing given
    # What a user would notice: never below a request, and the QoS class unchanged.
    for c in record.containers:
        if after.get(c.name) is not None:
            assert after[c.name] >= c.cpu_request
    written = [(c.cpu_request or None, after.get(c.name), c.mem_request, c.mem_limit) for c in record.containers]
    as_sent = [(c.cpu_request or None, c.cpu_limit, c.mem_request, c.mem_limit) for c in record.containers]
    assert qos_class(written) == qos_class(as_sent) == BURSTABLE
    event("container limits set")


@settings(max_examples=2000, deadline=None)
@given(
    requests=st.lists(milli, min_size=1, max_size=4),
    mult=st.sampled_from([Fraction(1), Fraction(5, 4), Fraction(3, 2), Fraction(2), Fraction(15, 2)]),
    pinned=st.booleans(),
)
def test_the_initial_target_is_the_controllers_target_where_only_the_multiplier_binds(requests, mult, pinned):
    """A pod alone on a node with room past request × multiplier: the controller's target
    under maxMultiplier = m is the initial target of multiplier m (one split, one quantum,
    one QoS guard)."""
    cs = [
        container(f"c{i}", cpu=f"{r}m", mem="64Mi", mem_limit="64Mi" if pinned else None)
        for i, r in enumerate(requests)
    ]
    settings_ = _resolver(
        {"maxMultiplier": float(mult), "minBurstFloor": "0", "webhook": {"initialMultiplier": float(mult)}}
    ).settings_for({})
    record = pod_from_dict(pod(containers=cs))
    m = Managed(record, computed_containers(record, settings_))
    r = m.request
    allocatable = r * 20 + 1000  # slack past r × 7.5: the multiplier binds, not the node
    by_controller = pod_target(summarize(allocatable, r, [m]), m, settings_)
    at_admission = initial_target(m, allocatable, settings_)
    assert [(c.name, c.target) for c in at_admission.containers] == [
        (c.name, c.target) for c in by_controller.containers
    ]
    assert at_admission.target == by_controller.target
