"""A simulated kubelet, where a real one cannot be had: scale tests (hundreds of nodes on
one machine) and the shared control plane of the integration tests. Its answer to a
resize is held to the real kubelet's by
`tests/integration/realcluster/test_realnode.py::test_the_simulated_kubelet_answers_a_resize_as_the_real_one_does`.

For the pods bound to its node it does what a kubelet's status manager does around
in-place resize (KEP-1287): it starts pods (phase Running, one status per container),
finishes their deletion once asked to (grace period 0, nothing runs), and
when a pod's desired resources differ from what it reports as running it either applies
them — `allocatedResources` at once, `PodResizeInProgress` for `delay` seconds, then the
new `resources` — or, told to, marks the resize `PodResizePending` with reason
`Infeasible` and applies nothing (a refusal injected to test the controller's backoff).

`SimulatedKubelet` polls its one node's pods; `SimulatedFleet` gives the same answers for
every node of a cluster from one watch (the scale benchmarks: hundreds of nodes, where a
poller per node would be the API server's main load).
"""

from __future__ import annotations

import collections
import copy
import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from headroom.cluster.client import MERGE_PATCH, Api, ApiError, pod_path

# The one refusal the simulation can inject. A real kubelet defers only a request raise the
# node cannot fit (tests/integration/realcluster shows it), never a limit-only resize, so
# the simulation offers no "Deferred".
INFEASIBLE = "Infeasible"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _resources(c: dict[str, Any]) -> dict[str, Any]:
    res = c.get("resources") or {}
    return {k: dict(v) for k, v in res.items() if k in ("requests", "limits") and v}


class SimulatedKubelet:
    def __init__(self, api: Api, node: str, *, delay: float = 0.0, outcome: str | None = None) -> None:
        self.api = api
        self.node = node
        self.delay = delay
        self.outcome = outcome  # None applies resizes; INFEASIBLE refuses them
        self.applied = 0  # resizes actuated, for assertions
        self._in_progress: dict[str, float] = {}  # pod key -> when the resize completes
        self.errors: list[BaseException] = []  # raised again by stop(), so a test sees them
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- one pass -------------------------------------------------------------------
    def sync(self) -> None:
        pods = self.api.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={self.node}"})["items"]
        for pod in pods:
            self.answer(pod)

    def answer(self, pod: dict[str, Any]) -> None:
        """What the kubelet does about one pod as it is now (nothing, for most)."""
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        try:
            if pod["metadata"].get("deletionTimestamp"):
                # containers stopped: confirm the deletion, as the kubelet does
                meta = pod["metadata"]
                self.api.delete(pod_path(meta["namespace"], meta["name"]), {"gracePeriodSeconds": 0})
                return
            self._sync_pod(pod)
        except ApiError as err:
            if err.status not in (404, 409):  # deleted or changed meanwhile: the next look
                raise

    def _write_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        # The real kubelet (1.35+) says with every status write which generation of the
        # spec it has seen (tests/integration/realcluster holds this to a real trace).
        status = {"observedGeneration": meta.get("generation", 1), **status}
        self.api.patch(
            pod_path(meta["namespace"], meta["name"], "status"),
            {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status},
            MERGE_PATCH,
        )

    def _sync_pod(self, pod: dict[str, Any]) -> None:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        running = {s["name"]: s for s in status.get("containerStatuses") or []}
        desired = {c["name"]: _resources(c) for c in spec["containers"]}
        if not running:  # start the pod with what it asked for
            self._write_status(
                pod,
                {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": _now()}],
                    "containerStatuses": [self._container_status(c, desired[c["name"]]) for c in spec["containers"]],
                },
            )
            return
        changed = any(running[n].get("resources", {}) != r for n, r in desired.items() if n in running)
        conditions = [
            c for c in status.get("conditions") or [] if c["type"] not in ("PodResizePending", "PodResizeInProgress")
        ]
        if not changed:
            if len(conditions) != len(status.get("conditions") or []):
                self._write_status(pod, {"conditions": conditions})
            self._in_progress.pop(key, None)
            return
        if self.outcome is not None:
            pending = next((c for c in status.get("conditions") or [] if c["type"] == "PodResizePending"), None)
            if pending is None or pending.get("observedGeneration", 0) != meta.get("generation", 1):
                message = "Node didn't have enough capacity"
                conditions.append(
                    {
                        "type": "PodResizePending",
                        "status": "True",
                        "reason": self.outcome,
                        "message": message,
                        "lastTransitionTime": _now(),
                        # 1.35+ kubelets say which generation of the spec they refused
                        "observedGeneration": meta.get("generation", 1),
                    }
                )
                self._write_status(pod, {"conditions": conditions, "observedGeneration": meta.get("generation", 1)})
            return
        done_at = self._in_progress.setdefault(key, time.monotonic() + self.delay)
        statuses = []
        for c in spec["containers"]:
            st = copy.deepcopy(running.get(c["name"]) or self._container_status(c, desired[c["name"]]))
            st["allocatedResources"] = dict(desired[c["name"]].get("requests", {}))
            if time.monotonic() >= done_at:
                st["resources"] = desired[c["name"]]
            statuses.append(st)
        if time.monotonic() < done_at:
            if not any(c["type"] == "PodResizeInProgress" for c in status.get("conditions") or []):
                conditions.append({"type": "PodResizeInProgress", "status": "True", "lastTransitionTime": _now()})
                self._write_status(pod, {"conditions": conditions, "containerStatuses": statuses})
            return
        self._write_status(pod, {"conditions": conditions, "containerStatuses": statuses})
        self._in_progress.pop(key, None)
        self.applied += 1

    @staticmethod
    def _container_status(c: dict[str, Any], resources: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": True,
            "restartCount": 0,
            "started": True,
            "state": {"running": {"startedAt": _now()}},
            "allocatedResources": dict(resources.get("requests", {})),
            "resources": resources,
        }

    # --- in the background ----------------------------------------------------------
    def start(self, interval: float = 0.1) -> SimulatedKubelet:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.sync()
                except Exception as exc:  # reported by stop()
                    self.errors.append(exc)
                    return
                self._stop.wait(interval)

        self._thread = threading.Thread(target=loop, name=f"kubelet-{self.node}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.errors:
            raise RuntimeError(f"simulated kubelet on {self.node} failed") from self.errors[0]

    def __enter__(self) -> SimulatedKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SimulatedFleet(SimulatedKubelet):
    """The simulated kubelet of every node with pods in `namespace`, driven by one watch:
    each bound pod's event is answered as `SimulatedKubelet` answers it, by `workers`
    threads. Resizes apply at once (no `delay`: a pending resize would need a timer per
    pod, which no benchmark here asks for). `observe(pod)` sees every pod event first, in
    the watch's thread (a benchmark's clock)."""

    def __init__(
        self,
        api: Api,
        namespace: str,
        *,
        observe: Callable[[dict[str, Any]], None] | None = None,
        workers: int = 4,
        outcome: str | None = None,
    ) -> None:
        super().__init__(api, "*", outcome=outcome)
        self.namespace = namespace
        self.observe = observe
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._ready = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._workers = workers

    def sync(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        listed = self.api.get(path)
        for pod in listed["items"]:
            self._seen(pod)
        rv = listed["metadata"]["resourceVersion"]
        while not self._stop.is_set():
            for line in self.api.watch(path, rv, timeout_seconds=60, read_timeout=90):
                event = orjson.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    return  # expired: start() lists again
                rv = obj["metadata"]["resourceVersion"]
                if kind not in ("BOOKMARK", "DELETED"):
                    self._seen(obj)
                if self._stop.is_set():
                    return

    def _seen(self, pod: dict[str, Any]) -> None:
        if self.observe is not None:
            self.observe(pod)
        if not pod["spec"].get("nodeName"):
            return
        with self._ready:
            self._queue.append(pod)
            self._ready.notify()

    def _work(self) -> None:
        while not self._stop.is_set():
            with self._ready:
                while not self._queue and not self._stop.is_set():
                    self._ready.wait(0.5)
                if not self._queue:
                    continue
                pod = self._queue.popleft()
            try:
                self.answer(pod)
            except Exception as exc:  # reported by stop()
                self.errors.append(exc)

    def start(self, interval: float = 0.5) -> SimulatedFleet:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.sync()
                except ApiError:
                    self._stop.wait(interval)  # the watch broke: list again
                except Exception as exc:  # reported by stop()
                    self.errors.append(exc)
                    return

        self._threads = [threading.Thread(target=loop, name="fleet-watch", daemon=True)]
        self._threads += [
            threading.Thread(target=self._work, name=f"fleet-{i}", daemon=True) for i in range(self._workers)
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._ready:
            self._ready.notify_all()
        for t in self._threads:
            t.join(5)
        if self.errors:
            raise RuntimeError("simulated fleet kubelet failed") from self.errors[0]
