"""Typed decoding of pods off the wire: only the fields a pod record reads.

A pod's JSON is ~5 KB, most of it managedFields, env, probes and volumes that no decision
reads. `msgspec` decodes straight into the structs below and skips everything else
without building it; `to_builtins` then gives the record builder the same mapping shape it
reads from a full decode (`core/records.pod_from_dict` stays the one builder, for the
controller, `plan` and the webhook alike). Measured per MODIFIED event by
`tests/bench/bench_controller.py` (watch stream ingest), against `orjson.loads` alone.

Chosen over hand-written parsing (msgspec is kept, tested and C-fast) and over orjson plus
pruning (which still builds the whole dict first). Anything the structs cannot take (a
wrong type where an object or list belongs, an ERROR event) falls back to the full
decode, so malformed input meets exactly the checks it met before; a hypothesis test
holds both paths to the same records.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
from msgspec import UNSET, Struct, UnsetType

from ..core.keys import FIELD_MANAGER


class _S(Struct, omit_defaults=True):
    """Every field optional and left out of `to_builtins` when absent from the JSON."""


class _Resources(_S):
    requests: Any = UNSET
    limits: Any = UNSET


class _ResizePolicy(_S):
    resourceName: Any = UNSET
    restartPolicy: Any = UNSET


class _Container(_S):
    name: Any = UNSET
    resources: _Resources | UnsetType | None = UNSET
    resizePolicy: list[_ResizePolicy] | UnsetType | None = UNSET
    restartPolicy: Any = UNSET


class _Running(_S):
    pass  # only whether the container runs is read: nothing of it is decoded


class _State(_S):
    running: _Running | UnsetType | None = UNSET


class _ContainerStatus(_S):
    name: Any = UNSET
    state: _State | UnsetType | None = UNSET
    allocatedResources: Any = UNSET
    resources: _Resources | UnsetType | None = UNSET


class _Condition(_S):
    type: Any = UNSET
    status: Any = UNSET
    reason: Any = UNSET
    message: Any = UNSET  # read for a refused resize only (core/records.refusal_cause)
    observedGeneration: Any = UNSET


class _Owner(_S):
    kind: Any = UNSET
    name: Any = UNSET
    controller: Any = UNSET


class _FLimits(_S):
    cpu: Any = msgspec.field(default=UNSET, name="f:cpu")


class _FResources(_S):
    limits: _FLimits | UnsetType | None = msgspec.field(default=UNSET, name="f:limits")


class _FContainer(_S):
    resources: _FResources | UnsetType | None = msgspec.field(default=UNSET, name="f:resources")


class _FSpec(_S):
    resources: _FResources | UnsetType | None = msgspec.field(default=UNSET, name="f:resources")
    containers: dict[str, _FContainer] | UnsetType | None = msgspec.field(default=UNSET, name="f:containers")
    initContainers: dict[str, _FContainer] | UnsetType | None = msgspec.field(default=UNSET, name="f:initContainers")


class _Fields(_S):
    """Of a managedFields entry's fieldsV1, only which CPU limits it owns (records read that
    of other managers' resize entries: another writer of a limit)."""

    spec: _FSpec | UnsetType | None = msgspec.field(default=UNSET, name="f:spec")


class _ManagedField(_S):
    manager: Any = UNSET
    subresource: Any = UNSET
    # Left undecoded (most entries are large and none of their fields is read), then
    # decoded as _Fields for other managers' resize entries only: _fields_of_writers.
    fieldsV1: msgspec.Raw | UnsetType = UNSET


class _Meta(_S):
    name: Any = UNSET
    namespace: Any = UNSET
    uid: Any = UNSET
    resourceVersion: Any = UNSET
    generation: Any = UNSET
    labels: Any = UNSET
    annotations: Any = UNSET
    ownerReferences: list[_Owner] | UnsetType | None = UNSET
    deletionTimestamp: Any = UNSET
    managedFields: list[_ManagedField] | UnsetType | None = UNSET


class _Spec(_S):
    nodeName: Any = UNSET
    containers: list[_Container] | UnsetType | None = UNSET
    initContainers: list[_Container] | UnsetType | None = UNSET
    resources: _Resources | UnsetType | None = UNSET
    overhead: Any = UNSET
    os: Any = UNSET


class _Status(_S):
    phase: Any = UNSET
    qosClass: Any = UNSET
    observedGeneration: Any = UNSET
    conditions: list[_Condition] | UnsetType | None = UNSET
    containerStatuses: list[_ContainerStatus] | UnsetType | None = UNSET
    initContainerStatuses: list[_ContainerStatus] | UnsetType | None = UNSET


class _Pod(_S):
    kind: Any = UNSET
    metadata: _Meta | UnsetType | None = UNSET
    spec: _Spec | UnsetType | None = UNSET
    status: _Status | UnsetType | None = UNSET


class _Event(Struct):
    type: Any = None
    object: _Pod | None = None


class _ListMeta(_S):
    resourceVersion: Any = UNSET
    # "continue" is a Python keyword: renamed on the wire.
    continue_: Any = msgspec.field(default=UNSET, name="continue")


class _List(Struct):
    metadata: _ListMeta | None = None
    items: list[_Pod] | None = None


_FIELDS = msgspec.json.Decoder(_Fields)
_EVENT = msgspec.json.Decoder(_Event)
_LIST = msgspec.json.Decoder(_List)
_FALLBACK = (msgspec.ValidationError, msgspec.DecodeError)
_to_builtins = msgspec.to_builtins


def pod_event(line: bytes) -> Any:
    """A watch event line of pods, as `{"type", "object"}` with the object trimmed to what
    records read; a full decode for ERROR events and anything the structs cannot take."""
    try:
        event = _EVENT.decode(line)
    except _FALLBACK:
        return orjson.loads(line)
    if event.type == "ERROR" or event.object is None:
        return orjson.loads(line)  # a Status object: code, reason, message
    try:
        _fields_of_writers(event.object)
    except _FALLBACK:
        return orjson.loads(line)
    return {"type": event.type, "object": _to_builtins(event.object)}


def _fields_of_writers(pod: _Pod) -> None:
    """Decode the fieldsV1 of resize entries of managers other than Headroom (what
    records read: who else owns a CPU limit); drop every other entry's."""
    meta = pod.metadata
    if meta is None or meta is UNSET or not meta.managedFields:
        return
    for entry in meta.managedFields:
        raw = entry.fieldsV1
        if raw is UNSET:
            continue
        if entry.subresource == "resize" and entry.manager != FIELD_MANAGER:
            entry.fieldsV1 = _FIELDS.decode(raw)  # type: ignore[assignment]
        else:
            entry.fieldsV1 = UNSET


def pod_list(data: bytes) -> Any:
    """A page of a pod list, items trimmed as in `pod_event`."""
    try:
        page = _LIST.decode(data)
    except _FALLBACK:
        return orjson.loads(data)
    meta: dict[str, Any] = {}
    if page.metadata is not None:
        if page.metadata.resourceVersion is not UNSET:
            meta["resourceVersion"] = page.metadata.resourceVersion
        if page.metadata.continue_ is not UNSET:
            meta["continue"] = page.metadata.continue_
    try:
        for p in page.items or ():
            _fields_of_writers(p)
    except _FALLBACK:
        return orjson.loads(data)
    return {"metadata": meta, "items": [_to_builtins(p) for p in page.items or ()]}
