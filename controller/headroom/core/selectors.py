"""metav1.LabelSelector matching, with the semantics of k8s.io/apimachinery/pkg/labels."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(slots=True, frozen=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels  # DoesNotExist


@dataclass(slots=True, frozen=True)
class Selector:
    """An empty selector matches everything, as in Kubernetes; `None` is used for 'no selector'."""

    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> Selector:
        if not raw:
            return cls()
        reqs = [Requirement(k, "In", frozenset((str(v),))) for k, v in sorted((raw.get("matchLabels") or {}).items())]
        for expr in raw.get("matchExpressions") or ():
            reqs.append(Requirement(str(expr["key"]), str(expr["operator"]), frozenset(expr.get("values") or ())))
        return cls(tuple(reqs))

    @property
    def empty(self) -> bool:
        return not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)
