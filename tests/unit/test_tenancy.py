"""Tenants in the split: table tests of the arithmetic and property tests of its invariants
(pure: the policy and `core.tenancy` only, no cluster)."""

from dataclasses import replace
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.core.eligibility import computed_containers
from headroom.core.params import Settings
from headroom.core.policy import (
    BOUND_FLOOR,
    BOUND_PROPORTIONAL,
    BOUND_TENANT_SHARE,
    Managed,
    compute_node,
    pod_target,
)
from headroom.core.records import Pod, namespace_from_dict, pod_from_dict
from headroom.core.tenancy import Tenancy, pots, tenant_name
from helpers.factories import container, pod
from helpers.generated import run_counting, split_pod

NO_FLOOR = Settings(min_burst_floor=0, max_multiplier=Fraction(0))


def tenancy(share=1, default=1, **weights) -> Tenancy:
    return Tenancy(
        weights=tuple((t, Fraction(w)) for t, w in weights.items()),
        default_weight=Fraction(default),
        max_node_slack_share=Fraction(share),
    )


def P(name: str, cpu: str) -> Pod:
    return pod_from_dict(pod(name, containers=[container(cpu=cpu)]))


def run(alloc: int, tenants: dict[str, list[Pod]], s: Settings):
    pods = [p for ps in tenants.values() for p in ps]
    ms = [Managed(p, computed_containers(p, s), tenant=t) for t, ps in tenants.items() for p in ps]
    summary, targets = compute_node(alloc, pods, ms, s)
    return summary, {t.managed.pod.name: t for t in targets}


def test_a_tenant_booking_most_of_a_node_keeps_at_most_its_share_of_the_slack():
    # 16 cores, 4 booked: a with 3 cores of requests, b with 1; slack 12.
    tenants = {"a": [P("a1", "1"), P("a2", "2")], "b": [P("b1", "1")]}
    _, today = run(16000, tenants, NO_FLOOR)
    assert {k: t.target for k, t in today.items()} == {"a1": 4000, "a2": 8000, "b1": 4000}
    summary, t = run(16000, tenants, replace(NO_FLOOR, tenancy=tenancy(share=Fraction(1, 2))))
    assert summary.pots is not None
    assert (summary.pots["a"].pot, summary.pots["a"].capped) == (6000, True)
    assert (summary.pots["b"].pot, summary.pots["b"].capped) == (6000, False)  # what a's cap took off
    assert {k: v.target for k, v in t.items()} == {"a1": 3000, "a2": 6000, "b1": 7000}
    assert (t["a1"].bound, t["b1"].bound) == (BOUND_TENANT_SHARE, BOUND_PROPORTIONAL)


def test_a_tier_doubles_the_burst_per_requested_core_without_more_requests():
    tenants = {"bronze": [P("x", "1")], "gold": [P("y", "1")]}
    _, t = run(8000, tenants, replace(NO_FLOOR, tenancy=tenancy(gold=2)))
    # slack 6 cores: gold gets 2/3 of it for the same request.
    assert (t["x"].target, t["y"].target) == (3000, 5000)


def test_a_lone_tenant_under_a_cap_leaves_the_rest_unused():
    _, t = run(8000, {"a": [P("a1", "1"), P("a2", "1")]}, replace(NO_FLOOR, tenancy=tenancy(share=Fraction(1, 2))))
    assert {k: v.target for k, v in t.items()} == {"a1": 2500, "a2": 2500}  # 3 of 6 cores of slack


def test_the_floor_still_applies_inside_a_capped_tenant():
    s = replace(Settings(max_multiplier=Fraction(0)), tenancy=tenancy(share=Fraction(1, 4)))
    _, t = run(8000, {"a": [P("a1", "100m")], "b": [P("b1", "3")]}, s)
    # slack 4.9 cores: b is capped at 1225m; so is a, whose floor-free pot would be the rest
    # (every tenant capped: the other 2.45 cores stay unused).
    assert (t["b1"].target, t["b1"].bound) == (4220, BOUND_TENANT_SHARE)
    assert (t["a1"].target, t["a1"].bound) == (1320, BOUND_TENANT_SHARE)
    s = replace(s, min_burst_floor=2000)
    _, t = run(8000, {"a": [P("a1", "100m")], "b": [P("b1", "3")], "c": [P("c1", "10m")]}, s)
    assert t["c1"].bound == BOUND_FLOOR  # min(floor, S/N) lifts a tiny pod above its tenant's pot


def test_tenant_name_is_the_label_value_else_a_name_no_label_value_can_spell():
    labelled = namespace_from_dict({"metadata": {"name": "a-dev", "labels": {"t": "acme"}}})
    plain = namespace_from_dict({"metadata": {"name": "loner"}})
    empty = namespace_from_dict({"metadata": {"name": "blank", "labels": {"t": ""}}})
    assert tenant_name("a-dev", labelled, "t") == "acme"
    assert tenant_name("a-dev", labelled, None) == "a-dev"  # no tenant label: each namespace by its name
    # With a tenant label, an unlabelled namespace is a tenant no label value can spell: one
    # named "acme" never joins tenant acme's pot, cap or admission share.
    assert tenant_name("loner", plain, "t") == "namespace/loner"
    assert tenant_name("blank", empty, "t") == "namespace/blank"
    assert tenant_name("gone", None, "t") == "namespace/gone"
    assert tenant_name("acme", plain, "t") != tenant_name("a-dev", labelled, "t")


def test_neutral_tenancy_is_today():
    assert Tenancy().neutral
    assert tenancy(default=3, a=3).neutral
    assert not tenancy(a=2).neutral
    assert not tenancy(share=Fraction(99, 100)).neutral


# --- property tests ---------------------------------------------------------------------

requests = st.integers(min_value=1, max_value=4000)
NAMES = ["a", "b", "c", "d"]


@st.composite
def tenant_node(draw, managed_min=1):
    alloc = draw(st.integers(min_value=100, max_value=64000))
    managed = []
    for i in range(draw(st.integers(managed_min, 8))):
        reqs = draw(st.lists(requests, min_size=1, max_size=2))
        pinned = draw(st.booleans())
        ctrs = [
            container(f"c{j}", cpu=f"{r}m", mem="1Gi", mem_limit="1Gi" if pinned else "2Gi") for j, r in enumerate(reqs)
        ]
        managed.append((draw(st.sampled_from(NAMES)), pod_from_dict(pod(f"m{i}", containers=ctrs))))
    unmanaged = [
        pod_from_dict(pod(f"u{i}", containers=[container(cpu=f"{draw(requests)}m")]))
        for i in range(draw(st.integers(0, 3)))
    ]
    base = Settings(
        min_burst_floor=draw(st.sampled_from([0, 100, 1000])),
        max_multiplier=draw(st.sampled_from([Fraction(0), Fraction(3, 2), Fraction(10)])),
    )
    t = Tenancy(
        weights=tuple(
            (n, Fraction(draw(st.integers(1, 400)), 4)) for n in NAMES if draw(st.booleans())
        ),  # weights 0.25 .. 100
        max_node_slack_share=draw(st.sampled_from([Fraction(1), Fraction(1, 2), Fraction(1, 3), Fraction(9, 10)])),
    )
    return alloc, managed, unmanaged, base, t


def _compute(alloc, managed, unmanaged, s):
    ms = [Managed(p, computed_containers(p, s), tenant=t) for t, p in managed]
    return compute_node(alloc, [p for _, p in managed] + unmanaged, ms, s)


@settings(max_examples=1500, deadline=None)
@given(tenant_node(), st.integers(1, 400))
def test_equal_weights_and_no_cap_give_exactly_todays_targets(state, w):
    alloc, managed, unmanaged, base, _ = state
    today = _compute(alloc, managed, unmanaged, base)
    # Every tenant present has weight w/4; the one listed apart is on no node: the general
    # path runs (not neutral), and must land on today's targets pod by pod.
    equal = Tenancy(weights=(("absent", Fraction(w + 1, 4)),), default_weight=Fraction(w, 4))
    assert not equal.neutral
    summary, targets = _compute(alloc, managed, unmanaged, replace(base, tenancy=equal))
    assert summary.pots is not None or summary.slack <= 0
    assert [t.target for t in targets] == [t.target for t in today[1]]
    assert [t.containers for t in targets] == [t.containers for t in today[1]]


@settings(max_examples=500, deadline=None)
@given(tenant_node())
def test_a_tenants_bursts_before_the_floor_stay_within_its_cap(state):
    alloc, managed, unmanaged, base, t = state
    s = replace(base, tenancy=t)
    summary, targets = _compute(alloc, managed, unmanaged, s)
    if summary.pots is None:
        return
    cap = t.max_node_slack_share * summary.slack
    by_tenant: dict[str, int] = {}
    for target in targets:
        burst, _ = summary.burst(target.managed)
        by_tenant[target.managed.tenant] = by_tenant.get(target.managed.tenant, 0) + burst
        assert target.target >= target.request
    for tenant, total in by_tenant.items():
        assert total <= cap, (tenant, total, cap)
    assert sum(p.pot for p in summary.pots.values()) <= summary.slack


@settings(max_examples=500, deadline=None)
@given(tenant_node(), st.sampled_from(NAMES), st.integers(1, 8))
def test_raising_a_tenants_weight_never_lowers_its_targets_nor_raises_anothers(state, who, factor):
    alloc, managed, unmanaged, base, t = state
    weights = dict(t.weights)
    heavier = {**weights, who: min(weights.get(who, t.default_weight) * factor, Fraction(100))}
    _, before = _compute(alloc, managed, unmanaged, replace(base, tenancy=t))
    _, after = _compute(alloc, managed, unmanaged, replace(base, tenancy=replace(t, weights=tuple(heavier.items()))))
    for b, a in zip(before, after, strict=True):
        if b.managed.tenant == who:
            assert a.target >= b.target
        else:
            assert a.target <= b.target


def test_splitting_a_pod_inside_a_tenant_changes_no_other_tenant():
    assert run_counting(_split_inside_a_tenant) >= 300


@settings(max_examples=500, deadline=None)
@given(tenant_node(managed_min=2), st.integers(min_value=2, max_value=5))
def _split_inside_a_tenant(reached, state, k):
    alloc, managed, unmanaged, base, t = state
    s = replace(base, min_burst_floor=0, tenancy=t)
    (tenant, victim), others = managed[0], managed[1:]
    parts = split_pod(victim, k)
    if parts is None:
        return
    reached.append(k)
    split = [(tenant, p) for p in parts]
    _, before = _compute(alloc, managed, unmanaged, s)
    _, after = _compute(alloc, [*others, *split], unmanaged, s)
    b = {x.managed.pod.name: x for x in before}
    a = {x.managed.pod.name: x.target for x in after}
    for other_tenant, p in others:
        if other_tenant != tenant:
            assert abs(a[p.name] - b[p.name].target) <= 10


@settings(max_examples=400, deadline=None)
@given(tenant_node())
def test_fused_compute_node_equals_the_reference_with_tenants(state):
    alloc, managed, unmanaged, base, t = state
    s = replace(base, tenancy=t)
    ms = [Managed(p, computed_containers(p, s), tenant=n) for n, p in managed]
    summary, fused = compute_node(alloc, [p for _, p in managed] + unmanaged, ms, s)
    assert fused == [pod_target(summary, m, s) for m in ms]


@settings(max_examples=300, deadline=None)
@given(tenant_node())
def test_deterministic_whatever_the_order(state):
    alloc, managed, unmanaged, base, t = state
    s = replace(base, tenancy=t)
    first = _compute(alloc, managed, unmanaged, s)
    second = _compute(alloc, list(reversed(managed)), list(reversed(unmanaged)), s)
    assert first[0] == second[0]
    assert {x.managed.pod.name: x for x in first[1]} == {x.managed.pod.name: x for x in second[1]}


@settings(max_examples=800, deadline=None)
@given(
    st.integers(1, 100000),
    st.dictionaries(st.sampled_from(NAMES), st.integers(0, 10000), min_size=1),
    st.dictionaries(st.sampled_from(NAMES), st.integers(1, 400)),
    st.integers(1, 100),
)
def test_pots_water_fill(slack, requests_by_tenant, weights, share_pct):
    t = Tenancy(
        weights=tuple((n, Fraction(w, 4)) for n, w in weights.items()),
        max_node_slack_share=Fraction(share_pct, 100),
    )
    got = pots(slack, requests_by_tenant, t)
    cap = t.max_node_slack_share * slack
    assert set(got) == set(requests_by_tenant)
    assert sum(p.pot for p in got.values()) <= slack
    assert all(p.pot <= cap for p in got.values())
    uncapped = [p for p in got.values() if not p.capped and p.requests > 0]
    # the uncapped share what is left by weight × requests, exactly
    for x in uncapped:
        for y in uncapped:
            assert x.pot * y.weight * y.requests == y.pot * x.weight * x.requests
    # nothing is left unused while a tenant with requests is below the cap
    if uncapped:
        assert sum(p.pot for p in got.values()) == slack


# --- what plan and explain say ------------------------------------------------------------


def _tenant_plan():
    from headroom.core.planner import ClusterPlan, plan_node
    from headroom.core.records import node_from_dict
    from helpers.factories import node

    managed = {"kube-headroom.dev/mode": "managed"}
    namespaces = {
        "a-dev": namespace_from_dict({"metadata": {"name": "a-dev", "labels": {**managed, "t": "acme"}}}),
        "a-prod": namespace_from_dict({"metadata": {"name": "a-prod", "labels": {**managed, "t": "acme"}}}),
        "solo": namespace_from_dict({"metadata": {"name": "solo", "labels": managed}}),
    }
    pods = [
        pod_from_dict(pod("w1", namespace="a-dev", containers=[container(cpu="1")])),
        pod_from_dict(pod("w2", namespace="a-prod", containers=[container(cpu="2")])),
        pod_from_dict(pod("s1", namespace="solo", containers=[container(cpu="1")])),
    ]
    s = replace(
        NO_FLOOR,
        tenancy=Tenancy(label="t", weights=(("namespace/solo", Fraction(2)),), max_node_slack_share=Fraction(1, 2)),
    )
    n = plan_node(node_from_dict(node(name="n1", cpu="16")), pods, namespaces, s, pod_level_resize=False)
    return ClusterPlan([n], [])


def test_explain_and_plan_name_the_tenant_its_weight_and_its_pot():
    from headroom.commands import output

    plan = _tenant_plan()
    # slack 12: acme (3 cores, weight 1) and solo (1 core, weight 2) share it 3:2, so acme
    # would get 7.2 cores; capped at 6, solo gets the other 6.
    text = output.explain(plan, "a-dev/w1")
    assert "tenant 'acme': weight 1, its managed requests here M_t = 3, its pot P = 6 (capped" in text, text
    assert "other tenants on the node: 'namespace/solo' w 2 M_t 1 P 6" in text, text
    assert "burst = max(P*r/M_t = 2" in text and "decided by: maxNodeSlackShare" in text, text
    rows = {p["name"]: p for p in output.plan_json(plan)["pods"]}
    assert (rows["w2"]["tenant"], rows["w2"]["tenantPotMilli"], rows["w2"]["tenantCapped"]) == ("acme", 6000, True)
    assert (rows["s1"]["tenant"], rows["s1"]["tenantWeight"], rows["s1"]["targetLimitMilli"]) == (
        "namespace/solo",
        2.0,
        7000,
    )
    table = output.plan_table(plan)
    assert "TENANT" in table.splitlines()[3] and " acme" in table, table
    html = output.plan_html(plan)
    assert '"tenantPotMilli":6000' in html.replace(" ", "") and "tenants ?" in html
