"""GitOps with the real Flux: source-, kustomize- and helm-controller (tests/flux/build.sh)
reconcile Headroom from a Git repository served on loopback, on the install cluster
(tests/helpers/install_helpers.py). What the test applies is examples/gitops/flux/ as committed,
with one change a reader makes too: the GitRepository's URL, which points at
git.example.com in the example and at the loopback server here. The image the HelmRelease
installs is set by a commit, as the example's comment asks a user to do.

After each push the test asks for a reconcile the way `flux reconcile source git` does (the
`reconcile.fluxcd.io/requestedAt` annotation), instead of waiting out the 5-minute interval.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from headroom.cluster.client import pod_path
from helpers.install_helpers import KUBECTL, NS, ROOT, Cluster, installed_cluster, kubectl_run, limit, wait
from testbed.flux import Flux, build_flux
from testbed.git import GitServer, source_tree

KUSTOMIZATIONS = "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations"
GITREPO = "/apis/source.toolkit.fluxcd.io/v1/namespaces/flux-system/gitrepositories/kube-headroom"
CONFIG = "examples/gitops/config/headroom.yaml"


@dataclass
class GitOps:
    cluster: Cluster
    flux: Flux
    git: GitServer

    def push(self, message: str, files: dict[str, bytes | None]) -> tuple[str, float]:
        """Commit and push, then ask Flux to look now; (the commit, when it was pushed)."""
        sha = self.git.commit(message, files)
        pushed = time.monotonic()
        now = datetime.datetime.now(datetime.UTC).isoformat()
        self.cluster.run(KUBECTL, "annotate", "--overwrite", "-n", "flux-system", "gitrepository/kube-headroom",
                         f"reconcile.fluxcd.io/requestedAt={now}")  # fmt: skip
        return sha, pushed

    def ready(self, name: str) -> tuple[str, str, str, str]:
        """The Kustomization's Ready condition as Flux wrote it: (status, reason, message,
        last attempted revision)."""
        k = self.cluster.api.get(f"{KUSTOMIZATIONS}/{name}")
        cond = next((c for c in (k.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {})
        revision = (k.get("status") or {}).get("lastAttemptedRevision") or ""
        return cond.get("status", ""), cond.get("reason", ""), cond.get("message", ""), revision

    def settled(self, name: str, sha: str, timeout: float = 120) -> tuple[str, str, str, str]:
        """Wait until Flux has decided on commit `sha` (Ready True or False); the condition."""

        def decided() -> tuple[str, str, str, str] | None:
            state = self.ready(name)
            return state if state[3].endswith(sha) and state[0] in ("True", "False") else None

        try:
            return wait(f"Kustomization {name} decided on {sha[:8]}", decided, timeout)  # type: ignore[no-any-return]
        except AssertionError:
            raise AssertionError(
                f"{name}: {self.ready(name)}\n{self.flux.log_tail('kustomize-controller', 15)}"
            ) from None


@pytest.fixture(scope="module")
def gitops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitOps]:
    tmp = tmp_path_factory.mktemp("flux")
    bins = build_flux()
    with installed_cluster(tmp) as cluster:
        flux = Flux(cluster.cp, bins, tmp / "flux").start()
        git = GitServer(tmp / "git").start(source_tree(ROOT))
        try:
            yield GitOps(cluster, flux, git)
        finally:
            flux.stop()
            git.stop()


def _generation(c: Cluster, name: str) -> int:
    return int(c.api.get(pod_path("team", name))["metadata"]["generation"])


def test_flux_applies_headroom_from_git_and_waits_for_the_controller(gitops: GitOps) -> None:
    c, api = gitops.cluster, gitops.cluster.api
    c.run(KUBECTL, "label", "node", c.node.name, "pool=batch")
    c.run(KUBECTL, "create", "namespace", "team")
    c.run(KUBECTL, "label", "namespace", "team", "kube-headroom.dev/mode=managed")
    # The user's one change to the example, before Flux is pointed at it: the image they built.
    gitops.git.commit(
        "Install the image we built",
        {
            "examples/gitops/flux/controller/helmrelease.yaml": gitops.git.edit(
                "examples/gitops/flux/controller/helmrelease.yaml",
                "repository: registry.example.com/platform/kube-headroom # the image you built (docs/install.md)",
                "repository: headroom.local/kube-headroom\n      pullPolicy: Never",
            )
        },
    )
    # Bootstrap: the example as committed, the URL pointed at this repository.
    began = time.monotonic()
    c.run(KUBECTL, "apply", "-f", str(gitops.git.checkout / "examples/gitops/flux/kustomizations.yaml"))
    c.run(KUBECTL, "patch", "-n", "flux-system", "gitrepository/kube-headroom", "--type=merge",
          "-p", f'{{"spec": {{"url": "{gitops.git.url}"}}}}')  # fmt: skip
    head = gitops.git.git("rev-parse", "HEAD")
    assert gitops.settled("kube-headroom-crds", head)[:2] == ("True", "ReconciliationSucceeded")
    crds_at = time.monotonic() - began
    assert gitops.settled("kube-headroom", head, timeout=300)[:2] == ("True", "ReconciliationSucceeded")
    controller_at = time.monotonic() - began
    assert len(c.ready()) == 2 and c.leader() in c.ready()  # the HelmRelease's pods, one leading
    state = gitops.settled("kube-headroom-config", head)
    assert state[:2] == ("True", "ReconciliationSucceeded"), state
    config_at = time.monotonic() - began
    hrc = api.get("/apis/kube-headroom.dev/v1alpha1/headroomconfigs/cluster")
    assert hrc["status"]["observedGeneration"] == hrc["metadata"]["generation"]  # the controller's verdict waited for

    # In dry-run the pod gets no limit from anyone.
    kubectl_run(c, "app")
    wait(
        "the app's dry-run verdict",
        lambda: "kube-headroom.dev/status" in api.get(pod_path("team", "app"))["metadata"].get("annotations", {}),
    )
    assert limit(api, "team", "app") == 0

    # Commit dryRun: false: Flux applies it, the controller writes the limits. The node has
    # 2 CPUs; two controller replicas, two webhook replicas and the app book 100m each; the
    # app alone is managed, in pool batch (no multiplier cap): 100m + 1500m.
    sha, pushed = gitops.push(
        "Headroom: out of dry-run", {CONFIG: gitops.git.edit(CONFIG, "dryRun: true", "dryRun: false")}
    )
    wait("the app's fair limit", lambda: limit(api, "team", "app") == 1600, timeout=120)
    active_at = time.monotonic() - pushed
    assert gitops.settled("kube-headroom-config", sha)[:2] == ("True", "ReconciliationSucceeded")
    written = _generation(c, "app")

    # A profile the API server refuses: Flux's dry-run fails, nothing is applied.
    good = gitops.git.read(CONFIG).encode()
    sha, _ = gitops.push(
        "batch: a negative multiplier", {CONFIG: gitops.git.edit(CONFIG, "maxMultiplier: 0", "maxMultiplier: -1")}
    )
    status, reason, message, _ = gitops.settled("kube-headroom-config", sha)
    refused = (status, reason, message)
    assert (
        (status, reason) == ("False", "ReconciliationFailed") and "dry-run failed" in message and "Invalid" in message
    ), refused
    assert api.get("/apis/kube-headroom.dev/v1alpha1/nodepoolprofiles/batch")["spec"]["maxMultiplier"] == 0

    # A profile the API server takes and the controller refuses (merged with the global
    # deadband its shrink exceeds its grow): Stalled, and Flux fails its health check early.
    sha, _ = gitops.push(
        "batch: a tight deadband",
        {CONFIG: good.replace(b"  maxMultiplier: 0\n", b"  maxMultiplier: 0\n  deadband: {grow: 0.02}\n")},
    )
    status, reason, message, _ = gitops.settled("kube-headroom-config", sha)
    stalled = (status, reason, message)
    assert (status, reason) == ("False", "HealthCheckFailed") and "NodePoolProfile/batch status: 'Failed'" in message, (
        stalled
    )
    time.sleep(3)
    assert _generation(c, "app") == written and limit(api, "team", "app") == 1600  # nothing written with it

    # Reverted: healthy again.
    sha, _ = gitops.push("Revert the deadband", {CONFIG: good})
    assert gitops.settled("kube-headroom-config", sha)[:2] == ("True", "ReconciliationSucceeded")

    # A tenancy cap for the pool committed: no tenant's pods hold more than half a node's
    # slack. The app's namespace is the node's only tenant: its pot is 750m of the 1500m,
    # and the per-pod floor (min(minBurstFloor 1, S/N = 1.5)) lifts the lone app to 100m + 1.
    sha, pushed = gitops.push(
        "batch: no tenant holds more than half a node's slack",
        {CONFIG: good.replace(b"  maxMultiplier: 0\n", b"  maxMultiplier: 0\n  tenancy: {maxNodeSlackShare: 0.5}\n")},
    )
    wait("the tenant's capped limit", lambda: limit(api, "team", "app") == 1100, timeout=120)
    capped_at = time.monotonic() - pushed
    assert gitops.settled("kube-headroom-config", sha)[:2] == ("True", "ReconciliationSucceeded")

    # The profile deleted from Git: prune deletes it, and its node goes back to the global
    # settings (maxMultiplier 10: 1 CPU for a 100m request).
    without = good.split(b"\n---\n")[0] + b"\n"
    sha, pushed = gitops.push("Drop the batch profile", {CONFIG: without})
    wait("the global cap", lambda: limit(api, "team", "app") == 1000, timeout=120)
    pruned_at = time.monotonic() - pushed
    assert gitops.settled("kube-headroom-config", sha)[:2] == ("True", "ReconciliationSucceeded")
    assert not api.get("/apis/kube-headroom.dev/v1alpha1/nodepoolprofiles")["items"]

    # The controller stopped, then a commit: nobody gives the new generation a verdict, so
    # the health check times out naming the HeadroomConfig InProgress (the example's
    # timeout is 3m; the test sets 20s on the live object to wait less).
    c.run(KUBECTL, "scale", "deployment/headroom", "-n", NS, "--replicas=0")
    wait("the controller gone", lambda: not c.controller_pods(), timeout=60)
    c.run(KUBECTL, "patch", "-n", "flux-system", "kustomization/kube-headroom-config", "--type=merge",
          "-p", '{"spec": {"timeout": "20s"}}')  # fmt: skip
    sha, _ = gitops.push(
        "Exclude a sidecar",
        {CONFIG: gitops.git.edit(CONFIG, "containers: [istio-proxy]", "containers: [istio-proxy, linkerd-proxy]")},
    )
    status, reason, message, _ = gitops.settled("kube-headroom-config", sha, timeout=90)
    stopped = (status, reason, message)
    assert (status, reason) == (
        "False",
        "HealthCheckFailed",
    ) and "HeadroomConfig/cluster status: 'InProgress'" in message, stopped

    print(f"\nbootstrap: CRDs Ready {crds_at:.1f}s, controller (HelmRelease) Ready {controller_at:.1f}s, "
          f"configuration Ready {config_at:.1f}s")  # fmt: skip
    print(f"push -> limit on the pod: dryRun false {active_at:.1f}s; tenancy cap {capped_at:.1f}s; "
          f"profile pruned {pruned_at:.1f}s")  # fmt: skip
    for what, cond in (("CRD refuses", refused), ("controller refuses", stalled), ("controller stopped", stopped)):
        print(f"{what}: Ready={cond[0]} {cond[1]}: {cond[2]}")
