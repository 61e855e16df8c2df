"""Cost of building one API request (headers, auth, URL) without the network, against
the client's own per-request auth path as the baseline, in the same run.

    python tests/bench/bench_requests.py
    python tests/bench/bench_requests.py --quick    # 500 requests a round (CI smoke test)

The transport is replaced by a stub that answers at once, so this measures the
controller's CPU per write or read, not the API server.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

from headroom.cluster.client import Api, connect

N = 20_000


class _Resp:
    status = 200
    data = b"{}"
    headers: ClassVar[dict[str, str]] = {}


class _Answer:
    response = _Resp()


def main() -> None:
    count = 500 if "--quick" in sys.argv[1:] else N
    kubeconfig = Path(tempfile.mkdtemp()) / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n"
        "    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: bench\n"
        "contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
    )
    api = Api(connect(str(kubeconfig)))
    api.client.call_api = lambda *a, **kw: _Answer()  # type: ignore[method-assign]

    def ours() -> None:
        api.get("/api/v1/namespaces/a/pods/b")

    def baseline() -> None:  # what every request cost before: the client's auth on each call
        api.client.param_serialize(
            "GET",
            "/api/v1/namespaces/a/pods/b",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )

    for name, fn in (("headroom Api request", ours), ("client per-request auth (baseline)", baseline)):
        best = 1e9
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(count):
                fn()
            best = min(best, time.perf_counter() - start)
        print(f"{name}: {best / count * 1e6:.1f} µs per request (best of 3 x {count})")


if __name__ == "__main__":
    main()
