"""A loopback fake of the Kubernetes API server for benchmarks at a scale the real one
cannot hold on this machine (150,000 pods). A simulation, named one: it serves what
`headroom run` reads and writes, nothing else.

- lists (paginated `limit`/`continue`) and watches, with WatchList streams
  (`sendInitialEvents`, every object as ADDED then the end bookmark) unless refused;
- with `writes=True`: pod PATCHes (the `resize` subresource as a strategic merge of
  container limits, which bumps `metadata.generation`; metadata merge patches of
  annotations), each refused with 409 when it names a stale `resourceVersion`; Events
  POSTed; server-side apply of the custom resources' status. Every change goes out on the
  watches as MODIFIED. A per-node kubelet echo follows each resize `echo` seconds later:
  `status.containerStatuses[].resources` set to the spec's, `observedGeneration` caught up
  (a second MODIFIED), as a real kubelet reports an applied resize;
- counts of every write by kind, and the time of the last one.

Pods are held as serialized JSON (7 KB each, 150,000 of them take ~1 GB here), decoded
only when written.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

PODS = "/api/v1/pods"
GROUP = "/apis/kube-headroom.dev/v1alpha1"


def node_json(name: str, cpu: str) -> bytes:
    return orjson.dumps(
        {
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "labels": {"kubernetes.io/os": "linux"},
                "resourceVersion": "1",
            },
            "status": {
                "allocatable": {"cpu": cpu, "memory": "64Gi"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


class FakeApiServer:
    def __init__(
        self,
        pods: list[bytes],
        nodes: list[bytes],
        namespaces: list[bytes],
        config: dict[str, Any] | None = None,
        writes: bool = False,
        echo: float = 0.5,
    ) -> None:
        self.objects: dict[str, list[bytes]] = {
            PODS: pods,
            "/api/v1/nodes": nodes,
            "/api/v1/namespaces": namespaces,
            f"{GROUP}/headroomconfigs": [orjson.dumps(config)] if config else [],
            f"{GROUP}/nodepoolprofiles": [],
            "/api/v1/limitranges": [],
            "/api/v1/resourcequotas": [],
        }
        self.writes = writes
        self.echo = echo
        self.watch_list = True  # serve WatchList streams (False: refuse them, as older servers do)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.rv = 10_000_000
        self.index: dict[tuple[str, str], int] = {}
        if writes:
            for i, raw in enumerate(pods):
                meta = orjson.loads(raw)["metadata"]
                self.index[(meta["namespace"], meta["name"])] = i
        self.watchers: dict[str, list[queue.SimpleQueue[bytes]]] = {}
        self.counts: Counter[str] = Counter()
        self.last_write = 0.0
        self.first_resized: set[int] = set()
        self.written: set[int] = set()  # pods that got any write
        self.first_resize_done = 0.0  # when the last pod got its first resize
        self.counts_at_first_done: dict[str, int] = {}  # the counts then
        self._echoes: list[tuple[float, int]] = []
        self._echo_cond = threading.Condition()

    @property
    def bytes(self) -> int:
        return sum(len(b) for v in self.objects.values() for b in v)

    # -- changes ---------------------------------------------------------------------------

    def _emit(self, path: str, obj: bytes) -> None:
        line = b'{"type":"MODIFIED","object":' + obj + b"}\n"
        for q in self.watchers.get(path, ()):
            q.put(line)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _patch_pod(self, ns: str, name: str, sub: str, body: dict[str, Any]) -> tuple[int, bytes]:
        with self.lock:
            i = self.index.get((ns, name))
            if i is None:
                return 404, b'{"kind":"Status","code":404,"reason":"NotFound"}'
            pod = orjson.loads(self.objects[PODS][i])
            meta = pod["metadata"]
            want = (body.get("metadata") or {}).get("resourceVersion")
            if want is not None and want != meta["resourceVersion"]:
                self.counts["conflict"] += 1
                return 409, b'{"kind":"Status","code":409,"reason":"Conflict"}'
            if sub == "resize":
                by_name = {c["name"]: c for c in pod["spec"]["containers"]}
                for c in (body.get("spec") or {}).get("containers") or ():
                    limits = by_name[c["name"]].setdefault("resources", {}).setdefault("limits", {})
                    limits.update(c["resources"]["limits"])
                meta["generation"] = meta.get("generation", 1) + 1
                self.counts["resize"] += 1
                if i not in self.first_resized:
                    self.first_resized.add(i)
                    self.first_resize_done = time.monotonic()
                    self.counts_at_first_done = dict(self.counts)
            else:
                for k, v in ((body.get("metadata") or {}).get("annotations") or {}).items():
                    anns = meta.setdefault("annotations", {})
                    if v is None:
                        anns.pop(k, None)
                    else:
                        anns[k] = v
                self.counts["pod-patch"] += 1
            meta["resourceVersion"] = self._next_rv()
            raw = orjson.dumps(pod)
            self.objects[PODS][i] = raw
            self.written.add(i)
            self.last_write = time.monotonic()
            self._emit(PODS, raw)
        if sub == "resize":
            with self._echo_cond:
                heapq.heappush(self._echoes, (time.monotonic() + self.echo, i))
                self._echo_cond.notify()
        return 200, raw

    def _kubelet(self) -> None:
        """The fleet's kubelets: report each resize applied `echo` seconds after it."""
        while not self.stop.is_set():
            with self._echo_cond:
                while not self._echoes or self._echoes[0][0] > time.monotonic():
                    wait = self._echoes[0][0] - time.monotonic() if self._echoes else 0.5
                    self._echo_cond.wait(max(wait, 0.001))
                    if self.stop.is_set():
                        return
                _, i = heapq.heappop(self._echoes)
            with self.lock:
                pod = orjson.loads(self.objects[PODS][i])
                spec = {c["name"]: c.get("resources") or {} for c in pod["spec"]["containers"]}
                for st in pod["status"].get("containerStatuses") or ():
                    st["resources"] = spec.get(st["name"], {})
                pod["status"]["observedGeneration"] = pod["metadata"].get("generation", 1)
                pod["metadata"]["resourceVersion"] = self._next_rv()
                raw = orjson.dumps(pod)
                self.objects[PODS][i] = raw
                self.counts["kubelet-echo"] += 1
                self._emit(PODS, raw)

    def _apply_status(self, path: str, body: dict[str, Any]) -> bytes:
        coll, _, name = path.removesuffix("/status").rpartition("/")
        with self.lock:
            items = self.objects.get(coll, [])
            for k, raw in enumerate(items):
                obj = orjson.loads(raw)
                if obj["metadata"]["name"] == name:
                    obj["status"] = body.get("status", {})
                    obj["metadata"]["resourceVersion"] = self._next_rv()
                    items[k] = out = orjson.dumps(obj)
                    self._emit(coll, out)
                    break
            else:
                out = orjson.dumps(body)
            self.counts["status"] += 1
            self.last_write = time.monotonic()
        return out

    # -- serving ---------------------------------------------------------------------------

    def serve(self) -> ThreadingHTTPServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _json(self, body: bytes, code: int = 200) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

            def _body(self) -> Any:
                return orjson.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(url.query)
                if url.path == "/version":
                    return self._json(b'{"gitVersion":"v1.37.2","major":"1","minor":"37"}')
                if url.path == "/api/v1":
                    return self._json(b'{"resources":[{"name":"pods"},{"name":"pods/resize"},{"name":"nodes"}]}')
                items = fake.objects.get(url.path)
                if items is None:
                    self.send_error(404)
                    return
                if q.get("watch", ["false"])[0] == "true":
                    return self._watch(url.path, items, q.get("sendInitialEvents", ["false"])[0] == "true")
                start = int(q.get("continue", ["0"])[0])
                limit = int(q.get("limit", [str(len(items) or 1)])[0])
                with fake.lock:
                    page = items[start : start + limit]
                nxt = start + limit
                meta = {"resourceVersion": str(fake.rv)}
                if nxt < len(items):
                    meta["continue"] = str(nxt)
                body = b'{"kind":"List","apiVersion":"v1","metadata":' + orjson.dumps(meta) + b',"items":['
                self._json(body + b",".join(page) + b"]}")

            def _watch(self, path: str, items: list[bytes], initial: bool) -> None:
                if initial and not fake.watch_list:  # as a server without the WatchList feature
                    return self._json(b'{"kind":"Status","status":"Failure","reason":"Invalid","code":422}', 422)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                events: queue.SimpleQueue[bytes] = queue.SimpleQueue()
                with fake.lock:  # the snapshot and the subscription at one version
                    snapshot = list(items) if initial else []
                    fake.watchers.setdefault(path, []).append(events)
                    rv = fake.rv
                try:
                    if initial:
                        chunk: list[bytes] = []
                        for obj in snapshot:
                            chunk.append(b'{"type":"ADDED","object":' + obj + b"}\n")
                            if len(chunk) == 200:
                                self._chunk(b"".join(chunk))
                                chunk = []
                        end = (
                            b'{"kind":"Pod","metadata":{"resourceVersion":"%d","annotations":{"k8s.io/initial-events-end":"true"}}}'
                            % rv
                        )
                        chunk.append(b'{"type":"BOOKMARK","object":' + end + b"}\n")
                        self._chunk(b"".join(chunk))
                    self.wfile.flush()
                    while not fake.stop.is_set():
                        try:
                            first = events.get(timeout=0.5)
                        except queue.Empty:
                            continue
                        lines = [first]
                        while len(lines) < 500:
                            try:
                                lines.append(events.get_nowait())
                            except queue.Empty:
                                break
                        self._chunk(b"".join(lines))
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with fake.lock:
                        fake.watchers[path].remove(events)

            def do_PATCH(self) -> None:
                path = urllib.parse.urlsplit(self.path).path
                body = self._body()
                if not fake.writes:
                    self.send_error(405)
                    return
                parts = path.split("/")
                # /api/v1/namespaces/NS/pods/NAME[/SUB]
                if len(parts) >= 7 and parts[5] == "pods":
                    code, out = fake._patch_pod(parts[4], parts[6], parts[7] if len(parts) > 7 else "", body)
                    return self._json(out, code)
                if path.endswith("/status"):
                    return self._json(fake._apply_status(path, body))
                self.send_error(404)

            def do_POST(self) -> None:
                body = self._body()
                if not fake.writes:
                    self.send_error(405)
                    return
                with fake.lock:
                    fake.counts["event" if "/events" in self.path else "post"] += 1
                    fake.last_write = time.monotonic()
                self._json(orjson.dumps(body), 201)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        if self.writes:
            threading.Thread(target=self._kubelet, daemon=True).start()
        return server

    def kubeconfig(self, server: ThreadingHTTPServer) -> str:
        return (
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{server.server_address[1]}\n"
            "users:\n- name: u\n  user:\n    token: bench\n"
            "contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
        )

    def shutdown(self, server: ThreadingHTTPServer) -> None:
        self.stop.set()
        with self._echo_cond:
            self._echo_cond.notify_all()
        server.shutdown()
