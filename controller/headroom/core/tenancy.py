"""Tenants in the split (docs/policy.md, "Tenants"): which tenant a pod belongs to, and each
tenant's pot of a node's slack. Pure and exact (fractions of a millicore), no I/O.

A node's slack `S` is first shared between tenants in proportion to weight × the requests
of their managed pods there, each pot capped at `maxNodeSlackShare · S`; what a cap takes
off is shared again among the tenants below it, by the same weights, until no pot is over
the cap (or every tenant is capped, and the rest stays unused). Inside a tenant, its pot is
shared by request, as the whole slack is without tenancy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from .records import Namespace

ONE = Fraction(1)


UNLABELLED = "namespace/"  # '/' never appears in a label value: no collision with a labelled tenant


def tenant_name(namespace: str, record: Namespace | None, label: str | None) -> str:
    """A namespace's tenant. Without a tenant label configured, the namespace's name. With
    one, the label's value; a namespace without it (unset, empty, or the namespace unknown)
    is a tenant of its own, `namespace/<name>`, which no label value can spell: a tenant
    that makes an unlabelled namespace named like another tenant never joins that tenant's
    pot, cap or admission share. One rule for the split, `plan`, `explain` and the
    webhook's fairness."""
    if not label:
        return namespace
    value = record.labels.get(label) if record is not None else None
    return value if value else UNLABELLED + namespace


@dataclass(slots=True, frozen=True)
class Pot:
    """One tenant's part of a node's slack."""

    tenant: str
    weight: Fraction
    requests: int  # M_t: the requests of its managed pods on the node, in millicores
    pot: Fraction  # P_t: the burst its pods share, in millicores
    capped: bool  # maxNodeSlackShare decided the pot

    @property
    def rate(self) -> Fraction:
        """Burst per requested millicore inside the tenant (0 for a tenant without requests)."""
        return self.pot / self.requests if self.requests > 0 else Fraction(0)


def pots(slack: int, requests: Mapping[str, int], tenancy: Tenancy) -> dict[str, Pot]:
    """Each tenant's pot of `slack`, as the module docstring says. `requests`: M_t per
    tenant (tenants with none get an empty pot). Deterministic: the result does not depend
    on the order of `requests`."""
    weight = tenancy.weight_of
    max_share = tenancy.max_node_slack_share
    if slack <= 0:
        return {t: Pot(t, weight(t), m, Fraction(0), False) for t, m in requests.items()}
    cap = max_share * slack
    weighted = {t: weight(t) * m for t, m in requests.items() if m > 0}
    out: dict[str, Pot] = {}
    left = Fraction(slack)
    open_ = set(weighted)
    while open_:
        total = sum((weighted[t] for t in open_), Fraction(0))
        over = {t for t in open_ if left * weighted[t] / total > cap}
        if not over:
            for t in open_:
                out[t] = Pot(t, weight(t), requests[t], left * weighted[t] / total, False)
            break
        for t in over:
            out[t] = Pot(t, weight(t), requests[t], cap, True)
        left -= cap * len(over)
        open_ -= over
    for t, m in requests.items():
        if t not in out:
            out[t] = Pot(t, weight(t), m, Fraction(0), False)
    return out


@dataclass(slots=True, frozen=True)
class Tenancy:
    """The tenancy settings a node runs with: the namespace label naming tenants, their
    weights (a tenant not listed has `default_weight`), and the cap on one tenant's share.
    `neutral`: the split is today's, tenant by tenant or not (no weights that differ, no cap)."""

    label: str | None = None
    weights: tuple[tuple[str, Fraction], ...] = ()
    default_weight: Fraction = ONE
    max_node_slack_share: Fraction = ONE
    _index: dict[str, Fraction] = field(init=False, compare=False, hash=False, repr=False, default_factory=dict)
    _neutral: bool = field(init=False, compare=False, hash=False, repr=False, default=True)

    def __post_init__(self) -> None:
        # Derived once: plan_node and summarize ask for every node of every pass.
        object.__setattr__(self, "_index", dict(self.weights))
        neutral = self.max_node_slack_share >= 1 and all(w == self.default_weight for _, w in self.weights)
        object.__setattr__(self, "_neutral", neutral)

    def weight_of(self, tenant: str) -> Fraction:
        """A tenant's weight: its entry in `weights`, else `default_weight`."""
        return self._index.get(tenant, self.default_weight)

    @property
    def neutral(self) -> bool:
        return self._neutral
