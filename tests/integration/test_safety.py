"""The safety contract (docs/safety.md) on the real API server, with faults injected by a
loopback proxy between `headroom run` and the server (tests/helpers/faultproxy.py)."""

from __future__ import annotations

import contextlib
import json
import time
import uuid

from headroom.cluster.client import MERGE_PATCH, Api, ApiError, pod_path
from headroom.cluster.live import read_cluster
from headroom.core.planner import plan_cluster
from headroom.core.records import pod_from_dict, qos_class
from helpers.cluster_helpers import (
    GROUP,
    cpu_limits,
    create_pod,
    events,
    node_events,
    profile,
    wait_annotation,
    wait_limits,
)
from helpers.factories import container
from helpers.faultproxy import Rule
from testbed.sim_kubelet import INFEASIBLE, SimulatedKubelet

RESIZE = r"/pods/[^/]+/resize$"
POD = r"/namespaces/[^/]+/pods/[^/]+$"


def invariants(api: Api, namespaces: list[str], untouched: dict[str, str]) -> list[str]:
    """Every violation of the contract visible on the server."""
    bad = []
    for ns in namespaces:
        for raw in api.get(f"/api/v1/namespaces/{ns}/pods")["items"]:
            key = f"{ns}/{raw['metadata']['name']}"
            rec = pod_from_dict(raw)
            for c in rec.containers:
                if c.cpu_limit is not None and c.cpu_limit < c.cpu_request:
                    bad.append(f"{key}/{c.name}: limit {c.cpu_limit}m below request {c.cpu_request}m")
            now = qos_class([(c.cpu_request or None, c.cpu_limit, c.mem_request, c.mem_limit) for c in rec.containers])
            if raw["status"].get("qosClass") and now != raw["status"]["qosClass"]:
                bad.append(f"{key}: QoS {raw['status']['qosClass']} became {now}")
            if key in untouched and cpu_limits(api, ns, raw["metadata"]["name"]) != [untouched[key]]:
                bad.append(f"{key}: an unmanaged pod was written")
    return bad


def converged(api: Api) -> list[str]:
    """Managed pods that are not at their target according to the planner on the live cluster."""
    snap = read_cluster(api)
    plan = plan_cluster(snap.nodes, snap.pods, snap.namespaces, snap.resolver(), pod_level_resize=False)
    return [pp.pod.key for pp in plan.all_pods() if pp.target is not None and pp.target.apply]


def wait_converged(api: Api, timeout: float) -> float:
    start = time.monotonic()
    while True:
        left = converged(api)
        if not left:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"not converged after {timeout}s: {left}"
        time.sleep(0.5)


def test_a_hostile_annotation_leaves_that_pod_alone_and_the_node_working(
    api, namespace, make_node, headroom_config, start_controller
):
    headroom_config()
    node = make_node(cpu="8")
    with SimulatedKubelet(api, node):
        hostile = {"kube-headroom.dev/max-cpu": "1e999999"}
        create_pod(api, namespace, node, "hostile", containers=[container(cpu="500m")], annotations=hostile)
        create_pod(api, namespace, node, "fine", containers=[container(cpu="500m")])
        c = start_controller()
        wait_limits(api, namespace, "fine", ["5"], timeout=15)
        skipped = []
        deadline = time.monotonic() + 10
        while not skipped and time.monotonic() < deadline:
            skipped = [
                e for e in events(api, namespace, "CPULimitAdjustSkipped") if e["regarding"]["name"] == "hostile"
            ]
            time.sleep(0.2)
        assert skipped and "max-cpu is unusable" in skipped[0]["note"] and "exponent" in skipped[0]["note"]
        assert cpu_limits(api, namespace, "hostile") == [None]
        assert not [r for r in c.logs() if r.get("msg") == "reconcile crashed; node will be retried"]


def test_faults_on_every_path_converge_to_the_fault_free_limits(
    api, namespace, make_node, headroom_config, start_controller, proxy
):
    fp, kubeconfig = proxy
    headroom_config(maxMultiplier=4, backoffPeriod="3s")
    nodes = [make_node(cpu="8"), make_node(cpu="8")]
    plain = f"plain-{uuid.uuid4().hex[:6]}"
    api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": plain}})
    rules = [
        Rule("PATCH", RESIZE, status=409, times=3),
        Rule("PATCH", RESIZE, status=429, retry_after=2, times=2),
        Rule("PATCH", RESIZE, status=500, times=2),
        Rule("PATCH", RESIZE, status=422, times=1),
        Rule("PATCH", RESIZE, drop=True, times=2),  # no answer at all
        Rule("PATCH", POD, status=503, times=3),  # the status annotation
        Rule("POST", r"/events$", status=500, times=2),
        Rule("GET", r"^/api/v1/pods$", watch=True, cut_after=3, times=2),
        Rule("GET", r"^/api/v1/nodes$", watch=True, gone=True, times=1),
        Rule("*", r".", delay=0.3, probability=0.05, times=40),  # latency spikes
    ]
    kubelets = [SimulatedKubelet(api, n) for n in nodes]
    try:
        for k in kubelets:
            k.start()
        for i in range(12):
            create_pod(api, namespace, nodes[i % 2], f"w{i}", containers=[container(cpu=f"{250 * (1 + i % 3)}m")])
        create_pod(api, plain, nodes[0], "other", containers=[container(cpu="250m")])
        for r in rules:
            fp.add(r)
        c = start_controller(kubeconfig=kubeconfig)
        ready_seen = []
        start = time.monotonic()
        while converged(api):
            ready_seen.append(c.http("/readyz")[0])
            assert time.monotonic() - start < 90, f"not converged: {converged(api)}"
            time.sleep(0.5)
        took = time.monotonic() - start
        assert invariants(api, [namespace, plain], {f"{plain}/other": None}) == []
        # Every fault fired, and each was handled as the contract says.
        fired = {(r.status, r.cut_after, r.gone, r.drop): r.fired for r in rules[:-1]}
        assert all(n > 0 for n in fired.values()), fired
        metrics = c.http("/metrics", c.metrics_port)[1]
        counted = {
            line.split('result="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith('headroom_resizes_total{dry_run="false"')
        }
        # Each injected fault is counted under its own result (real conflicts may add to them).
        assert counted.get("throttled") == 2 and counted.get("invalid") == 1, counted
        assert counted.get("conflict", 0) >= 3 and counted.get("error", 0) >= 2, counted
        assert all(code == 200 for code in ready_seen[1:]), "a throttled or failed write flipped readiness"
        resizes = [w for w in fp.writes if w[1] == "PATCH" and w[2].endswith("/resize")]
        extra = len(fp.writes) - 12 * 3  # one resize, one annotation and one event per pod without faults
        print(
            f"\nfault run: {len(fp.injected)} faults injected, converged in {took:.1f}s, "
            f"{len(fp.writes)} writes reached the server ({len(resizes)} resizes), {extra} beyond a fault-free run, "
            "0 invariant violations"
        )
        assert len(resizes) <= 12 + 3 + 2 + 2, "a conflict or a throttle made the controller spin"
    finally:
        for k in kubelets:
            k.stop()
        with contextlib.suppress(ApiError):
            api.delete(f"/api/v1/namespaces/{plain}")


def test_retry_after_is_honoured_and_the_backoff_expiry_brings_the_pod_back(
    api, namespace, make_node, headroom_config, start_controller, proxy
):
    fp, kubeconfig = proxy
    headroom_config(backoffPeriod="3s")
    node = make_node(cpu="8")
    with SimulatedKubelet(api, node):
        create_pod(api, namespace, node, "p", containers=[container(cpu="500m")])
        create_pod(api, namespace, node, "q", containers=[container(cpu="500m")])
        fp.add(Rule("PATCH", r"/pods/p/resize$", status=429, retry_after=2, times=1))
        fp.add(Rule("PATCH", r"/pods/q/resize$", status=422, times=1))
        start_controller(kubeconfig=kubeconfig)
        wait_limits(api, namespace, "p", ["4"], timeout=20)
        wait_limits(api, namespace, "q", ["4"], timeout=20)  # nothing else changes: only the expiry
    tries = {p: [t for t, m, path in fp.attempts if path.endswith(f"/pods/{p}/resize")] for p in "pq"}
    # One refused try, then one that went through: no spin, and not before it was allowed.
    # (p is resized again when q comes back: while q backs off, p's share is larger.)
    assert len(tries["q"]) == 2, tries
    assert tries["p"][1] - tries["p"][0] >= 2.0, "retried before the server's Retry-After"
    assert tries["q"][1] - tries["q"][0] >= 3.0, "retried before the backoff expired"


def test_a_pod_deleted_while_its_node_waits_for_its_budget_is_not_written(
    api, namespace, make_node, headroom_config, start_controller, proxy
):
    fp, kubeconfig = proxy
    headroom_config(rateLimits={"perNodePatchesPerSecond": 1})  # a pass of 8 resizes takes 8 s
    node = make_node(cpu="64")
    for i in range(8):
        create_pod(api, namespace, node, f"p{i}", containers=[container(cpu="100m")])
    start_controller(kubeconfig=kubeconfig)
    deadline = time.monotonic() + 20
    while not any(cpu_limits(api, namespace, f"p{i}") != [None] for i in range(8)):
        assert time.monotonic() < deadline, "no resize within 20 s"
        time.sleep(0.1)
    waiting = [f"p{i}" for i in range(8) if cpu_limits(api, namespace, f"p{i}") == [None]]
    assert len(waiting) >= 5, waiting  # the rest of the pass waits for the node's budget
    gone = waiting[:3]
    for name in gone:
        api.delete(pod_path(namespace, name), {"gracePeriodSeconds": 0})
    deleted_at = time.monotonic()
    for name in waiting[3:]:
        wait_limits(api, namespace, name, ["1"], timeout=30)  # 100m x maxMultiplier 10
    after = [
        w for w in fp.writes if w[0] >= deleted_at and any(w[2].split("/pods/")[-1].split("/")[0] == g for g in gone)
    ]
    assert after == [], f"writes to deleted pods: {after}"
    assert not [w for w in fp.writes if w[3] == 404], "a write met a pod that was gone"


def test_no_pod_write_while_the_profiles_watch_fails(
    api, namespace, make_node, headroom_config, start_controller, proxy
):
    fp, kubeconfig = proxy
    headroom_config()
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    node = make_node(cpu="8", labels={"pool": pool})
    profiles = f"{GROUP}/nodepoolprofiles"
    try:
        profile(api, pool, {"pool": pool})
        with SimulatedKubelet(api, node):
            create_pod(api, namespace, node, "a", containers=[container(cpu="500m")])
            c = start_controller(kubeconfig=kubeconfig)
            wait_limits(api, namespace, "a", ["5"], timeout=15)
            outage = 25.0
            fp.add(Rule("GET", r"/nodepoolprofiles$", status=503, until=time.monotonic() + outage))
            assert fp.cut(r"/nodepoolprofiles$") == 1
            c.wait_for_log("view incomplete: no pod is written", timeout=10)
            began = time.monotonic()
            profile(api, pool, {"pool": pool}, dryRun=True)
            create_pod(api, namespace, node, "b", containers=[container(cpu="500m")])
            time.sleep(max(0.0, outage - (time.monotonic() - began) - 1))
            during = [w for w in fp.writes if w[0] >= began and "/pods/" in w[2]]
            assert during == [], f"pod writes from a partial view: {during}"
            assert "headroom_writes_blocked 1.0" in c.http("/metrics", c.metrics_port)[1]
            c.wait_for_log("view complete again: writes resume", timeout=40)
            annotation = wait_annotation(api, namespace, "b", timeout=15)
            assert '"dryRun":true' in annotation and cpu_limits(api, namespace, "b") == [None]
            resizes = [w for w in fp.writes if w[0] >= began and w[2].endswith("/resize")]
            assert resizes == [], f"a dry-run pool was resized: {resizes}"
    finally:
        with contextlib.suppress(ApiError):
            api.delete(f"{profiles}/{pool}")


def test_every_write_stays_within_the_global_and_per_node_budgets(
    api, namespace, make_node, headroom_config, start_controller, proxy
):
    fp, kubeconfig = proxy
    qps, per_node = 100, 10
    headroom_config(rateLimits={"clientQPS": qps, "perNodePatchesPerSecond": per_node})
    nodes = [make_node(cpu="64") for _ in range(20)]
    pods = 35
    for n in nodes:
        for i in range(pods):
            create_pod(api, namespace, n, f"{n}-{i}", containers=[container(cpu="100m")])
    start_controller(kubeconfig=kubeconfig)
    took = wait_converged(api, timeout=120)
    deadline = time.monotonic() + 60  # the annotations and events follow the resizes
    while any(
        "kube-headroom.dev/status" not in (p["metadata"].get("annotations") or {})
        for p in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    ):
        assert time.monotonic() < deadline, "annotations still missing 60 s after convergence"
        time.sleep(0.5)
    # One CPULimitAdjusted event per node and wave, not one per pod (and within the
    # server's limits: a 35-pod note is cut to 1 KiB of UTF-8).
    deadline = time.monotonic() + 30
    while not all(node_events(api, n) for n in nodes):
        assert time.monotonic() < deadline, [n for n in nodes if not node_events(api, n)]
        time.sleep(0.5)
    node_event_count = sum(len(node_events(api, n)) for n in nodes)
    writes = sorted(fp.writes)
    assert len(writes) >= 2 * len(nodes) * pods, len(writes)

    def worst(times: list[float], window: float = 1.0) -> int:
        best, j = 0, 0
        for i, t in enumerate(times):
            while times[j] <= t - window:
                j += 1
            best = max(best, i - j + 1)
        return best

    overall = worst([w[0] for w in writes])
    sustained = worst([w[0] for w in writes], 5.0)
    by_node: dict[str, list[float]] = {}
    for t, _, path, _ in writes:
        if path.endswith("/resize"):  # the per-node budget is the kubelet's: it bounds resizes
            name = path.rsplit("/pods/", 1)[1].split("/")[0]
            by_node.setdefault(name.rsplit("-", 1)[0], []).append(t)
    node_worst = max(worst(ts) for ts in by_node.values())
    resizes = sum(len(ts) for ts in by_node.values())
    print(
        f"\nrate run: {resizes} resizes converged in {took:.1f}s ({resizes / qps:.1f}s at clientQPS); "
        f"{len(writes)} writes in all, at most {overall} in any 1 s window and {sustained} in any 5 s "
        f"(clientQPS {qps}), at most {node_worst} resizes per node in 1 s (perNodePatchesPerSecond {per_node}); "
        f"{node_event_count} CPULimitAdjusted events for {len(nodes)} nodes"
    )
    assert node_event_count <= 3 * len(nodes)
    # The limiter hands out tokens 1/clientQPS apart; the proxy sees them after thread
    # scheduling and the network, which can bunch a few: 5 % slack over 1 s, 2 writes over 5 s.
    assert overall <= qps * 1.05 + 1 and sustained <= 5 * qps + 2 and node_worst <= per_node + 1


def test_an_infeasible_resize_backs_off_once_per_refused_generation_and_comes_back_at_expiry(
    api, namespace, make_node, headroom_config, start_controller
):
    headroom_config(backoffPeriod="4s")
    node = make_node(cpu="8")

    def refused(pod: str) -> int:
        return len(
            [
                e
                for e in events(api, namespace, "CPULimitAdjustSkipped")
                if e["regarding"]["name"] == pod and "refused the resize" in e["note"]
            ]
        )

    def managed(c) -> float:
        for line in c.http("/metrics", c.metrics_port)[1].splitlines():
            if line.startswith('headroom_pods_managed{pool=""}'):
                return float(line.rsplit(" ", 1)[1])
        return -1.0

    kubelet = SimulatedKubelet(api, node, outcome=INFEASIBLE)
    with kubelet:
        for name in ("p", "q"):
            create_pod(api, namespace, node, name, containers=[container(cpu="500m")])
        c = start_controller()
        wait_limits(api, namespace, "p", ["4"], timeout=15)  # the spec is written; the kubelet refuses it
        deadline = time.monotonic() + 10
        while refused("p") < 1 or refused("q") < 1:
            assert time.monotonic() < deadline, "no backoff event"
            time.sleep(0.2)
        backed_off_at = time.monotonic()
        assert managed(c) == 0  # both BackingOff
        # ...and the pod's status annotation says so, with the kubelet's reason
        while (shown := json.loads(wait_annotation(api, namespace, "p"))).get("reason") != "BackingOff":
            assert time.monotonic() - backed_off_at < 4, shown
            time.sleep(0.1)
        assert shown["managed"] is False and "the kubelet refused the resize (Infeasible" in shown["note"], shown
        # A status or label update of the same generation is not a new refusal.
        api.patch(pod_path(namespace, "p"), {"metadata": {"labels": {"touched": "yes"}}}, MERGE_PATCH)
        time.sleep(2)
        assert refused("p") == 1

        # At expiry the node comes back by itself (nothing else happens on it meanwhile): the
        # pods are managed again, or one is written a new target. Backoffs that end within two
        # debounce periods end together, so two pods refused a pass apart come back as one;
        # a pod sized while its neighbour was backing off (the kubelet refuses every resize
        # here) gets a new target when they are planned together, and that is refused again.
        def generations() -> list[int]:
            return [api.get(pod_path(namespace, name))["metadata"]["generation"] for name in ("p", "q")]

        refused_generations = generations()
        while managed(c) != 2 and generations() == refused_generations:
            assert time.monotonic() - backed_off_at < 4 + 4, "the backoff's expiry did not bring the pods back"
            time.sleep(0.2)
        # Never more than one refusal, event and backoff per generation written.
        # (Counted before the generations are read: a refusal follows the write of its generation.)
        time.sleep(1)
        counts = [refused("p"), refused("q")]
        for count, generation in zip(counts, generations(), strict=True):
            assert 1 <= count <= generation - 1
        # A new resize (a third pod shrinks their share) is a new generation: refused, backed off again.
        before = refused("p")
        create_pod(api, namespace, node, "r", containers=[container(cpu="500m")])
        deadline = time.monotonic() + 15
        while refused("p") < before + 1:
            assert time.monotonic() < deadline, "a refusal of a new generation was not backed off"
            time.sleep(0.2)
