"""Load a cluster snapshot: a `kubectl get ... -o yaml|json` List or multi-document YAML
holding Nodes, Pods, Namespaces, a HeadroomConfig and NodePoolProfiles."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..api.models import HeadroomConfig, NodePoolProfile
from ..api.resolve import Resolution, resolve
from ..api.validate import load_documents, objects, read_text
from ..core import keys, limitrange, quota
from ..core import neighbours as nb
from ..core.capabilities import pod_level_resize as cluster_pod_level_resize
from ..core.params import Resolver
from ..core.planner import ClusterPlan, plan_cluster
from ..core.records import Namespace, Node, Pod, RecordError, namespace_from_dict, node_from_dict, pod_from_dict


class SnapshotError(Exception):
    """A snapshot that cannot be used; the message names file, object and field."""


@dataclass(slots=True)
class Snapshot:
    nodes: list[Node] = field(default_factory=list)
    pods: list[Pod] = field(default_factory=list)
    namespaces: dict[str, Namespace] = field(default_factory=dict)
    config: HeadroomConfig | None = None
    profiles: list[NodePoolProfile] = field(default_factory=list)
    raw: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # kind -> the objects as read
    neighbours: nb.Neighbours = nb.EMPTY  # VPAs, LimitRanges, ResourceQuotas

    def resolution(self) -> Resolution:
        """The configuration the controller would run on: the same rules (api/resolve.py)."""
        return resolve(self.raw.get(keys.CONFIG_KIND, ()), self.raw.get(keys.PROFILE_KIND, ()))

    def resolver(self) -> Resolver:
        return self.resolution().resolver

    def plan(
        self,
        version: tuple[int, int] | None = None,
        resolver: Resolver | None = None,
        pod_level_resize: bool | None = None,
    ) -> ClusterPlan:
        """What the controller would do with this state: `plan_cluster` on its records,
        with pod-level resize decided as the controller decides it (the nodes' declared
        features, else the server `version`) unless `pod_level_resize` says."""
        if pod_level_resize is None:
            pod_level_resize = cluster_pod_level_resize(self.nodes, version)
        return plan_cluster(
            self.nodes,
            self.pods,
            self.namespaces,
            resolver or self.resolver(),
            pod_level_resize=pod_level_resize,
            neighbours=self.neighbours,
        )


class _LongNumber(ValueError):
    def __init__(self, digits: str) -> None:
        super().__init__(digits)
        self.digits = digits


def _json_int(digits: str) -> int:
    """An integer of a JSON file; one longer than any int64 (or Python's integer-string
    limit) is refused: kubectl could not read it either."""
    if len(digits.lstrip("-")) > 20:
        raise _LongNumber(digits)
    return int(digits)


def _parse(path: Path) -> list[Any]:
    """The file's objects: JSON as `kubectl get -o json` prints it, else YAML read as kubectl
    reads it (the same reader as `headroom validate`, keeping line numbers)."""
    text = read_text(path)
    if text.lstrip().startswith(("{", "[")):
        try:
            data = json.loads(text, parse_int=_json_int)
        except _LongNumber as exc:
            at = text.find(exc.digits)
            line, col = text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
            raise SnapshotError(
                f"{path}:{line}:{col}: not usable JSON: a number of {len(exc.digits)} digits, "
                "larger than any Kubernetes field holds"
            ) from None
        except json.JSONDecodeError as exc:
            raise SnapshotError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
        except RecursionError:
            raise SnapshotError(f"{path}: not usable JSON: nested too deeply") from None
        return data if isinstance(data, list) else [data]
    return load_documents(path, text)


def _shape(value: Any) -> str:
    """What a YAML value is, in the words of the file rather than Python's."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a map"
    return "null" if value is None else f"{type(value).__name__} {str(value)[:40]!r}"


def _where(path: Path | str, obj: Any) -> str:
    """`file:line` of an object read from YAML (JSON objects carry no position)."""
    lc = getattr(obj, "lc", None)
    return f"{path}:{lc.line + 1}" if lc is not None and lc.line is not None else str(path)


def _first_error(path: Path | str, obj: dict[str, Any], exc: ValidationError) -> SnapshotError:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    name = (obj.get("metadata") or {}).get("name", "?")
    msg = str(err["msg"]).removeprefix("Value error, ")
    return SnapshotError(
        f"{path}: {obj.get('kind')}/{name}: {where}: {msg} (run `headroom validate {path}` for all errors)"
    )


def read_objects(path: Path) -> list[Any]:
    """Every object of a YAML or JSON file, `kind: List` expanded."""
    return list(objects(_parse(path)))


def load_snapshot(path: Path) -> Snapshot:
    return snapshot_from_objects(read_objects(path), path)


def snapshot_from_objects(objs: Iterable[Any], path: Path | str) -> Snapshot:
    """Records and validated Headroom objects from raw Kubernetes objects; `path` names
    the source in error messages."""
    snap = Snapshot()
    found: dict[str, list[Any]] = {nb.VPA_KIND: [], limitrange.LIMIT_RANGE_KIND: [], quota.QUOTA_KIND: []}
    builders = {
        nb.VPA_KIND: nb.vpa_from_dict,
        limitrange.LIMIT_RANGE_KIND: limitrange.limit_range_from_dict,
        quota.QUOTA_KIND: quota.quota_from_dict,
    }
    for obj in objs:
        if not isinstance(obj, dict):
            raise SnapshotError(f"{_where(path, obj)}: a document is not a Kubernetes object (got {_shape(obj)})")
        kind = obj.get("kind")
        if not isinstance(kind, str):
            raise SnapshotError(f"{_where(path, obj)}: kind must be a string such as Pod or Node, not {_shape(kind)}")
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise SnapshotError(
                f"{_where(path, obj)}: {kind}: metadata must be an object with a name, not {_shape(meta)}"
            )
        for key in ("labels", "annotations"):
            if meta.get(key) is not None and not isinstance(meta[key], dict):
                raise SnapshotError(
                    f"{_where(path, obj)}: {kind}/{meta.get('name', '?')}: metadata.{key} must be a map of "
                    f"strings, not {_shape(meta[key])}"
                )
        try:
            if kind == "Node":
                snap.nodes.append(node_from_dict(obj))
            elif kind == "Pod":
                snap.pods.append(pod_from_dict(obj))
            elif kind == "Namespace":
                ns = namespace_from_dict(obj)
                snap.namespaces[ns.name] = ns
            elif kind == keys.CONFIG_KIND:
                if snap.config is not None:
                    raise SnapshotError(
                        f"{path}: HeadroomConfig: more than one in the snapshot; keep the one named 'cluster'"
                    )
                snap.config = HeadroomConfig.model_validate(obj)
                snap.raw.setdefault(kind, []).append(obj)
            elif kind == keys.PROFILE_KIND:
                snap.profiles.append(NodePoolProfile.model_validate(obj))
                snap.raw.setdefault(kind, []).append(obj)
            elif kind in builders:
                found[kind].append(builders[kind](obj))
        except RecordError as exc:
            raise SnapshotError(f"{_where(path, obj)}: {exc}") from None
        except ValidationError as exc:
            raise _first_error(_where(path, obj), obj, exc) from None
    for kind, records in found.items():
        snap.neighbours = nb.with_all(snap.neighbours, kind, records)
    return snap
