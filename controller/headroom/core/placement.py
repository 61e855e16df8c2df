"""Where a pod can land: the known nodes its `spec.nodeName`, `nodeSelector` and required
node affinity admit, read the way the API server validates them and the scheduler matches
them (terms ORed; a term with no requirement matches nothing). Taints are not read: the
set is never smaller than the scheduler's. Pure; the webhook decides a new pod's limit on
every node this returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .records import Node

# Requirement-value checks one decision may make while matching the pod's required node
# affinity against the cached nodes: about 0.1 s of CPU on this project's 2-core test machine
# (tests/integration/test_webhook_live.py::test_one_costly_review_holds_no_other holds the
# costly case). An ordinary pod (a few terms of a few values) on 5,000 nodes costs well
# under a tenth of it.
PLACEMENT_BUDGET = 150_000


class Unreadable(ValueError):
    """A part of the pod's placement the webhook cannot read: it then mutates nothing."""


class PlacementTooCostly(Unreadable):
    """The pod's required node affinity would cost more than PLACEMENT_BUDGET to match:
    no limit at admission (the controller sets one once the pod is bound)."""

    def __init__(self, nodes: int, per_node: int) -> None:
        super().__init__(
            f"matching its required node affinity against {nodes} nodes would take more than "
            f"{PLACEMENT_BUDGET} checks (more than {per_node} a node)"
        )


def _int(value: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise Unreadable(f"not an integer: {value!r}") from exc


def _requirement(expr: Any, field: bool) -> tuple[str, str, tuple[str, ...]]:
    """One NodeSelectorRequirement, checked the way the API server validates it."""
    if not isinstance(expr, Mapping):
        raise Unreadable("a node selector requirement is not an object")
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or ()
    if not isinstance(key, str) or not key or not isinstance(values, list | tuple):
        raise Unreadable("a node selector requirement has no usable key or values")
    if not all(isinstance(v, str) for v in values):
        raise Unreadable("node selector values must be strings")
    if field:  # matchFields: only metadata.name, In or NotIn with one value
        if key != "metadata.name" or op not in ("In", "NotIn") or len(values) != 1:
            raise Unreadable(f"matchFields {key} {op} is not one the scheduler supports")
    elif op in ("In", "NotIn"):
        if not values:
            raise Unreadable(f"{op} needs values")
    elif op in ("Exists", "DoesNotExist"):
        if values:
            raise Unreadable(f"{op} takes no values")
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            raise Unreadable(f"{op} takes one value")
        _int(values[0])
    else:
        raise Unreadable(f"unknown operator {op!r}")
    return key, op, tuple(values)


def _matches(req: tuple[str, str, tuple[str, ...]], labels: Mapping[str, str]) -> bool:
    key, op, values = req
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    have = labels.get(key)
    if have is None:
        return False
    try:
        n = int(have)
    except ValueError:
        return False
    return n > int(values[0]) if op == "Gt" else n < int(values[0])


def _terms(spec: Mapping[str, Any], nodes: int, budget: int) -> list[tuple[list[Any], list[Any]]] | None:
    """The required node affinity's terms as (expressions, fields); None when there are none.
    Raises PlacementTooCostly as soon as matching what has been read against `nodes` nodes
    would pass `budget` checks (a term, each requirement, each value an In/NotIn scans):
    the reading stops there too."""
    affinity = spec.get("affinity")
    if affinity is None:
        return None
    if not isinstance(affinity, Mapping):
        raise Unreadable("spec.affinity is not an object")
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is None:
        return None
    if not isinstance(node_affinity, Mapping):
        raise Unreadable("spec.affinity.nodeAffinity is not an object")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    if not isinstance(required, Mapping) or not isinstance(required.get("nodeSelectorTerms"), list):
        raise Unreadable("requiredDuringSchedulingIgnoredDuringExecution has no nodeSelectorTerms list")
    out = []
    per_node, cost = budget // max(nodes, 1), 0
    for term in required["nodeSelectorTerms"]:
        if not isinstance(term, Mapping):
            raise Unreadable("a nodeSelectorTerm is not an object")
        exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not isinstance(exprs, list) or not isinstance(fields, list):
            raise Unreadable("matchExpressions and matchFields must be lists")
        # matchFields cost what expressions cost: each is a requirement matched on every node.
        cost += 1 + 2 * (len(exprs) + len(fields))
        if cost <= per_node:  # the values, where they are lists: read before they are checked
            cost += sum(
                len(v) for e in (*exprs, *fields) if isinstance(e, Mapping) and isinstance(v := e.get("values"), list)
            )
        if cost > per_node:
            raise PlacementTooCostly(nodes, per_node)
        out.append(([_requirement(e, False) for e in exprs], [_requirement(f, True) for f in fields]))
    return out


def candidate_nodes(spec: Mapping[str, Any], nodes: Mapping[str, Node], budget: int = PLACEMENT_BUDGET) -> list[Node]:
    """The known nodes the pod can be placed on, by name, nodeSelector and required node
    affinity (terms ORed; a term with no requirement matches nothing, as in Kubernetes).
    Raises Unreadable for a placement the scheduler could not read either, and
    PlacementTooCostly when matching the affinity would exceed `budget` checks."""
    name = spec.get("nodeName")
    if name:
        if not isinstance(name, str):
            raise Unreadable("spec.nodeName is not a string")
        node = nodes.get(name)
        return [] if node is None else [node]
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
    ):
        raise Unreadable("spec.nodeSelector is not a map of strings")
    # The nodeSelector first: a node is rejected at its first mismatching label, so this
    # costs at most the node's own labels. The affinity is then read against a known count.
    selected = [n for n in nodes.values() if not any(n.labels.get(k) != v for k, v in selector.items())]
    terms = _terms(spec, len(selected), budget)
    if terms is None:
        return selected
    out = []
    for node in selected:
        labels = node.labels
        if not any(
            (exprs or fields)
            and all(_matches(r, labels) for r in exprs)
            and all(_matches(r, {"metadata.name": node.name}) for r in fields)
            for exprs, fields in terms
        ):
            continue
        out.append(node)
    return out
