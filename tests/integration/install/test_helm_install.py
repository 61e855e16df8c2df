"""The chart installed as a user installs it, on the install cluster (tests/helpers/install_helpers.py):
the controller image built here (`make image`) in the real node's containerd, `helm install`
and `kubectl` as typed, the controller in pods, the webhook called by the API server
through its Service; then `headroom doctor` on it, a killed leader, an upgrade, an
uninstall, a reinstall and the production values.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headroom.cluster.client import Api, pod_path
from headroom.core.quantity import cpu_milli
from headroom.webhook.certs import issue
from helpers.chart import CHART, HELM
from helpers.cluster_helpers import K8S_VERSION, install_prometheus_operator_crds
from helpers.install_helpers import KUBECTL, LEASE, NS, Cluster, headroom, installed_cluster, kubectl_run, limit, wait
from helpers.webhook_client import admission_review, pod_to_create, post_review


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with installed_cluster(tmp_path_factory.mktemp("install")) as c:
        yield c


def test_helm_install_runs_the_controller_in_pods_and_the_webhook_behind_its_service(cluster: Cluster) -> None:
    began = time.monotonic()
    cluster.run(
        HELM,
        "install", "headroom", str(CHART), "--namespace", NS, "--create-namespace",
        "--set", "image.repository=headroom.local/kube-headroom", "--set", "image.pullPolicy=Never",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    installed = time.monotonic() - began
    # Both replicas Ready (the readiness probe answers once the caches are synced), one leader;
    # the webhook's two replicas apart from them.
    pods = wait("two Ready replicas", lambda: len(cluster.ready()) == 2 and cluster.ready())
    assert len(cluster.webhook_pods()) == 2 and not set(pods) & {p["metadata"]["name"] for p in cluster.webhook_pods()}
    leader = wait("a leader", cluster.leader)
    assert leader in pods
    # The leader issued the webhook certificate: the Secret exists and the caBundle trusts its CA.
    secret = wait("the webhook Secret", lambda: cluster.secret("headroom-webhook-tls"))
    mwc = cluster.api.get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/headroom")
    bundle = base64.b64decode(mwc["webhooks"][0]["clientConfig"].get("caBundle") or "")
    assert base64.b64decode(secret["data"]["ca.crt"]).strip() in bundle
    # The user's policy, as typed: a HeadroomConfig out of dry-run, a namespace opted in.
    config = Path(cluster.cp.workdir) / "headroomconfig.yaml"
    config.write_text(
        "apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: {name: cluster}\n"
        "spec: {dryRun: false, debouncePeriod: 500ms}\n"
    )
    cluster.run(KUBECTL, "create", "namespace", "team")
    cluster.run(KUBECTL, "label", "namespace", "team", "kube-headroom.dev/mode=managed")
    cluster.run(KUBECTL, "apply", "--server-side", "-f", str(config))
    cluster.run(KUBECTL, "wait", "--for=condition=Ready", "headroomconfig/cluster", "--timeout=60s")
    wait("both replicas serving the webhook", cluster.serving)
    # A pod the scheduler places: its limit at admission comes from the webhook, called by
    # the API server through the Service; then the controller in its pod gives the fair one.
    created = kubectl_run(cluster, "app", "-o", "jsonpath={.spec.containers[0].resources.limits.cpu}")
    assert cpu_milli(created) == 200  # request × webhook.initialMultiplier (2)
    # The node has 2 CPUs; the two controller pods, the two webhook pods and this one book
    # 100m each: the pod alone is managed, so its limit is its request times maxMultiplier
    # (10): 1 CPU.
    wait("the fair limit", lambda: limit(cluster.api, "team", "app") == 1000, timeout=60)
    pod = wait(
        "the app running",
        lambda: (
            (p := cluster.api.get(pod_path("team", "app")))["status"].get("containerStatuses")
            and p["status"]["containerStatuses"][0]["state"].get("running")
            and p
        ),
    )
    cgroup = cluster.node.container_cgroup(pod["status"]["containerStatuses"][0]["containerID"])
    assert cgroup is not None
    wait("the cgroup quota", lambda: int((cgroup / "cpu.cfs_quota_us").read_text()) == 100_000, timeout=15)
    # Each webhook replica, with the chart's RBAC, read the API server's own addresses from
    # the EndpointSlice default/kubernetes: here its advertise address, the pod network's
    # gateway, which is where its calls through the Service come from. Every other client
    # is a direct poster.
    for hook in cluster.webhook_pods():
        text = cluster.node.container_log(hook, "webhook")
        logs = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        said = [r.get("addresses") for r in logs if r.get("msg") == "the API server's addresses"]
        assert said and said[-1] == [cluster.cp.pod_gateway], (said, logs)
        assert not [r for r in logs if "cannot read the API server's addresses" in str(r.get("msg"))]
    print(
        f"\nhelm install --wait: {installed:.1f}s; leader {leader}; the API server's address {cluster.cp.pod_gateway}"
    )


def _doctor(cluster: Cluster) -> tuple[int, str]:
    """`headroom doctor` with no flags but the kubeconfig; its output with what changes
    from run to run (ages, pod names) masked."""
    r = headroom(cluster, "doctor")
    out = re.sub(r"renewed \d+s ago", "renewed Ns ago", r.stdout)
    out = re.sub(r"headroom-[0-9a-f]{8,10}-[0-9a-z]{5}", "POD", out)
    return r.returncode, out


HEALTHY = f"""\
ok    config: HeadroomConfig cluster exists
ok    install: release headroom: Deployment kube-headroom/headroom, webhook configuration headroom
ok    server: {K8S_VERSION}
ok    pods/resize: served
ok    rbac: checked every permission the controller needs
ok    controller: Deployment kube-headroom/headroom: 2 of 2 replicas ready
ok    leader: Lease kube-headroom/headroom held by POD, renewed Ns ago
ok    namespaces: 1 managed
ok    webhook: Service kube-headroom/headroom has 2 ready endpoint(s)
ok    webhook: headroom's caBundle trusts the certificate the webhook serves (Secret kube-headroom/headroom-webhook-tls)
ok    webhook: a dry-run pod in team was given a CPU limit (200m) by the webhook
"""


def test_doctor_finds_the_release_by_its_labels_and_says_what_is_broken(cluster: Cluster) -> None:
    """Continues from the install above. Healthy, then each thing an operator breaks or
    sees broken, one at a time and put back: the output is pinned whole."""
    code, out = _doctor(cluster)
    assert (code, out) == (0, HEALTHY), out
    api, mwc = cluster.api, "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/headroom"

    # A caBundle that trusts another CA (a GitOps tool put its own value back, say). The
    # leader puts its CA back at its next check (every 10 s), so doctor may look after that:
    # the foreign bundle is put again until doctor has seen it whole (each try has a good
    # chance: doctor reads the bundle within a few seconds).
    bundle = api.get(mwc)["webhooks"][0]["clientConfig"]["caBundle"]
    foreign = base64.b64encode(issue(["elsewhere"], 1)[0]).decode()
    ca_bundle = "/webhooks/0/clientConfig/caBundle"
    broken = HEALTHY.replace(
        "ok    webhook: headroom's caBundle trusts the certificate the webhook serves (Secret kube-headroom/headroom-webhook-tls)\n"
        "ok    webhook: a dry-run pod in team was given a CPU limit (200m) by the webhook\n",
        "FAIL  webhook: headroom's caBundle does not trust the certificate the webhook serves (Secret "
        "kube-headroom/headroom-webhook-tls): the API server's calls fail TLS, so new pods get no limit at creation "
        "(it fails open); the controller's leader puts its CA back at its next certificate check, or at once when "
        "restarted\n"
        "FAIL  webhook: a dry-run pod in team came back without a CPU limit: the webhook fails open (not reachable, "
        "not ready, or its caBundle does not match the served certificate)\n",
    )
    seen = []
    for _ in range(8):
        cluster.run(KUBECTL, "patch", "mutatingwebhookconfiguration", "headroom", "--type=json",
                    "-p", json.dumps([{"op": "replace", "path": ca_bundle, "value": foreign}]))  # fmt: skip
        seen.append(_doctor(cluster))
        if seen[-1] == (1, broken):
            break
    assert seen[-1] == (1, broken), seen[-1][1]
    # Then the leader puts its own CA back by itself (before: only at its hourly check or a restart).
    repaired = time.monotonic()
    wait("the leader puts its CA back into the caBundle", lambda: _doctor(cluster) == (0, HEALTHY), timeout=40)
    print(
        f"\ndoctor saw the foreign caBundle after {len(seen)} tries; healthy again {time.monotonic() - repaired:.1f}s later"
    )
    cluster.run(KUBECTL, "patch", "mutatingwebhookconfiguration", "headroom", "--type=json",
                "-p", json.dumps([{"op": "replace", "path": ca_bundle, "value": bundle}]))  # fmt: skip

    # The webhook's Service selects no pod.
    selector = api.get(f"/api/v1/namespaces/{NS}/services/headroom")["spec"]["selector"]
    cluster.run(KUBECTL, "patch", "service", "headroom", "-n", NS, "--type=merge",
                "-p", json.dumps({"spec": {"selector": {"app.kubernetes.io/name": "nothing"}}}))  # fmt: skip
    slices = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
    unserved = {"labelSelector": "kubernetes.io/service-name=headroom"}
    wait("no endpoints", lambda: not any(s.get("endpoints") for s in api.get(slices, unserved)["items"]))
    code, out = _doctor(cluster)
    cluster.run(KUBECTL, "patch", "service", "headroom", "-n", NS, "--type=merge",
                "-p", json.dumps({"spec": {"selector": selector}}))  # fmt: skip
    assert code == 1 and out == HEALTHY.replace(
        "ok    webhook: Service kube-headroom/headroom has 2 ready endpoint(s)\n",
        "FAIL  webhook: Service kube-headroom/headroom has no ready endpoints: the API server cannot call the "
        "webhook, so new pods get no limit at creation (it fails open); check that the Service's selector matches "
        "the webhook's pods and that they are Ready (kubectl get endpointslices,pods -n kube-headroom)\n",
    ).replace(
        "ok    webhook: a dry-run pod in team was given a CPU limit (200m) by the webhook\n",
        "FAIL  webhook: a dry-run pod in team came back without a CPU limit: the webhook fails open (not reachable, "
        "not ready, or its caBundle does not match the served certificate)\n",
    ), out
    wait("the endpoints back", lambda: _doctor(cluster) == (0, HEALTHY))

    # A replica that cannot start: the node cordoned, the standby deleted.
    standby = next(p for p in cluster.ready() if p != cluster.leader())
    cluster.run(KUBECTL, "cordon", cluster.node.name)
    try:
        cluster.run(KUBECTL, "delete", "pod", "-n", NS, standby)
        wait("one replica ready", lambda: len(cluster.ready()) == 1)
        code, out = _doctor(cluster)
    finally:
        cluster.run(KUBECTL, "uncordon", cluster.node.name)
    assert code == 0 and out == HEALTHY.replace(
        "ok    controller: Deployment kube-headroom/headroom: 2 of 2 replicas ready\n",
        "WARN  controller: Deployment kube-headroom/headroom has 1 of 2 replicas ready: a standby is missing "
        "(kubectl describe pods -n kube-headroom -l app.kubernetes.io/name=kube-headroom)\n",
    ), out  # the webhook's endpoints are its own pods: a controller replica missing takes none away
    wait("two Ready replicas again", lambda: len(cluster.ready()) == 2)
    wait("both replicas serving the webhook", cluster.serving)

    # No HeadroomConfig (deleted by mistake, or never applied): nothing is written anywhere.
    config = Path(cluster.cp.workdir) / "headroomconfig.yaml"
    cluster.run(KUBECTL, "delete", "headroomconfig", "cluster")
    code, out = _doctor(cluster)
    cluster.run(KUBECTL, "apply", "--server-side", "-f", str(config))
    cluster.run(KUBECTL, "wait", "--for=condition=Ready", "headroomconfig/cluster", "--timeout=60s")
    # The first line says it; the webhook is not tried, as it gives no pod a limit by design.
    assert code == 1 and out == (
        "FAIL  config: no HeadroomConfig named 'cluster': nothing is written anywhere; apply one "
        "(examples/headroomconfig.yaml; start with spec.dryRun: true)\n"
        + HEALTHY.split("\n", 1)[1].replace(
            "ok    webhook: a dry-run pod in team was given a CPU limit (200m) by the webhook\n",
            "info  webhook: not tried: with no HeadroomConfig the webhook gives no pod a limit, by design\n",
        )
    ), out
    assert _doctor(cluster) == (0, HEALTHY)


def _renewed(api: Api) -> datetime.datetime:
    renew = api.get(LEASE)["spec"].get("renewTime") or "1970-01-01T00:00:00.000000Z"
    return datetime.datetime.fromisoformat(renew.replace("Z", "+00:00"))


def _generation(api: Api, ns: str, name: str) -> int:
    return int(api.get(pod_path(ns, name))["metadata"]["generation"])  # one more per resize


def _writes(cluster: Cluster) -> tuple[dict[str, int], list[str]]:
    """The audit log replayed: the Lease's holder as each Lease write set it, and every pod
    write of the controller's pods (resizes and annotations). (writes per writing pod,
    the writes made by a pod that did not hold the Lease at the time)."""
    holder, counts, strays = None, dict[str, int](), []
    with open(Path(cluster.cp.workdir) / "audit.log") as log:
        for line in log:
            e = json.loads(line)
            ref = e.get("objectRef") or {}
            if e.get("stage") != "ResponseComplete" or (e.get("responseStatus") or {}).get("code", 0) >= 300:
                continue
            writer = ((e.get("user") or {}).get("extra") or {}).get("authentication.kubernetes.io/pod-name", ["?"])[0]
            if ref.get("resource") == "leases" and ref.get("name") == "headroom":
                holder = ((e.get("requestObject") or {}).get("spec") or {}).get("holderIdentity") or None
            elif ref.get("resource") == "pods":
                counts[writer] = counts.get(writer, 0) + 1
                if writer != holder:
                    strays.append(f"{e['stageTimestamp']} {writer} wrote {ref.get('name')} while {holder} led")
    return counts, strays


def test_a_killed_leader_an_upgrade_an_uninstall_and_a_reinstall_write_nothing_they_need_not(
    cluster: Cluster,
) -> None:
    """Continues from the install above: the pod `app` in `team` holds its fair limit."""
    api = cluster.api
    assert limit(api, "team", "app") == 1000
    written = _generation(api, "team", "app")
    # The leader's container killed (SIGKILL to its processes, as an OOM kill or a crash
    # does: no graceful Lease release). The kubelet restarts it within a second or two; the
    # Lease names the pod, so whichever of the restarted container and the standby renews it
    # first leads, and no one writes in between (the dead process cannot).
    leader = cluster.leader()
    pod = api.get(pod_path(NS, leader))
    cgroup = cluster.node.container_cgroup(pod["status"]["containerStatuses"][0]["containerID"])
    assert cgroup is not None
    killed_at, killed = datetime.datetime.now(datetime.UTC), time.monotonic()
    for pid in (cgroup / "cgroup.procs").read_text().split():
        os.kill(int(pid), signal.SIGKILL)
    wait("the Lease renewed after the kill", lambda: _renewed(api) > killed_at, timeout=60)
    crash_takeover = time.monotonic() - killed
    assert crash_takeover < 15 + 2 + 5
    wait("two Ready replicas again", lambda: len(cluster.ready()) == 2)
    # The leader pod deleted (what a node drain or `kubectl delete pod` does): it lets the
    # Lease go on SIGTERM and the standby takes over at once.
    leader = cluster.leader()
    deleted = time.monotonic()
    cluster.run(KUBECTL, "delete", "pod", "-n", NS, leader, "--wait=false")
    standby = next(p for p in cluster.ready() if p != leader)
    new_leader = wait("a new leader", lambda: (holder := cluster.leader()) != leader and holder, timeout=60)
    takeover = time.monotonic() - deleted
    assert takeover < 15 + 2 + 5
    # The Lease goes to whoever asks first: the standby, or the pod the ReplicaSet starts in
    # the deleted one's place (it campaigns as it starts, before its caches are synced and it
    # is Ready; it writes nothing until they are). Either way the leader becomes Ready.
    wait("the new leader Ready", lambda: new_leader in cluster.ready(), timeout=60)
    print(
        f"\nleader deleted: the Lease went to {'the standby' if new_leader == standby else 'its replacement'} "
        f"{takeover:.1f}s later"
    )
    wait("two Ready replicas again", lambda: len(cluster.ready()) == 2)
    # A new pod during all this still gets its limits; the converged one is not written again.
    kubectl_run(cluster, "second")
    # Two managed pods of 100m share the slack of 2 CPUs less six requests of 100m (the two
    # controller replicas, the two webhook replicas and themselves): 100m + 700m each.
    wait(
        "both at their fair share",
        lambda: limit(api, "team", "app") == limit(api, "team", "second") == 800,
        timeout=60,
    )
    shared = {name: _generation(api, "team", name) for name in ("app", "second")}
    assert shared["app"] == written + 1  # the one cut the second pod asked for, from one writer
    # helm upgrade to a changed value of the controller's: a rolling update of its
    # Deployment. The new replicas book CPU on the node before the old ones go (maxSurge), so
    # the neighbours' shares shrink and come back: a resize per booking change the deadband
    # lets through, at most four (two arrivals, two departures), no limit lost. Once settled
    # the controller decides 800m again with nothing to write; the limits are 800m or within
    # the deadband of it: a cut to 750m while three replicas booked (6.25 %, over the 5 %
    # shrink deadband) is not raised back (6.7 %, under the 10 % grow one), whether the
    # controller saw that moment depends on timing.
    cluster.run(HELM, "upgrade", "headroom", str(CHART), "-n", NS, "--reuse-values", "--set", "workers=3",
                "--wait", "--timeout", "180s")  # fmt: skip
    wait("the upgraded replicas Ready", lambda: len(cluster.ready()) == 2)

    def settled() -> bool:
        pods = {p["name"]: p for p in json.loads(headroom(cluster, "plan", "-n", "team", "-o", "json").stdout)["pods"]}
        return all(pods[n]["targetLimitMilli"] == 800 and not pods[n]["apply"] for n in ("app", "second"))

    wait("the limits back at, or within the deadband of, 800m", settled)
    after_upgrade = {name: limit(api, "team", name) for name in ("app", "second")}
    assert all(800 / 1.1 < v <= 800 for v in after_upgrade.values()), after_upgrade
    upgraded = {name: _generation(api, "team", name) for name in ("app", "second")}
    during = {name: upgraded[name] - shared[name] for name in shared}
    assert all(n <= 4 for n in during.values()), during
    # helm uninstall: the pods keep their limits; what stays is what the controller and the
    # user made (CRDs, the HeadroomConfig, the webhook Secret and the Lease in the release
    # namespace), nothing of the release.
    cluster.run(HELM, "uninstall", "headroom", "-n", NS, "--wait", "--timeout", "120s")
    wait(
        "the controller pods gone",
        lambda: not cluster.api.get(f"/api/v1/namespaces/{NS}/pods")["items"],
        timeout=60,
    )
    assert {name: limit(api, "team", name) for name in ("app", "second")} == after_upgrade
    left = cluster.run(KUBECTL, "get", "all,mutatingwebhookconfigurations,secrets,leases", "-n", NS, "-o", "name")
    assert sorted(left.split()) == ["lease.coordination.k8s.io/headroom", "secret/headroom-webhook-tls"], left
    assert cluster.run(KUBECTL, "get", "headroomconfig", "cluster", "-o", "name").strip()
    # Reinstalled: it finds everything at its target and writes no resize.
    cluster.run(
        HELM, "install", "headroom", str(CHART), "--namespace", NS,
        "--set", "image.repository=headroom.local/kube-headroom", "--set", "image.pullPolicy=Never",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    wait("a leader after the reinstall", lambda: cluster.leader() in cluster.ready())
    time.sleep(3)
    assert {name: _generation(api, "team", name) for name in ("app", "second")} == upgraded
    # No write came from two writers: every pod write, across the kill, the deletion, the
    # upgrade and the reinstall, came from the pod that held the Lease at the time.
    counts, strays = _writes(cluster)
    assert counts and not strays, strays
    print(f"\npod writes by controller pod (audit log): {counts}")
    print(f"resizes of each neighbour during the upgrade: {during}")
    print(f"leader's container killed: the Lease renewed {crash_takeover:.1f}s later")
    print(f"leader pod deleted: {new_leader} leads {takeover:.1f}s later")


def test_the_production_values_install_three_replicas_and_the_prometheus_operator_objects(cluster: Cluster) -> None:
    """Continues from the reinstall above: `helm upgrade` to ci/production-values.yaml, with
    the Prometheus Operator's CRDs (as it publishes them) installed first, as its docs ask."""
    api = cluster.api
    install_prometheus_operator_crds(api)
    cluster.run(
        HELM,
        "upgrade", "headroom", str(CHART), "--namespace", NS,
        "-f", str(CHART / "ci" / "production-values.yaml"),
        "--set", "image.repository=headroom.local/kube-headroom", "--set", "image.pullPolicy=Never",
        "--wait", "--timeout", "240s",
    )  # fmt: skip
    pods = wait("three Ready replicas", lambda: len(cluster.ready()) == 3 and cluster.ready(), timeout=120)
    # The replica of the previous release may still hold the Lease while it shuts down (it
    # lets it go on SIGTERM); one of the new three takes it then.
    wait("one of the three new replicas leads", lambda: cluster.leader() in pods, timeout=60)
    for pod in cluster.controller_pods():
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["requests"]["cpu"] == "250m" and resources["limits"]["cpu"] == "2"
    # The Prometheus Operator's objects, accepted by its published schemas.
    monitors = cluster.run(KUBECTL, "get", "servicemonitors,prometheusrules", "-n", NS, "-o", "name").split()
    assert sorted(monitors) == [
        "prometheusrule.monitoring.coreos.com/headroom",
        "servicemonitor.monitoring.coreos.com/headroom",
    ], monitors

    # Three replicas of 250m and the webhook's two of 100m book 950m of the node's 2 CPUs;
    # the two managed pods of 100m share the rest: (2000 - 950 - 200) / 2 = 425m each, on
    # top of their 100m, 520m once rounded down to a multiple of 10m. The limits
    # they were given during the rollout may lie within the deadband of that (a raise under
    # 10% is not written): `headroom plan` says what the controller decides, nothing to write.
    def planned() -> dict[str, Any] | None:
        plan = json.loads(headroom(cluster, "plan", "-n", "team", "-o", "json").stdout)
        pods = {p["name"]: p for p in plan["pods"]}
        settled = all(pods[n]["targetLimitMilli"] == 520 and not pods[n]["apply"] for n in ("app", "second"))
        return pods if settled else None

    try:
        wait("the limits follow the new booking", planned)
    except AssertionError:
        raise AssertionError(headroom(cluster, "plan", "-n", "team", "-o", "json").stdout) from None
    assert all(520 / 1.1 < limit(api, "team", name) < 520 / 0.95 for name in ("app", "second"))
    code, out = _doctor(cluster)
    assert code == 0 and "ok    controller: Deployment kube-headroom/headroom: 3 of 3 replicas ready" in out, out
    assert not _writes(cluster)[1]  # the rolling update to three replicas: one writer at a time


def _large_review(uid: str, containers: int) -> bytes:
    """An AdmissionReview of a new pod with `containers` containers, each asking for CPU and
    no limit: costly to read and decide (what a hostile tenant sends, over and over)."""
    return json.dumps(admission_review(pod_to_create(containers, "10m"), uid, username="tenant")).encode()


def test_a_webhook_flood_holds_back_no_resize_and_restarts_no_controller(cluster: Cluster) -> None:
    """Continues from the production values above. The webhook runs in pods of its own: a
    flood of large reviews sent straight to its pods (as any pod in the cluster can without
    the NetworkPolicy) while new pods arrive and the controller resizes their neighbours:
    every resize the controller decides lands, and no controller or webhook container
    restarts. (No time bound: the durations are printed.)"""
    api = cluster.api
    ca = base64.b64decode(cluster.secret("headroom-webhook-tls")["data"]["ca.crt"])
    targets = [p["status"]["podIP"] for p in cluster.webhook_pods()]
    assert len(targets) == 2 and all(targets)
    body = _large_review("flood", 3000)  # ~240 KiB: decided on the webhook's large-review worker
    restarts_before = {
        p["metadata"]["name"]: sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses") or [])
        for p in [*cluster.controller_pods(), *cluster.webhook_pods()]
    }
    stop, answered, refused = threading.Event(), Counter[int](), Counter[str]()

    def flood(host: str) -> None:
        while not stop.is_set():
            try:
                status, _, _ = post_review(9443, body, ca, host=host, timeout=10)
                answered[status] += 1
            except OSError as exc:
                refused[type(exc).__name__] += 1

    threads = [threading.Thread(target=flood, args=(t,), daemon=True) for t in targets for _ in range(6)]
    began = time.monotonic()
    for t in threads:
        t.start()
    try:
        time.sleep(5)  # the flood under way
        for name in ("third", "fourth"):
            kubectl_run(cluster, name)

        def settled() -> bool:
            pods = json.loads(headroom(cluster, "plan", "-n", "team", "-o", "json").stdout)["pods"]
            return len(pods) == 4 and all(p["targetLimitMilli"] and not p["apply"] for p in pods) and pods

        pods = wait("every resize landed during the flood", settled, timeout=300)
        landed = time.monotonic() - began
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    # Each pod has a limit of at least its request, which the controller has nothing to change on.
    assert all(limit(api, "team", p["name"]) >= p["requestMilli"] for p in pods), pods
    restarts_after = {
        p["metadata"]["name"]: sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses") or [])
        for p in [*cluster.controller_pods(), *cluster.webhook_pods()]
    }
    assert restarts_after == restarts_before
    assert sum(answered.values()) > 0, (answered, refused)  # the flood reached the webhook
    print(
        f"\nflood of 12 clients x {len(body) // 1024} KiB reviews on the webhook's pods: every resize landed "
        f"{landed:.1f}s after it began; answers {dict(answered)}, connection errors {dict(refused)}"
    )


def test_admission_goes_on_while_no_controller_runs(cluster: Cluster) -> None:
    """Continues from the flood above. The controller's Deployment scaled to zero (a restart,
    a crash loop, an upgrade gone wrong): the webhook's own replicas still give a new pod its
    limit at creation, from their own caches. Then the controller comes back."""
    api = cluster.api
    cluster.run(KUBECTL, "scale", "deployment", "headroom", "-n", NS, "--replicas=0")
    wait("no controller pod", lambda: not cluster.controller_pods(), timeout=120)
    try:
        created = kubectl_run(cluster, "while-down", "-o", "jsonpath={.spec.containers[0].resources.limits.cpu}")
        assert cpu_milli(created) == 200, created  # request × webhook.initialMultiplier (2), at admission
    finally:
        cluster.run(KUBECTL, "scale", "deployment", "headroom", "-n", NS, "--replicas=3")
    wait("three Ready controller replicas", lambda: len(cluster.ready()) == 3, timeout=180)
    # The Lease still names a replica scaled away until its term runs out: wait for a live one.
    wait("a Ready replica leads", lambda: cluster.leader() in cluster.ready(), timeout=60)
    assert limit(api, "team", "while-down") >= 200
