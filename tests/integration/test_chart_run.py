"""The chart as rendered, run the way a cluster runs it.

The controller container's exact args and env come from `helm template`; the process
runs as the chart's ServiceAccount (a token from the test API server's TokenRequest API,
RBAC from the same render); the webhook Secret is "mounted" where the Deployment mounts
it (its files written to a directory, the mount path in the args pointed there — the one
thing a kubelet would do that a test process cannot); the probes are polled on the
rendered ports as the kubelet polls them. The image's entrypoint is `headroom`, so the
command is this interpreter's `-m headroom`.
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from headroom.cluster.client import Api, ApiError
from helpers.chart import ROOT, find, helm
from helpers.cluster_helpers import SecretMount
from testbed.controlplane import free_port

VALUES = {
    "default": [],
    "production": ["-f", str(ROOT / "charts" / "kube-headroom" / "ci" / "production-values.yaml")],
    "pod-series": ["--set", "metrics.podSeries=true"],  # the opt-in per-pod metric, through the rendered args
}


def _render(release: str, values: list[str], namespace: str, ports: dict[str, int]) -> list[dict[str, Any]]:
    sets = [f"metrics.port={ports['metrics']}", f"health.port={ports['health']}", f"webhook.port={ports['webhook']}"]
    args = ["template", release, str(ROOT / "charts" / "kube-headroom"), "--namespace", namespace, *values]
    for s in sets:
        args += ["--set", s]
    r = helm(*args)
    assert r.returncode == 0, r.stderr
    return [d for d in YAML(typ="safe").load_all(r.stdout) if d]


def _probe(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


def _kubeconfig(api: Api, control_plane: Any, ns: str, account: str, path: Path) -> Path:
    """A kubeconfig holding a token of `account` (what the kubelet mounts in its pods)."""
    token = api.post(
        f"/api/v1/namespaces/{ns}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )["status"]["token"]
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: c\n  cluster:\n    server: {control_plane.url}\n"
        f"    certificate-authority: {control_plane.ca_file}\n"
        f"users:\n- name: sa\n  user:\n    token: {token}\n"
        "contexts:\n- name: c\n  context: {cluster: c, user: sa}\ncurrent-context: c\n"
    )
    return path


@pytest.mark.parametrize("flavour", sorted(VALUES))
def test_the_rendered_deployments_run_as_their_service_accounts_one_leader_and_every_webhook_replica_serving(
    api: Api, control_plane, crds_installed, tmp_path: Path, flavour: str
):
    """Both Deployments as rendered, two replicas each: the controller's (one leader, which
    issues the webhook certificate) and the webhook's (serving that certificate, Ready only
    once it does), each process as its own ServiceAccount."""
    ns = release = f"hr-{uuid.uuid4().hex[:6]}"  # its own names: the other tests' RBAC stays as it is
    api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    procs: list[subprocess.Popen[bytes]] = []
    applied: list[dict[str, Any]] = []
    mounted: list[SecretMount] = []
    try:
        replicas = []  # (deployment name, replica index, ports, its Deployment as rendered for those ports)
        for name in (release, f"{release}-webhook"):
            for i in range(2):
                ports = {"metrics": free_port(), "health": free_port(), "webhook": free_port()}
                (dep,) = (
                    d
                    for d in find(_render(release, VALUES[flavour], ns, ports), "Deployment")
                    if d["metadata"]["name"] == name
                )
                replicas.append((name, i, ports, dep))
        docs = _render(release, VALUES[flavour], ns, replicas[0][2])
        for doc in docs:
            if doc["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
                api.apply(doc, "headroom-tests")
                applied.append(doc)
        configs = {
            sa["metadata"]["name"]: _kubeconfig(
                api, control_plane, ns, sa["metadata"]["name"], tmp_path / f"{sa['metadata']['name']}.kubeconfig"
            )
            for sa in find(docs, "ServiceAccount")
        }
        args_of: dict[str, list[str]] = {}
        for name, i, _ports, dep in replicas:
            pod = dep["spec"]["template"]["spec"]
            (c,) = pod["containers"]
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
            args = list(c["args"])
            args_of.setdefault(name, list(args))
            for path, volume in mounts.items():  # the kubelet's part: keep the Secret's files mounted
                (vol,) = [v for v in pod["volumes"] if v["name"] == volume]
                assert vol["secret"].get("optional") is True  # the leader creates it after start
                target = tmp_path / f"{name}-{i}{path}"
                target.mkdir(parents=True)
                mounted.append(SecretMount(api, ns, vol["secret"]["secretName"], target).start())
                args = [a.replace(path, str(target)) for a in args]
            env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
            for e in c.get("env") or []:
                if "valueFrom" in e:  # the Downward API: the pod's own name
                    assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
                    env[e["name"]] = f"{name}-{flavour}-{i}"
                else:
                    env[e["name"]] = e["value"]
            env["KUBECONFIG"] = str(configs[pod["serviceAccountName"]])  # in place of the mounted token
            log = open(tmp_path / f"{name}-{i}.log", "wb")  # noqa: SIM115 - closed with the process
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "headroom", *args], env=env, stdout=log, stderr=subprocess.STDOUT
                )
            )
        # The kubelet's probes, on the rendered ports and paths: every replica live and Ready
        # (a webhook replica only once it serves the certificate the controller's leader issued).
        deadline = time.monotonic() + 90
        while True:
            states = [(_probe(p["health"], "/healthz"), _probe(p["health"], "/readyz")) for _, _, p, _ in replicas]
            for (name, i, _, _), proc in zip(replicas, procs, strict=True):
                assert proc.poll() is None, (tmp_path / f"{name}-{i}.log").read_text()[-3000:]
            if all(s == (200, 200) for s in states):
                break
            assert time.monotonic() < deadline, states
            time.sleep(1)
        # Per-pod series exist only when the values ask for them (on the rendered metrics port),
        # and only in the controller; the webhook exports its own families.
        for name, _, ports, _ in replicas:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=5) as r:
                scrape = r.read().decode()
            if name == release:
                assert ("headroom_pod_limit_cores" in scrape) is (flavour == "pod-series"), flavour
            else:
                assert "headroom_webhook_requests_total" in scrape and "headroom_node_factor" not in scrape
        rendered_args = args_of[release]
        (lease_name,) = [a.split("=", 1)[1] for a in rendered_args if a.startswith("--lease-name=")]
        lease = api.get(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{lease_name}")
        holder = lease["spec"]["holderIdentity"]
        assert holder in (f"{release}-{flavour}-0", f"{release}-{flavour}-1")
        time.sleep(3)
        leaders = [i for i in range(2) if b"became leader" in (tmp_path / f"{release}-{i}.log").read_bytes()]
        assert len(leaders) == 1, leaders
        # The leader issued the webhook certificate; every webhook replica serves it, for the
        # Service's name; no controller replica listens on the webhook port.
        secret = api.get(f"/api/v1/namespaces/{ns}/secrets/{release}-webhook-tls")
        ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
        for name, _, ports, _ in replicas:
            ctx = ssl.create_default_context(cadata=ca)
            if name == release:
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection(("127.0.0.1", ports["webhook"]), timeout=2).close()
                continue
            with (
                socket.create_connection(("127.0.0.1", ports["webhook"]), timeout=2) as raw,
                ctx.wrap_socket(raw, server_hostname=f"{release}.{ns}.svc") as tls,
            ):
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
        print(
            f"\n{flavour}: ran `headroom {' '.join(rendered_args)}` x2 and `headroom {' '.join(args_of[release + '-webhook'])}` "
            f"x2; leader {holder}; probes 200/200"
        )
    finally:
        for m in mounted:
            m.stop()
        for p in procs:
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(15)
            if p.poll() is None:
                p.kill()
        for doc in applied:
            if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                with contextlib.suppress(ApiError, KeyError):
                    api.delete(f"/apis/rbac.authorization.k8s.io/v1/{doc['kind'].lower()}s/{doc['metadata']['name']}")
        with contextlib.suppress(ApiError):
            api.delete(f"/api/v1/namespaces/{ns}")
