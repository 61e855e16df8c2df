"""GitOps with the real Argo CD: its application controller and repo-server
(tests/argocd/build.sh, v3.6) sync Headroom from a Git repository served on loopback, on
the install cluster (tests/helpers/install_helpers.py), and judge its health with our health.lua.

What the test applies is examples/gitops/argocd/ as committed, with the changes a reader
makes too: argocd-cm.yaml merged into `argocd-cm` as its comment says, `repoURL` pointed at
the loopback repository (in a commit, for applications.yaml and project.yaml's sourceRepos;
in the copy applied by hand, for root.yaml) and the image the chart installs set in a
commit. Headroom's three Applications run in the locked-down AppProject of project.yaml,
so a kind or name it does not list fails the sync. A team's Deployment, synced by an
Application of its own (in the `default` project), is the workload whose limits Headroom
changes. Argo CD's application controller runs as cluster admin, with
`--persist-resource-health`.

After each push the test asks for a refresh the way `argocd app get --refresh` does (the
`argocd.argoproj.io/refresh` annotation) instead of waiting for Argo CD's 3-minute poll.
Every verdict is read from the Application's status as Argo CD writes it.

One test, the loop in the order a platform team lives it (each step starts from what the
one before left), with the helpers it reads Argo CD through: hence its length.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from headroom.cluster.client import ApiError
from helpers.chart import TOOLS
from helpers.install_helpers import KUBECTL, NS, ROOT, Cluster, headroom, installed_cluster, limit, pod_limit, wait
from testbed.argocd import APPS, ArgoCD, build_argocd
from testbed.git import GitServer, source_tree

CONFIG = "examples/gitops/config/headroom.yaml"
APPLICATIONS = "examples/gitops/argocd/applications.yaml"
PROJECT = "examples/gitops/argocd/project.yaml"
ROOT_APP, CRDS_APP, CHART_APP, CONFIG_APP, TEAM_APP = (
    "kube-headroom-apps", "kube-headroom-crds", "kube-headroom", "kube-headroom-config", "team-web",
)  # fmt: skip
HRC = "/apis/kube-headroom.dev/v1alpha1/headroomconfigs/cluster"
NPP = "/apis/kube-headroom.dev/v1alpha1/nodepoolprofiles"

# A bare Pod in the team's Git folder that carries a CPU limit of its own.
BARE = b"""apiVersion: v1
kind: Pod
metadata:
  name: bare
  namespace: team
spec:
  terminationGracePeriodSeconds: 0
  containers:
    - name: bare
      image: headroom.local/busybox:1
      imagePullPolicy: Never
      command: [sleep, "36000"]
      resources:
        requests: {cpu: 100m, memory: 16Mi}
        limits: {cpu: 200m, memory: 64Mi}
"""

# The team's workload, from Git: one replica requesting 100m CPU and no CPU limit.
TEAM_WEB = b"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: team
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
        - name: web
          image: headroom.local/busybox:1
          imagePullPolicy: Never
          command: [sleep, "36000"]
          resources:
            requests: {cpu: 100m, memory: 16Mi}
            limits: {memory: 64Mi}
"""


@dataclass
class GitOps:
    cluster: Cluster
    argocd: ArgoCD
    git: GitServer

    def app(self, name: str) -> dict[str, Any] | None:
        try:
            return self.cluster.api.get(f"{APPS}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def state(self, name: str) -> tuple[str, str, str]:
        """(sync status, health status, health message) as Argo CD wrote them."""
        status = (self.app(name) or {}).get("status") or {}
        health = status.get("health") or {}
        return (status.get("sync") or {}).get("status", ""), health.get("status", ""), health.get("message", "")

    def refresh(self, *names: str, how: str = "normal") -> None:
        for name in names:
            self.cluster.run(KUBECTL, "annotate", "--overwrite", "-n", "argocd", f"application/{name}",
                             f"argocd.argoproj.io/refresh={how}")  # fmt: skip

    def push(self, message: str, files: dict[str, bytes | None], *apps: str) -> tuple[str, float]:
        """Commit and push, then ask Argo CD to look now; (the commit, when it was pushed)."""
        sha = self.git.commit(message, files)
        pushed = time.monotonic()
        self.refresh(*(apps or (CONFIG_APP,)))
        return sha, pushed

    def wait(self, name: str, what: str, check: Any, timeout: float) -> Any:
        """`install_helpers.wait`, failing with what Argo CD last said of `name`."""
        try:
            return wait(f"{name}: {what}", check, timeout)
        except AssertionError:
            raise AssertionError(
                f"{name}: {what}: {self.state(name)}\n{self.argocd.log_tail('application-controller', 15)}"
            ) from None

    def synced(self, name: str, sha: str, timeout: float = 120) -> dict[str, Any]:
        """Wait until Argo CD's sync of commit `sha` has ended (well or not); the
        operation's state."""

        def ended() -> dict[str, Any] | None:
            op = ((self.app(name) or {}).get("status") or {}).get("operationState") or {}
            revision = ((op.get("syncResult") or {}).get("revision")) or ""
            return op if revision == sha and op.get("phase") in ("Succeeded", "Failed", "Error") else None

        return self.wait(name, f"synced {sha[:8]}", ended, timeout)

    def refused(self, name: str, sha: str, timeout: float = 120) -> tuple[str, str, int]:
        """Wait until a sync of commit `sha` has had an object refused; (the operation's
        phase, the refusal's message, the retry count)."""

        def failed() -> tuple[str, str, int] | None:
            op = ((self.app(name) or {}).get("status") or {}).get("operationState") or {}
            result = op.get("syncResult") or {}
            bad = [r for r in result.get("resources") or [] if r.get("status") == "SyncFailed"]
            if result.get("revision") != sha or not bad:
                return None
            return op.get("phase", ""), bad[0].get("message", ""), int(op.get("retryCount") or 0)

        return self.wait(name, f"the sync of {sha[:8]} refused", failed, timeout)

    def healthy(self, name: str, want: str = "Healthy", timeout: float = 120) -> tuple[str, str, str]:
        """Wait until Argo CD calls Application `name` `want`; (sync, health, message)."""

        def reached() -> tuple[str, str, str] | None:
            state = self.state(name)
            return state if state[1] == want else None

        return self.wait(name, want, reached, timeout)

    def resource_health(self, app: str, kind: str, name: str) -> dict[str, Any]:
        for r in ((self.app(app) or {}).get("status") or {}).get("resources") or []:
            if r.get("kind") == kind and r.get("name") == name:
                return r.get("health") or {}
        return {}

    def steady(self, cycles: int, act: Callable[[int], None], timeout: float = 60) -> tuple[list[Any], int]:
        """`cycles` times: `act(i)`, then a hard refresh of every Application (a fresh diff
        against the live objects) waited until each has been compared again. Every
        Application is read twice a second throughout, while `act` scales and Headroom
        resizes as well as after: (each time one read other than Synced, or had started a
        sync operation since the first cycle; how many reads). Self-heal would fix a drift
        within a cycle, so a drift loop shows as a sync operation even when no read catches
        the OutOfSync between."""
        names = (ROOT_APP, CRDS_APP, CHART_APP, CONFIG_APP, TEAM_APP)

        def status(n: str) -> dict[str, Any]:
            return (self.app(n) or {}).get("status") or {}

        started = {n: (status(n).get("operationState") or {}).get("startedAt", "") for n in names}
        bad: list[Any] = []
        reads = 0
        lock = threading.Lock()

        def look() -> list[str]:
            nonlocal reads
            compared = []
            with lock:
                for n in names:
                    st = status(n)
                    reads += 1
                    sync = (st.get("sync") or {}).get("status", "")
                    op = st.get("operationState") or {}
                    if sync != "Synced":
                        bad.append((n, sync, _drift(st), [c.get("message") for c in st.get("conditions") or []]))
                    if op.get("startedAt", "") != started[n]:
                        bad.append((n, "sync operation started", op.get("startedAt"), op.get("message")))
                        started[n] = op.get("startedAt", "")
                    compared.append(st.get("reconciledAt", ""))
            return compared

        stop = threading.Event()

        def reader() -> None:  # the reads while act() runs (and between the refresh waits)
            while not stop.wait(0.5):
                look()

        watcher = threading.Thread(target=reader, name="argocd-reads", daemon=True)
        watcher.start()
        try:
            for i in range(cycles):
                act(i)
                before = look()
                time.sleep(1.1)  # reconciledAt counts seconds: the next comparison's is a later one
                self.refresh(*names, how="hard")
                deadline = time.monotonic() + timeout
                while any(now <= was for now, was in zip(look(), before, strict=True)):
                    assert time.monotonic() < deadline, f"not compared again within {timeout:.0f}s: {names}"
                    time.sleep(0.5)
        finally:
            stop.set()
            watcher.join(10)
        return bad, reads

    def comparison_error(self, name: str) -> str:
        """The message of the Application's ComparisonError condition ('' without one)."""
        conditions = ((self.app(name) or {}).get("status") or {}).get("conditions") or []
        return next((c.get("message", "") for c in conditions if c.get("type") == "ComparisonError"), "")


@pytest.fixture(scope="module")
def gitops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitOps]:
    tmp = tmp_path_factory.mktemp("argocd")
    bins = build_argocd()
    with installed_cluster(tmp) as cluster:
        argocd = ArgoCD(cluster.cp, bins, tmp / "argocd", TOOLS / "bin").start()
        git = GitServer(tmp / "git").start({**source_tree(ROOT), "team/web.yaml": TEAM_WEB})
        try:
            yield GitOps(cluster, argocd, git)
        finally:
            # What Argo CD last said of every Application, for a failure's reader.
            (tmp / "applications.json").write_text(json.dumps(cluster.api.get(APPS), indent=1))
            argocd.stop()
            git.stop()


def _live_web(c: Cluster) -> list[dict[str, Any]]:
    pods = c.api.get("/api/v1/namespaces/team/pods", {"labelSelector": "app=web"})["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _web(c: Cluster) -> dict[str, Any] | None:
    live = _live_web(c)
    return live[0] if len(live) == 1 else None


def _limits(c: Cluster) -> dict[str, int]:
    """Every live web pod's CPU limit in millicores (0: none)."""
    return {p["metadata"]["name"]: pod_limit(p) for p in _live_web(c)}


def _drift(status: dict[str, Any]) -> list[tuple[str, str]]:
    """(kind, name) of each resource an Application's status reads as not Synced."""
    return [(r.get("kind"), r.get("name")) for r in status.get("resources") or [] if r.get("status") != "Synced"]


def _scaling_stays_synced(gitops: GitOps, alone: int) -> tuple[list[Any], int, list[str]]:
    """Four refresh cycles while the team scales web to 3 replicas and back to 1, as an HPA
    would (its Application ignores the replica count), and Headroom resizes the web pods on
    every change: the three share the node's slack (each below `alone`), the one left gets
    `alone` back. (what `GitOps.steady` found; its reads; the pods Headroom resized)."""
    c = gitops.cluster
    seen: dict[str, set[int]] = {}

    def scale(i: int) -> None:
        n = 3 if i % 2 == 0 else 1
        c.run(KUBECTL, "scale", "deployment/web", "-n", "team", f"--replicas={n}")

        def settled() -> bool:
            limits = _limits(c)
            for name, milli in limits.items():
                seen.setdefault(name, set()).add(milli)
            values = set(limits.values())
            return len(limits) == n and len(values) == 1 and ((n == 1) == (values == {alone}))

        wait(f"{n} web pod(s) at their fair limit", settled, timeout=120)

    bad, reads = gitops.steady(4, scale)
    return bad, reads, sorted(name for name, limits in seen.items() if len(limits) > 1)


def _limit(c: Cluster) -> int | None:
    """The web pod's CPU limit in millicores (0: none), or None while there is not one pod."""
    pod = _web(c)
    return None if pod is None else pod_limit(pod)


def _established(c: Cluster) -> float | None:
    """When the later of Headroom's two CRDs became Established (None: not yet both)."""
    times = []
    for plural in ("headroomconfigs", "nodepoolprofiles"):
        try:
            crd = c.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.kube-headroom.dev")
        except ApiError:
            return None
        cond = next((x for x in (crd.get("status") or {}).get("conditions") or [] if x["type"] == "Established"), None)
        if cond is None or cond["status"] != "True":
            return None
        times.append(_seconds(cond["lastTransitionTime"]))
    return max(times)


def _seconds(ts: str) -> float:
    return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def test_argocd_syncs_headroom_from_git_in_waves_and_reads_its_health(gitops: GitOps, tmp_path: Path) -> None:
    c, api = gitops.cluster, gitops.cluster.api
    c.run(KUBECTL, "label", "node", c.node.name, "pool=batch")
    c.run(KUBECTL, "create", "namespace", "team")
    c.run(KUBECTL, "label", "namespace", "team", "kube-headroom.dev/mode=managed")
    # argocd-cm.yaml merged as its comment says: the two kinds' health and Application health.
    c.run(KUBECTL, "-n", "argocd", "patch", "configmap", "argocd-cm", "--patch-file",
          str(gitops.git.checkout / "examples/gitops/argocd/argocd-cm.yaml"))  # fmt: skip
    # The user's changes to the example, committed: their repository and the image they built.
    example = "https://git.example.com/platform/kube-headroom.git"
    apps = gitops.git.read(APPLICATIONS).replace(example, gitops.git.url)
    image = "repository: registry.example.com/platform/kube-headroom # the image you built (docs/install.md)"
    assert image in apps
    apps = apps.replace(image, "repository: headroom.local/kube-headroom\n          pullPolicy: Never")
    project = gitops.git.read(PROJECT).replace(example, gitops.git.url)
    gitops.git.commit("Our repository and image", {APPLICATIONS: apps.encode(), PROJECT: project.encode()})
    root = tmp_path / "root.yaml"
    root.write_text(gitops.git.read("examples/gitops/argocd/root.yaml").replace(example, gitops.git.url))

    # Bootstrap: the one Application applied by hand.
    began = time.monotonic()
    c.run(KUBECTL, "apply", "-f", str(root))

    seen: dict[str, float] = {}
    clicks: list[float] = []

    def bootstrapped() -> bool:
        for name in (CRDS_APP, CHART_APP, CONFIG_APP):
            if name not in seen and gitops.app(name) is not None:
                seen[name] = time.monotonic() - began
        # Argo CD skips status-only updates (argocd-cm's ignoreResourceUpdates, on by
        # default), and a CRD becoming Established is one: the CRDs' Application can read
        # Progressing until its next periodic refresh (167 s in the first run here). A user
        # clicks Refresh; so does the test, once the CRDs are served, and counts the clicks.
        stuck = gitops.state(CRDS_APP)[:2] == ("Synced", "Progressing") and _established(c) is not None
        if stuck and (not clicks or time.monotonic() - began - clicks[-1] > 10):
            clicks.append(time.monotonic() - began)
            gitops.refresh(CRDS_APP)
        return gitops.state(CONFIG_APP)[:2] == ("Synced", "Healthy")

    wait("the configuration Synced and Healthy", bootstrapped, timeout=420)
    config_at = time.monotonic() - began
    for name in (CRDS_APP, CHART_APP):
        assert gitops.state(name)[:2] == ("Synced", "Healthy"), (name, gitops.state(name))
    # The chart's pods, one leading; Argo CD names the Helm release after the Application.
    assert len(c.ready()) == 2 and c.leader(CHART_APP) in c.ready()
    # The waves in order, on the API server's clock: each Application created once the one
    # before was Healthy (the chart's once the CRDs were Established, the configuration's
    # once the controller's pods were Ready).
    created = {n: _seconds(gitops.app(n)["metadata"]["creationTimestamp"]) for n in (CRDS_APP, CHART_APP, CONFIG_APP)}  # type: ignore[index]
    served = _established(c)
    assert served is not None
    pods_ready = max(
        _seconds(cond["lastTransitionTime"])
        for p in c.controller_pods()
        for cond in p["status"]["conditions"]
        if cond["type"] == "Ready"
    )
    assert created[CRDS_APP] <= served <= created[CHART_APP] and pods_ready <= created[CONFIG_APP], (
        created, served, pods_ready,
    )  # fmt: skip
    hrc = api.get(HRC)
    assert hrc["status"]["observedGeneration"] == hrc["metadata"]["generation"]  # Healthy came from the verdict
    assert gitops.resource_health(CONFIG_APP, "HeadroomConfig", "cluster").get("status") == "Healthy"

    # The team's Deployment, its own Application; in dry-run nobody limits its pod.
    team_app = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": TEAM_APP, "namespace": "argocd"},
        "spec": {
            "project": "default",
            "source": {"repoURL": gitops.git.url, "targetRevision": "main", "path": "team"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "team"},
            # The replica count is the team's (an HPA's, say), not Git's.
            "ignoreDifferences": [{"group": "apps", "kind": "Deployment", "jsonPointers": ["/spec/replicas"]}],
            "syncPolicy": {
                "automated": {"prune": True, "selfHeal": True},
                "syncOptions": ["RespectIgnoreDifferences=true"],
            },
        },
    }
    (tmp_path / "team.yaml").write_text(json.dumps(team_app))
    c.run(KUBECTL, "apply", "-f", str(tmp_path / "team.yaml"))
    gitops.healthy(TEAM_APP)
    wait("the web pod's dry-run verdict",
         lambda: "kube-headroom.dev/status" in ((_web(c) or {}).get("metadata") or {}).get("annotations", {}))  # fmt: skip
    assert _limit(c) == 0

    # Commit dryRun: false: Argo CD applies it, the controller writes the limit. The node
    # has 2 CPUs; two controller replicas, two webhook replicas and the web pod book 100m
    # each; the web pod alone is managed, in pool batch (no multiplier cap): 100m + 1500m.
    sha, pushed = gitops.push(
        "Headroom: out of dry-run", {CONFIG: gitops.git.edit(CONFIG, "dryRun: true", "dryRun: false")}
    )
    assert gitops.synced(CONFIG_APP, sha)["phase"] == "Succeeded"
    wait("the web pod's fair limit", lambda: _limit(c) == 1600, timeout=120)
    active_at = time.monotonic() - pushed
    gitops.healthy(CONFIG_APP)

    # No endless OutOfSync: resized pods, defaulted CRD fields, the caBundle and the status
    # Headroom writes are no drift. While Headroom resizes, no Application reads anything
    # but Synced and none starts a sync (Argo CD's default diff here; server-side diff below).
    default_bad, default_reads, default_resized = _scaling_stays_synced(gitops, 1600)
    assert default_resized, "no web pod was resized while the team scaled: the check proved nothing"
    assert not default_bad, default_bad
    web = _web(c)
    assert web is not None
    written = int(web["metadata"]["generation"])

    # A profile the API server refuses: the sync fails with the server's message (Argo CD
    # retries it), and the refused object is not changed.
    good = gitops.git.read(CONFIG).encode()
    sha, _ = gitops.push(
        "batch: a negative multiplier", {CONFIG: gitops.git.edit(CONFIG, "maxMultiplier: 0", "maxMultiplier: -1")}
    )
    refused = gitops.refused(CONFIG_APP, sha)
    assert "spec.maxMultiplier" in refused[1], refused
    assert api.get(f"{NPP}/batch")["spec"]["maxMultiplier"] == 0
    assert gitops.state(CONFIG_APP)[0] == "OutOfSync"

    # A profile the API server takes and the controller refuses (merged with the global
    # deadband its shrink exceeds its grow): Stalled, so the Application turns Degraded
    # with the controller's message; no pod is written with it. Its multiplier would cut
    # the web pod to 200m if any of it were used.
    sha, pushed = gitops.push(
        "batch: a tight deadband, a multiplier of 2",
        {CONFIG: good.replace(b"  maxMultiplier: 0\n", b"  maxMultiplier: 2\n  deadband: {grow: 0.02}\n")},
    )
    assert gitops.synced(CONFIG_APP, sha)["phase"] == "Succeeded"  # not held behind the refused one
    after_refusal = time.monotonic() - pushed
    degraded = gitops.healthy(CONFIG_APP, "Degraded")
    stalled = next(x for x in api.get(f"{NPP}/batch")["status"]["conditions"] if x["type"] == "Stalled")
    judged = gitops.resource_health(CONFIG_APP, "NodePoolProfile", "batch")
    assert stalled["status"] == "True" and (judged.get("status"), judged.get("message")) == (
        "Degraded", stalled["message"],
    ), (stalled, judged, degraded)  # fmt: skip
    web = _web(c)
    assert web is not None and int(web["metadata"]["generation"]) == written and _limit(c) == 1600
    # And when the node is recomputed under it (the team adds a replica: the two share the
    # slack), the last valid profile runs: 800m each, where the refused one would give 200m.
    c.run(KUBECTL, "scale", "deployment/web", "-n", "team", "--replicas=2")
    shared = wait(
        "two web pods at one limit", lambda: len(set((lim := _limits(c)).values())) == 1 and len(lim) == 2 and lim
    )
    assert set(shared.values()) == {800}, shared
    c.run(KUBECTL, "scale", "deployment/web", "-n", "team", "--replicas=1")
    wait("the web pod back at its fair limit", lambda: _limit(c) == 1600, timeout=120)

    # Reverted: Healthy again.
    sha, _ = gitops.push("Revert the deadband", {CONFIG: good})
    assert gitops.synced(CONFIG_APP, sha)["phase"] == "Succeeded"
    gitops.healthy(CONFIG_APP)

    # The profile deleted from Git: pruned, and its node back on the global settings
    # (maxMultiplier 10: 1 CPU for a 100m request).
    without = good.split(b"\n---\n")[0] + b"\n"
    sha, pushed = gitops.push("Drop the batch profile", {CONFIG: without})
    assert gitops.synced(CONFIG_APP, sha)["phase"] == "Succeeded"
    wait("the global cap", lambda: _limit(c) == 1000, timeout=120)
    pruned_at = time.monotonic() - pushed
    assert not api.get(NPP)["items"]
    gitops.healthy(CONFIG_APP)

    # Argo CD's tracking annotation on our objects: the CRDs took it, the controller gave
    # the object its verdict, and `headroom validate` passes the live object as it is.
    hrc = api.get(HRC)
    tracking = hrc["metadata"].get("annotations", {}).get("argocd.argoproj.io/tracking-id", "")
    assert tracking.startswith(f"{CONFIG_APP}:kube-headroom.dev/HeadroomConfig:"), hrc["metadata"]
    live = tmp_path / "live.yaml"
    live.write_text(c.run(KUBECTL, "get", "headroomconfig", "cluster", "-o", "yaml"))
    checked = headroom(c, "validate", str(live))
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # The same with server-side diff (a dry-run apply per object, the API server's own
    # defaults and managers in the comparison): no drift either.
    for name in (ROOT_APP, CRDS_APP, CHART_APP, CONFIG_APP, TEAM_APP):
        c.run(KUBECTL, "annotate", "--overwrite", "-n", "argocd", f"application/{name}",
              "argocd.argoproj.io/compare-options=ServerSideDiff=true")  # fmt: skip
    server_bad, server_reads, server_resized = _scaling_stays_synced(gitops, 1000)
    assert server_resized, "no web pod was resized while the team scaled: the check proved nothing"
    assert not server_bad, server_bad
    # A change to a live object that the CRD refuses: the server's dry run is the
    # comparison, so Argo CD cannot compare (sync Unknown, a ComparisonError with the
    # server's message) and syncs nothing.
    current = gitops.git.read(CONFIG).encode()
    assert b"spec:\n  dryRun: false" in current
    gitops.push(
        "A negative global multiplier",
        {CONFIG: current.replace(b"spec:\n", b"spec:\n  maxMultiplier: -1\n", 1)},
    )
    compared = wait("the refused change compared", lambda: gitops.comparison_error(CONFIG_APP), timeout=60)
    assert "spec.maxMultiplier" in compared and gitops.state(CONFIG_APP)[0] == "Unknown", (
        compared,
        gitops.state(CONFIG_APP),
    )
    assert api.get(HRC)["spec"].get("maxMultiplier") != -1  # nothing synced
    gitops.push("Revert it", {CONFIG: current})
    wait(
        "Synced again",
        lambda: gitops.state(CONFIG_APP)[0] == "Synced" and not gitops.comparison_error(CONFIG_APP),
        timeout=60,
    )
    for name in (ROOT_APP, CRDS_APP, CHART_APP, CONFIG_APP, TEAM_APP):  # back to the default diff
        c.run(KUBECTL, "annotate", "-n", "argocd", f"application/{name}", "argocd.argoproj.io/compare-options-")

    # A bare Pod in Git with a CPU limit of its own: Headroom manages it like any pod, so its
    # live limit leaves Git's. Argo CD reads the Pod OutOfSync and self-heal writes Git's
    # limit back, which the API server refuses (a pod's resources change only through the
    # resize subresource): the sync fails and is tried again, holding newer commits of that
    # Application, while the pod keeps Headroom's limit.
    sha, _ = gitops.push("team: a bare pod with a CPU limit", {"team/bare.yaml": BARE}, TEAM_APP)

    def bare_limit() -> int | None:
        try:
            return limit(api, "team", "bare")
        except ApiError:
            return None

    raised = wait("the bare pod's limit changed by Headroom", lambda: (bare_limit() or 200) != 200 and bare_limit())

    def refused_by_the_server() -> str | None:
        st = (gitops.app(TEAM_APP) or {}).get("status") or {}
        message = (st.get("operationState") or {}).get("message") or ""
        ok = (st.get("sync") or {}).get("status") == "OutOfSync" and _drift(st) == [("Pod", "bare")]
        return message if ok and "pod updates may not change fields" in message else None

    bare_refused = gitops.wait(TEAM_APP, "self-heal refused on the bare pod", refused_by_the_server, 120)
    assert bare_limit() == raised  # Headroom's limit stands: Git's was never written back
    # The remedy docs/gitops.md gives: the Application ignores Pods' CPU limits (with
    # RespectIgnoreDifferences, already on for the replica count), and the failing sync ends.
    ignore = {"group": "", "kind": "Pod", "jqPathExpressions": [".spec.containers[].resources.limits.cpu"]}
    team_app["spec"]["ignoreDifferences"].append(ignore)  # type: ignore[index]
    (tmp_path / "team.yaml").write_text(json.dumps(team_app))
    c.run(KUBECTL, "apply", "-f", str(tmp_path / "team.yaml"))
    c.run(KUBECTL, "patch", "-n", "argocd", f"application/{TEAM_APP}", "--type", "merge",
          "-p", json.dumps({"status": {"operationState": {"phase": "Terminating"}}}))  # fmt: skip  # argocd app terminate-op
    gitops.refresh(TEAM_APP, how="hard")
    gitops.wait(TEAM_APP, "Synced, the pod's limit ignored", lambda: gitops.state(TEAM_APP)[0] == "Synced", 120)
    sha, _ = gitops.push("team: no bare pod", {"team/bare.yaml": None}, TEAM_APP)
    wait("the bare pod pruned", lambda: bare_limit() is None, timeout=120)

    # The controller stopped, as a platform team does it in an incident: automated sync of
    # the chart's Application turned off in Git (self-heal alone is not enough: in a
    # repository every commit is a new revision, which automated sync applies again, and the
    # chart refuses replicaCount 0), then `kubectl scale`; then a commit: nobody gives the
    # new generation a verdict, so the configuration stays Progressing, saying what it waits
    # for.
    auto = "    automated: {prune: true, selfHeal: true}\n    syncOptions: [CreateNamespace=true"
    manual = gitops.git.edit(APPLICATIONS, auto, "    syncOptions: [CreateNamespace=true")
    gitops.push("kube-headroom: manual sync while we stop it", {APPLICATIONS: manual}, ROOT_APP)
    wait(
        "automated sync off",
        lambda: not (gitops.app(CHART_APP) or {})["spec"]["syncPolicy"].get("automated"),
        timeout=120,
    )
    c.run(KUBECTL, "scale", "deployment/kube-headroom", "-n", NS, "--replicas=0")
    wait("the controller gone", lambda: not c.controller_pods(), timeout=120)
    sha, _ = gitops.push(
        "Exclude a sidecar",
        {CONFIG: gitops.git.edit(CONFIG, "containers: [istio-proxy]", "containers: [istio-proxy, linkerd-proxy]")},
    )
    assert gitops.synced(CONFIG_APP, sha)["phase"] == "Succeeded"
    generation = api.get(HRC)["metadata"]["generation"]
    waiting = f"Waiting for the controller to observe generation {generation}"
    wait(
        "the new generation's health",
        lambda: gitops.resource_health(CONFIG_APP, "HeadroomConfig", "cluster").get("message") == waiting,
    )
    held, deadline = [], time.monotonic() + 10
    while time.monotonic() < deadline:  # nothing can make it Healthy: no controller runs
        held.append(gitops.state(CONFIG_APP)[1])
        time.sleep(1)
    assert set(held) == {"Progressing"}, held
    assert not c.controller_pods() and gitops.state(CHART_APP)[0] == "OutOfSync"  # stopped, and Argo CD says so

    print(f"\nArgo CD {gitops.argocd.version}; bootstrap from the root Application: "
          + ", ".join(f"{n} created {t:.1f}s" for n, t in seen.items())
          + f", configuration Synced+Healthy {config_at:.1f}s; Refresh clicked on the CRDs at "
          + (", ".join(f"{t:.1f}s" for t in clicks) or "never"))  # fmt: skip
    print(f"push -> limit on the pod: dryRun false {active_at:.1f}s; profile pruned {pruned_at:.1f}s")
    print(f"CRD refuses: operation {refused[0]} (retry {refused[2]}): {refused[1]}; the next commit synced "
          f"{after_refusal:.1f}s after its push")  # fmt: skip
    print(f"controller refuses: {degraded[1]}: {degraded[2]}")
    print(f"controller stopped: Progressing for 10 s: {waiting}")
    print(f"server-side diff, a refused change to a live object: ComparisonError: {compared}")
    print(f"a bare pod with 200m in Git, raised to {raised}m by Headroom: OutOfSync, self-heal refused: {bare_refused}")
    print(f"scaling web 1 -> 3 -> 1 twice, 4 hard refreshes: default diff {default_reads} reads, all Synced, no "
          f"sync started, {len(default_resized)} pod(s) resized; server-side diff {server_reads} reads, all "
          f"Synced, no sync started, {len(server_resized)} pod(s) resized")  # fmt: skip
