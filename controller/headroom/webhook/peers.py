"""Which clients of the webhook are the API server.

Every review a cluster sends comes from the API server, over connections that carry every
tenant's reviews; anything else that reaches the webhook's port is a direct poster (a pod
posting reviews itself), which the server bounds as one small pool. The API server's
addresses are those of the `default/kubernetes` EndpointSlice (its advertise addresses,
kept by the API server itself), read again every `refresh` seconds, plus CIDRs the
operator names for clusters where the API server calls from elsewhere (a managed control
plane, a konnectivity proxy): `kubectl get endpointslices -n default kubernetes` shows
the first; a cloud's documentation the second.

While neither is known (no CIDRs, and the EndpointSlice not read yet or unreadable),
every client is taken for the API server, as a webhook without this knowledge would:
admission goes on, and the lack is logged and exported as a metric."""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..cluster.client import Api, ApiError

log = logging.getLogger("headroom.webhook")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
KUBERNETES_SLICE = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"
REFRESH = 30.0
SEEN = 4096  # client addresses whose answer is kept


def parse_cidrs(values: Iterable[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """CIDRs (or single addresses) as networks; raises ValueError naming the bad one."""
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"--api-server-cidr {value!r}: not a CIDR or an address ({exc})") from None
    return tuple(out)


def slice_addresses(obj: Mapping[str, Any]) -> frozenset[IPAddress]:
    """The addresses of an EndpointSlice's endpoints that are not marked unready."""
    out: set[IPAddress] = set()
    endpoints = obj.get("endpoints") if isinstance(obj, Mapping) else None
    for endpoint in endpoints if isinstance(endpoints, list) else ():
        if not isinstance(endpoint, Mapping):
            continue
        conditions = endpoint.get("conditions")
        if isinstance(conditions, Mapping) and conditions.get("ready") is False:
            continue
        addresses = endpoint.get("addresses")
        for address in addresses if isinstance(addresses, list) else ():
            ip = _ip(address)
            if ip is not None:
                out.add(ip)
    return frozenset(out)


def _ip(value: object) -> IPAddress | None:
    if not isinstance(value, str):
        return None
    try:
        ip = ipaddress.ip_address(value.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class ApiServerPeers:
    """`peers(address)`: whether a client address is the API server's (see the module)."""

    def __init__(self, cidrs: Iterable[str] = (), on_error: Callable[[str], None] = lambda component: None) -> None:
        self.networks = parse_cidrs(cidrs)
        self.addresses: frozenset[IPAddress] = frozenset()
        self.on_error = on_error
        self._said_unknown = False
        # Answers by address string, asked at every accept: parsing an address cost a
        # flood of refused connections a tenth of the event loop. Emptied when the
        # addresses change, and when it holds SEEN addresses.
        self._seen: dict[str, bool] = {}

    @property
    def known(self) -> bool:
        return bool(self.networks or self.addresses)

    def __call__(self, address: str) -> bool:
        if not self.known:
            return True
        seen = self._seen
        answer = seen.get(address)
        if answer is None:
            ip = _ip(address)
            answer = ip is not None and (ip in self.addresses or any(ip in net for net in self.networks))
            if len(seen) >= SEEN:
                seen.clear()
            seen[address] = answer
        return answer

    def refresh(self, api: Api) -> None:
        """Read the `default/kubernetes` EndpointSlice once; keep the last addresses read
        when it cannot be read."""
        try:
            found = slice_addresses(api.get(KUBERNETES_SLICE))
        except (ApiError, OSError, ValueError) as exc:
            self.on_error("api-server-peers")
            if not self._said_unknown:
                self._said_unknown = True
                log.warning(
                    "cannot read the API server's addresses from the EndpointSlice default/kubernetes"
                    + ("" if self.known else "; every client is taken for the API server until it can")
                    + " (grant get on it, or name the API server's CIDRs: webhook.apiServerCIDRs)",
                    extra={"error": str(exc)[:300]},
                )
            return
        if found != self.addresses:
            log.info("the API server's addresses", extra={"addresses": sorted(map(str, found))})
            self.addresses, self._seen = found, {}
        self._said_unknown = False

    def follow(self, api: Api, stop: threading.Event, every: float = REFRESH) -> None:
        """Refresh until `stop` is set (a thread's target)."""
        while True:
            self.refresh(api)
            if stop.wait(every):
                return
