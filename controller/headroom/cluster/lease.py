"""Leader election on a coordination.k8s.io/v1 Lease, after client-go's leaderelection.

Only the leader writes. Leadership is fenced by time, not only by the renew loop: the
leader may write only while `renew deadline` has not passed since its last successful
renewal, so a leader whose renewals stall stops writing before anyone else can take the
lease (the lease duration is longer than the renew deadline).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .client import Api, ApiError

log = logging.getLogger("headroom.lease")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    api: Api
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    on_started: Callable[[], None] = lambda: None
    on_stopped: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.monotonic
    _renewed_at: float | None = None  # monotonic time of our last successful acquire/renew
    _observed: tuple[Any, ...] | None = None  # the other holder's record as last seen
    _observed_at: float = 0.0
    _expires_at: float = 0.0
    _leading: bool = False
    _waiting_for: str | None = None  # the holder a standby last said it waits for
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def is_leader(self) -> bool:
        """True only while our last renewal is younger than the renew deadline."""
        at = self._renewed_at
        return self._leading and at is not None and self.clock() - at < self.renew_deadline

    def _spec(self, transitions: int, acquire_time: str | None) -> dict[str, Any]:
        now = _now()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "acquireTime": acquire_time or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def try_acquire_or_renew(self) -> bool:
        try:
            lease = self.api.get(self.path)
        except ApiError as exc:
            if exc.status != 404:
                log.warning("lease read failed", extra={"lease": self.name, "error": str(exc)})
                return False
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(0, None),
            }
            try:
                self.api.post(f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases", body)
            except ApiError as err:
                log.warning("lease create failed", extra={"lease": self.name, "error": str(err)})
                return False
            self._renewed_at = self.clock()
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        now = self.clock()
        if record != self._observed:
            # Expiry is judged on our own clock from when we saw the record change; the
            # renewTime only corrects for our polling lag, by at most one retry period.
            self._observed, self._observed_at = record, now - self._lag(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        self._expires_at = self._observed_at + duration
        if holder and holder != self.identity and now < self._expires_at:
            if holder != self._waiting_for:  # said once per holder, not per retry
                self._waiting_for = holder
                log.info(
                    "standby: waiting for the Lease",
                    extra={"lease": f"{self.namespace}/{self.name}", "holder": holder, "identity": self.identity},
                )
            return False  # someone else holds a live lease
        self._waiting_for = None
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        lease["spec"] = self._spec(transitions, spec.get("acquireTime") if holder == self.identity else None)
        try:
            self.api.request_json("PUT", self.path, lease)  # resourceVersion in the body: optimistic
        except ApiError as exc:
            if exc.status != 409:
                log.warning("lease update failed", extra={"lease": self.name, "error": str(exc)})
            return False
        self._renewed_at = self.clock()
        return True

    def _lag(self, renew_time: str | None) -> float:
        if not renew_time:
            return 0.0
        try:
            then = datetime.datetime.fromisoformat(renew_time.replace("Z", "+00:00"))
        except ValueError:
            return 0.0
        age = (datetime.datetime.now(datetime.UTC) - then).total_seconds()
        return min(max(age, 0.0), self.retry_period)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                ok = self.try_acquire_or_renew()
            except Exception:  # a malformed Lease or a bug: not leading this round, never a dead thread
                log.exception("leader election round crashed", extra={"lease": f"{self.namespace}/{self.name}"})
                ok = False
            if ok and not self._leading:
                # The term's start (dropping what a standby queued, queuing every node) comes
                # before leadership shows: a write made in between was dropped with the rest
                # (a wave's event lost in a fresh-clone CI run, test_realnode's takeover).
                self.on_started()
                self._leading = True
                log.info("became leader", extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity})
            elif not ok and self._leading and not self.is_leader():
                self._leading = False
                log.warning("lost leadership; writes stopped", extra={"lease": self.name, "identity": self.identity})
                self.on_stopped()
            wait = self.retry_period
            if not self._leading:  # a standby tries again right when the holder's lease runs out
                wait = min(wait, max(0.05, self._expires_at - self.clock() + 0.05))
            self._stop.wait(wait)

    def alive(self) -> bool:
        return self._thread is None or self._thread.is_alive() or self._stop.is_set()

    def start(self) -> LeaderElector:
        self._thread = threading.Thread(target=self.run, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        was_leading, self._leading = self._leading, False
        if release and was_leading:
            self.release()

    def release(self) -> None:
        """Hand the lease back so another replica takes over at once, not after expiry."""
        try:
            lease = self.api.get(self.path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["leaseDurationSeconds"] = 1
            lease["spec"]["renewTime"] = _now()
            self.api.request_json("PUT", self.path, lease)
            log.info("lease released", extra={"lease": self.name})
        except ApiError as exc:
            log.warning("lease release failed", extra={"lease": self.name, "error": str(exc)})
