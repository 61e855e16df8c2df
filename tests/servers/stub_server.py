"""The controller's two HTTP servers, run alone in a process of their own for the tests
in tests/unit/test_serving.py (so its threads and memory are measured on their own):
`python stub_server.py CERT_DIR` prints `webhook PORT` and `metrics PORT`, then serves
until stdin closes. The webhook decides with one managed namespace, a HeadroomConfig with
its defaults and 500 nodes; 127.0.0.1 is the API server's address (as the tests' API
server's EndpointSlice says), every other loopback address a direct poster."""

from __future__ import annotations

import sys
from pathlib import Path

from headroom.api.resolve import resolve
from headroom.core.records import Namespace, node_from_dict
from headroom.metrics import Metrics, serve
from headroom.webhook.peers import ApiServerPeers
from headroom.webhook.server import Sources, WebhookServer


def main() -> None:
    config = {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}
    resolver = resolve([config], []).resolver
    nodes = {}
    for i in range(500):
        raw = {
            "metadata": {"name": f"n{i}", "labels": {"kubernetes.io/hostname": f"n{i}"}},
            "status": {"allocatable": {"cpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]},
        }
        node = node_from_dict(raw)
        nodes[node.name] = node
    team = Namespace("team", {"kube-headroom.dev/mode": "managed"})
    sources = Sources(lambda name: team if name == "team" else None, lambda: resolver, nodes=lambda: nodes)
    metrics = Metrics()
    peers = ApiServerPeers(["127.0.0.1/32"])
    hook = WebhookServer(0, Path(sys.argv[1]), sources, "127.0.0.1", metrics.observe_webhook, peers=peers).start()
    probes = serve(0, "127.0.0.1", metrics=metrics, healthy=lambda: (True, "ok"), ready=lambda: (True, "ok"))
    print(f"webhook {hook.port}", flush=True)
    print(f"metrics {probes.port}", flush=True)
    sys.stdin.read()
    hook.shutdown()
    probes.shutdown()


if __name__ == "__main__":
    main()
