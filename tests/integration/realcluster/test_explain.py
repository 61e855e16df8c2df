"""`headroom explain --prometheus` on a real node: a real Prometheus (Debian's, the package
promtool comes from) scrapes the real kubelet's `/metrics/cadvisor` with a ServiceAccount
token that may read `nodes/metrics` (the kubelet authorizes it through the API server), and
the controller's `/metrics`; explain reads the kernel's CFS counters from it, and every
query of the chart's Grafana dashboard answers with data."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from ruamel.yaml import YAML

from browser import rendered
from chart import TOOLS
from cluster_helpers import wait_limits
from headroom.cluster.api import MERGE_PATCH, Api, ApiError
from headroom.testbed.controlplane import free_port
from headroom.testbed.node import RealNode, busy_pod
from headroom.testbed.prometheus import PrometheusServer
from realnode_helpers import wait_running

PROMETHEUS = TOOLS / "usr" / "bin" / "prometheus"
ROOT = Path(__file__).resolve().parents[3]


def metrics_reader(api: Api) -> str:
    """A token of ServiceAccount monitoring/prometheus, bound to a ClusterRole that may get
    nodes/metrics and nothing else: what a Prometheus in the cluster needs for cAdvisor."""
    for path, body in (
        ("/api/v1/namespaces", {"metadata": {"name": "monitoring"}}),
        ("/api/v1/namespaces/monitoring/serviceaccounts", {"metadata": {"name": "prometheus"}}),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            {
                "metadata": {"name": "prometheus-kubelet"},
                "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}],
            },
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": "prometheus-kubelet"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "prometheus-kubelet",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}],
            },
        ),
    ):
        try:
            api.post(path, body)
        except ApiError as exc:  # already there from an earlier test of the session
            if exc.status != 409:
                raise
    review = api.post(
        "/api/v1/namespaces/monitoring/serviceaccounts/prometheus/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    return str(review["status"]["token"])


def start_prometheus(
    api: Api, node: RealNode, metrics_port: int, tmp: Path, rules: list[Path] | None = None
) -> PrometheusServer:
    """Prometheus scraping the node's kubelet (/metrics/cadvisor, as monitoring/prometheus)
    and the controller's /metrics on `metrics_port`, every 2 s."""
    return PrometheusServer(
        PROMETHEUS,
        tmp / "prometheus",
        [
            {
                "job_name": "kubelet-cadvisor",
                "scheme": "https",
                "metrics_path": "/metrics/cadvisor",
                "tls_config": {"insecure_skip_verify": True},  # the kubelet's self-signed serving certificate
                "authorization": {"credentials": metrics_reader(api)},
                "static_configs": [{"targets": [f"127.0.0.1:{node.kubelet_port}"]}],
            },
            {"job_name": "headroom", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]},
        ],
        rule_files=rules or [],
    ).start()


def explain(kubeconfig: Path, key: str, *args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "headroom", "explain", key, "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def timeline(text: str) -> list[tuple[str, int, float]]:
    """The throttling timeline explain printed: [(HH:MM:SS, percent of periods, s/s)]."""
    line = next(line for line in text.splitlines() if "throttled over the minute before" in line)
    return [(t, int(p), float(s)) for t, p, s in re.findall(r"(\d\d:\d\d:\d\d) (\d+)% ([\d.]+)s/s", line)]


def test_explain_shows_measured_throttling_whose_limit_it_was_who_books_the_node_and_the_what_if(
    api, control_plane, namespace, real_node: RealNode, headroom_config, start_controller, tmp_path
):
    headroom_config()
    controller = start_controller()
    prom = start_prometheus(api, real_node, controller.metrics_port, tmp_path)
    admin = control_plane.kubeconfig()
    try:
        # A busy pod throttled at a tight static limit, in a namespace Headroom does not manage.
        api.patch(
            f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {"kube-headroom.dev/mode": None}}}, MERGE_PATCH
        )
        api.post(f"/api/v1/namespaces/{namespace}/pods", busy_pod("busy", real_node.name, "100m", "200m"))
        wait_running(api, namespace, "busy")
        deadline = time.monotonic() + 60
        while prom.targets() != {"kubelet-cadvisor": "up", "headroom": "up"}:
            assert time.monotonic() < deadline, (prom.targets(), prom.log_tail())
            time.sleep(1)
        time.sleep(45)  # a few scrapes of the throttled container
        before = explain(admin, f"{namespace}/busy", "--prometheus", prom.url, "--window", "1m")
        print(f"\n$ headroom explain {namespace}/busy --prometheus {prom.url} --window 1m\n{before}")
        throttled = int(re.search(r"container app: throttled in (\d+)% of its CFS periods", before)[1])  # type: ignore[index]
        assert throttled >= 25, before
        assert "whose limit: not Headroom's; the pod is not managed (NamespaceNotManaged)" in before, before
        assert "limit now 200m" in before and "what-if on this node: managed at its request 100m: limit" in before

        # Opted in: the limit rises, and the throttling stops at the resize.
        api.patch(
            f"/api/v1/namespaces/{namespace}",
            {"metadata": {"labels": {"kube-headroom.dev/mode": "managed"}}},
            MERGE_PATCH,
        )
        wait_limits(api, namespace, "busy", ["1"], timeout=30)
        resized = time.strftime("%H:%M:%S", time.gmtime())
        time.sleep(75)  # the 1-minute rates move past the resize
        after = explain(admin, f"{namespace}/busy", "--prometheus", prom.url, "--window", "3m")
        print(
            f"\n$ headroom explain {namespace}/busy --prometheus {prom.url} --window 3m   # resized at {resized}\n{after}"
        )
        # Held to a fifth of a core, the busy thread waits for quota a good part of every
        # second (0.15-0.33 s/s measured here, on a loaded machine); at one core, for at most
        # a few milliseconds.
        points = timeline(after)
        assert any(s >= 0.1 and p >= 25 for t, p, s in points if t <= resized), (resized, points)
        assert points[-1][2] < 0.05, (resized, points)
        assert "whose limit: Headroom's, 1, decided by:" in after, after

        # A second busy pod, opted out, books most of the node: explain names it.
        hog = busy_pod("hog", real_node.name, "1200m", None)
        hog["metadata"]["labels"] = {"kube-headroom.dev/mode": "unmanaged"}
        api.post(f"/api/v1/namespaces/{namespace}/pods", hog)
        wait_running(api, namespace, "hog")
        booked = explain(admin, f"{namespace}/busy", "--prometheus", prom.url, "--window", "2m")
        print(f"\n$ headroom explain {namespace}/busy --prometheus {prom.url} --window 2m   # hog booked\n{booked}")
        largest = re.search(r"the largest: (\S+) (\S+)", booked)
        assert largest is not None and largest.groups() == (f"{namespace}/hog", "1200m"), booked
        assert "(not managed)" in booked.split("the largest:")[1].split(",")[0]
        assert re.search(
            r"what-if on this node: at its request 100m: limit \d+m?; at a request of its p95 use", booked
        ), booked

        # plan -o html --prometheus: the node's throttled pods under its bar, a throttled column.
        page = tmp_path / "plan.html"
        r = subprocess.run(
            [sys.executable, "-m", "headroom", "plan", "--kubeconfig", str(admin), "-o", "html",
             "--prometheus", prom.url, "--window", "3m"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        page.write_text(r.stdout)
        dom = rendered(page)
        section = dom[dom.index(f'data-node="{real_node.name}"') :]
        section = section[: section.index("</section>")]
        note = re.search(rf'class="throttled">throttled: [^<]*{namespace}/busy (\d+)%', section)
        assert note is not None and int(note[1]) >= 5, section
        row = re.search(rf'data-pod="{namespace}/busy">(.*?)</tr>', section)
        assert row is not None and row[1].endswith(f"<td>{note[1]}%</td>"), section

        # Every panel query of the shipped dashboard answers from this Prometheus, with data.
        dashboard = json.loads((ROOT / "charts" / "kube-headroom" / "files" / "dashboard.json").read_text())
        empty = []
        for panel in dashboard["panels"]:
            for target in panel.get("targets") or []:
                expr = target["expr"].replace("$namespace", namespace).replace("$pod", ".*")
                answer = prom.get(f"/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
                assert answer["status"] == "success", (panel["title"], expr, answer)
                if not answer["data"]["result"]:
                    empty.append(f"{panel['title']}: {expr}")
        assert not empty, empty
    finally:
        prom.stop()


def firing(prom: PrometheusServer) -> set[str]:
    return {a["labels"]["alertname"] for a in prom.get("/api/v1/alerts")["data"]["alerts"] if a["state"] == "firing"}


def test_the_controller_stale_alert_fires_when_the_controller_stops_and_resolves_when_it_is_back(
    api, real_node: RealNode, headroom_config, start_controller, tmp_path
):
    """The chart's alert rules loaded into the real Prometheus, each `for:` set to 0s (the
    durations are held by promtool's unit tests, tests/alerts/): the controller's metrics
    gone → HeadroomControllerStale fires; a controller back on the same address → resolved."""
    groups = YAML(typ="safe").load((ROOT / "charts" / "kube-headroom" / "files" / "alerts.yaml").read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    rules = tmp_path / "alerts.yaml"
    rules.write_text(json.dumps(groups))
    headroom_config()
    port = free_port()
    controller = start_controller("--metrics-port", str(port))
    prom = start_prometheus(api, real_node, port, tmp_path, [rules])
    try:
        deadline = time.monotonic() + 90
        while "headroom_heartbeat_timestamp_seconds" not in str(
            prom.get("/api/v1/query?query=headroom_heartbeat_timestamp_seconds")
        ) or firing(prom):
            assert time.monotonic() < deadline, (firing(prom), prom.targets())
            time.sleep(1)
        stopped = time.monotonic()
        controller.stop()
        while "HeadroomControllerStale" not in firing(prom):
            assert time.monotonic() - stopped < 60, (firing(prom), prom.targets())
            time.sleep(1)
        fired = time.monotonic() - stopped
        start_controller("--metrics-port", str(port))
        back = time.monotonic()
        while "HeadroomControllerStale" in firing(prom):
            assert time.monotonic() - back < 90, firing(prom)
            time.sleep(1)
        print(
            f"\nHeadroomControllerStale: firing {fired:.1f}s after the stop, resolved {time.monotonic() - back:.1f}s after the restart"
        )
        assert firing(prom) == set()
    finally:
        prom.stop()
