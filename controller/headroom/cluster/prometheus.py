"""What Prometheus measured of a pod's CPU: the kubelet's cAdvisor counters
(`/metrics/cadvisor`), read through Prometheus's HTTP API for `headroom explain`.

Every failure (unreachable, an HTTP error, a query error, an answer that is not what the
API documents) is a `PrometheusError` with one line to print; nothing else escapes.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import urllib3

CADVISOR = ("container_cpu_cfs_periods_total", "container_cpu_cfs_throttled_periods_total")


class PrometheusError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Throttling:
    """One container over the window."""

    container: str
    periods: float  # CFS periods in which it ran
    throttled_periods: float
    throttled_seconds: float
    cpu_avg: float | None  # cores
    cpu_p95: float | None  # cores, the 95th percentile of its 1-minute rate
    # (unix time, throttled share of CFS periods 0..1, throttled seconds per second), each
    # over the minute before that time
    timeline: list[tuple[float, float, float]] = field(default_factory=list)
    # the CPU limit the kernel enforced (cAdvisor's CFS quota / period, cores; 0: none) where
    # it changed: [(unix time it was first seen, cores)], the first entry the window's start
    limits: list[tuple[float, float]] = field(default_factory=list)
    # cgroup v2 pressure (PSI, cAdvisor's container_pressure_cpu_waiting_seconds_total): the
    # share of the window in which some task of the container waited for a CPU; None where
    # the kubelet reports none (cgroup v1, or PSI off in the kernel)
    waiting: float | None = None

    @property
    def share(self) -> float:
        return self.throttled_periods / self.periods if self.periods > 0 else 0.0


MAX_ANSWER = 32 * 1024 * 1024  # bytes of one answer; a pod's series over a day are far fewer
# Sample times outside this range (before 1970, after the year 5138) are not Prometheus's.
MAX_TIME = 1e11


class Prometheus:
    """Prometheus's HTTP API with a deadline for each whole query (connect, headers and
    every byte of the body: a server that trickles its answer is cut off) and a cap on
    the answer's size."""

    def __init__(self, url: str, timeout: float = 10.0, max_bytes: int = MAX_ANSWER) -> None:
        self.url = url.rstrip("/")
        self.timeout, self.max_bytes = timeout, max_bytes
        self.http = urllib3.PoolManager(retries=False)

    def _read(self, path: str, fields: dict[str, str]) -> tuple[int, bytes]:
        """(status, body), or PrometheusError. The query runs on a thread of its own that
        the caller waits for until the deadline: socket timeouts bound each read, not the
        whole exchange, so a server that trickles its headers or its body a byte at a time
        would otherwise never be cut. A query given up on is left to end with the socket
        (a daemon thread; the command has moved on)."""
        outcome: list[tuple[int, bytes] | BaseException] = []

        def fetch() -> None:
            try:
                outcome.append(self._fetch(path, fields))
            except BaseException as exc:  # handed to the caller
                outcome.append(exc)

        worker = threading.Thread(target=fetch, name="prometheus-query", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if not outcome:
            raise PrometheusError(f"Prometheus at {self.url} did not answer within {self.timeout:g} s")
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _fetch(self, path: str, fields: dict[str, str]) -> tuple[int, bytes]:
        try:
            r = self.http.request(
                "GET",
                f"{self.url}{path}",
                fields=fields,
                preload_content=False,
                timeout=urllib3.Timeout(connect=self.timeout, read=self.timeout),
            )
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise PrometheusError(f"Prometheus at {self.url} is unreachable: {exc}") from None
        chunks, size = [], 0
        try:
            for chunk in r.stream(65536):
                size += len(chunk)
                if size > self.max_bytes:
                    raise PrometheusError(
                        f"Prometheus at {self.url} sent an answer larger than {self.max_bytes // 2**20} MiB: "
                        "narrow the query (a shorter --window)"
                    )
                chunks.append(chunk)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise PrometheusError(f"Prometheus at {self.url} broke off its answer: {exc}") from None
        finally:
            r.release_conn()
        return r.status, b"".join(chunks)

    def _get(self, path: str, fields: dict[str, str]) -> Any:
        status, data = self._read(path, fields)
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise PrometheusError(
                f"Prometheus at {self.url} answered HTTP {status} with something that is not its API's JSON "
                "(is this the Prometheus server's address?)"
            ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else None
            raise PrometheusError(f"Prometheus at {self.url} refused the query (HTTP {status}): {error or body!r:.200}")
        answer = body.get("data")
        if not isinstance(answer, dict) or not isinstance(answer.get("result"), list):
            raise PrometheusError(f"Prometheus at {self.url} answered without a result list")
        return answer["result"]

    def vector(self, expr: str, *labels: str) -> dict[str, float]:
        """An instant query: {the series' `labels` joined by '/': value}."""
        return vector_of(self._get("/api/v1/query", {"query": expr}), labels)

    def matrix(self, expr: str, start: float, end: float, step: float) -> dict[str, list[tuple[float, float]]]:
        """A range query: {the series' container: [(unix time, value)]}."""
        fields = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"}
        return matrix_of(self._get("/api/v1/query_range", fields))


# No sample this client reads (cores, shares, seconds, unix times) comes near this; a
# larger one is not Prometheus's answer to the query, and rounding it could overflow.
MAX_VALUE = 1e15


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and abs(number) < MAX_VALUE else None


def _key(series: Any, labels: tuple[str, ...]) -> str | None:
    """The series' `labels` joined by '/'; None for a series whose labels are not what
    Kubernetes names can be (a control character: a newline would print a line of its own)."""
    metric = series.get("metric") if isinstance(series, dict) else None
    if not isinstance(metric, dict):
        return None
    key = "/".join(str(metric.get(label, "")) for label in labels)
    return None if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key) else key


def vector_of(result: list[Any], labels: tuple[str, ...]) -> dict[str, float]:
    """An instant query's result list as {key: value}; series that are not what the API
    documents are skipped, never raised on."""
    out: dict[str, float] = {}
    for series in result:
        key = _key(series, labels)
        value = series.get("value") if key is not None else None
        number = _number(value[1]) if isinstance(value, list) and len(value) == 2 else None
        if key is not None and number is not None:
            out[key] = number
    return out


def matrix_of(result: list[Any]) -> dict[str, list[tuple[float, float]]]:
    """A range query's result list as {container: [(time, value)]}, skipping what is malformed."""
    out: dict[str, list[tuple[float, float]]] = {}
    for series in result:
        key = _key(series, ("container",))
        values = series.get("values") if key is not None else None
        if key is None or not isinstance(values, list):
            continue
        points = []
        for pair in values:
            if isinstance(pair, list) and len(pair) == 2:
                t, v = _number(pair[0]), _number(pair[1])
                if t is not None and v is not None and 0 <= t < MAX_TIME:
                    points.append((t, v))
        out[key] = points
    return out


def _selector(namespace: str, pod: str) -> str:
    def q(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"')

    return f'{{namespace="{q(namespace)}",pod="{q(pod)}",container!="",container!="POD"}}'


def throttling(prom: Prometheus, namespace: str, pod: str, window: float, now: float | None = None) -> list[Throttling]:
    """Each container of the pod over the last `window` seconds, from cAdvisor's counters.
    [] when Prometheus holds no CFS series for the pod (not scraped, or no CPU limit: the
    kernel counts CFS periods only for a container with a quota)."""
    sel, w = _selector(namespace, pod), f"{max(int(window), 60)}s"
    by = "sum by (container)"
    periods = prom.vector(f"{by} (increase(container_cpu_cfs_periods_total{sel}[{w}]))", "container")
    if not periods:
        return []
    throttled = prom.vector(f"{by} (increase(container_cpu_cfs_throttled_periods_total{sel}[{w}]))", "container")
    seconds = prom.vector(f"{by} (increase(container_cpu_cfs_throttled_seconds_total{sel}[{w}]))", "container")
    used = prom.vector(f"{by} (rate(container_cpu_usage_seconds_total{sel}[{w}]))", "container")
    waiting = prom.vector(f"{by} (rate(container_pressure_cpu_waiting_seconds_total{sel}[{w}]))", "container")
    p95 = prom.vector(
        f"quantile_over_time(0.95, ({by} (rate(container_cpu_usage_seconds_total{sel}[1m])))[{w}:15s])", "container"
    )
    end = time.time() if now is None else now
    step = max(window / 12, 15.0)
    share = f"{by} (rate(container_cpu_cfs_throttled_periods_total{sel}[1m])) / {by} (rate(container_cpu_cfs_periods_total{sel}[1m]))"
    shares = prom.matrix(share, end - window, end, step)
    rates = prom.matrix(f"{by} (rate(container_cpu_cfs_throttled_seconds_total{sel}[1m]))", end - window, end, step)
    timeline = {c: [(t, v, dict(rates.get(c, [])).get(t, 0.0)) for t, v in points] for c, points in shares.items()}
    # the limit as the kernel applied it, finely enough to place a resize within a few seconds
    quota = f"{by} (container_spec_cpu_quota{sel}) / {by} (container_spec_cpu_period{sel})"
    limits = {c: changes(points) for c, points in prom.matrix(quota, end - window, end, max(window / 240, 5.0)).items()}
    return [
        Throttling(
            container=c,
            periods=periods[c],
            throttled_periods=throttled.get(c, 0.0),
            throttled_seconds=seconds.get(c, 0.0),
            cpu_avg=used.get(c),
            cpu_p95=p95.get(c),
            timeline=timeline.get(c, []),
            limits=limits.get(c, []),
            waiting=waiting.get(c),
        )
        for c in sorted(periods)
    ]


def changes(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points where the value differs from the one before (the first always)."""
    out: list[tuple[float, float]] = []
    for t, v in points:
        if not out or round(v, 3) != round(out[-1][1], 3):
            out.append((t, v))
    return out


def throttled_pods(prom: Prometheus, window: float) -> dict[str, float]:
    """{namespace/pod: share of its containers' CFS periods throttled} over the last
    `window` seconds, for every pod Prometheus has CFS counters of."""
    w = f"{max(int(window), 60)}s"
    sel = '{container!="",container!="POD"}'
    by = "sum by (namespace, pod)"
    expr = (
        f"{by} (increase(container_cpu_cfs_throttled_periods_total{sel}[{w}])) / "
        f"{by} (increase(container_cpu_cfs_periods_total{sel}[{w}]))"
    )
    found = prom.vector(expr, "namespace", "pod")
    return {key: share for key, share in found.items() if not key.startswith("/") and not key.endswith("/")}
