"""Offline validation of HeadroomConfig / NodePoolProfile YAML, for GitOps pull requests.

Errors read `file:line:column: Kind/name: spec.field.path: what is wrong, what is allowed`.
ruamel.yaml keeps the position of every key, so each error points at the offending line.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from ..core import keys
from .models import HeadroomConfig, NodePoolProfile
from .resolve import resolve
from .schema import check
from .yamlread import DepthError, load_all

KINDS: dict[str, type[BaseModel]] = {keys.CONFIG_KIND: HeadroomConfig, keys.PROFILE_KIND: NodePoolProfile}


class UnreadableFile(Exception):
    """The file cannot be read or is not YAML; the message names the file and position."""


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    line: int  # 1-based
    column: int  # 1-based
    obj: str  # Kind/name
    path: str  # spec.deadband.shrink
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.obj}: {self.path}: {self.message}"


def read_text(path: Path) -> str:
    """The file as UTF-8 text (what kubectl and the API server accept); UnreadableFile
    naming the line and column of the first byte that is not."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UnreadableFile(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UnreadableFile(
            f"{path}:{line}:{column}: not UTF-8 text (byte 0x{data[exc.start]:02x} cannot be decoded); "
            "save the file as UTF-8"
        ) from None


def load_documents(path: Path, text: str | None = None) -> list[Any]:
    """All YAML documents of a file (round-trip types, which carry line numbers), read as
    kubectl reads them (api/yamlread.py)."""
    if text is None:
        text = read_text(path)
    try:
        return load_all(text)
    except DepthError as exc:
        raise UnreadableFile(f"{path}: cannot be read as Kubernetes YAML: {exc}") from None
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if "duplicate key" in str(problem):
            problem = f"{problem} (kubectl would silently keep the last one; Headroom refuses it so nothing is lost)"
        raise UnreadableFile(f"{where}: not valid YAML: {problem}") from None


def objects(docs: list[Any]) -> Iterator[Any]:
    """Documents, with `kind: List` (what `kubectl get -o yaml` prints) expanded."""
    for doc in docs:
        if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
            items = doc.get("items") or ()
            yield from (i for i in (items if isinstance(items, list) else [items]) if i is not None)
        else:
            yield doc


def _position(root: Any, loc: tuple[Any, ...]) -> tuple[int, int]:
    """Line and column (1-based) of the deepest part of `loc` present in the document."""
    node, pos = root, (getattr(root, "lc", None) and (root.lc.line, root.lc.col)) or (0, 0)
    for part in loc:
        try:
            if isinstance(node, CommentedMap) and part in node:
                pos = node.lc.key(part)
                node = node[part]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
                pos = node.lc.item(part)
                node = node[part]
            else:
                break
        except (KeyError, IndexError, TypeError):  # a key brought in by a `<<` merge has no position of its own
            node = node[part] if isinstance(node, dict) and part in node else node
            continue
    return pos[0] + 1, pos[1] + 1


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that sits at `loc` below `model`, unwrapping Optional and lists."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = next((f for n, f in current.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return None
        current = _unwrap(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    while True:
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = args[0] if len(args) == 1 else tp
            if len(args) != 1:
                return tp
        elif origin in (list, typing.Annotated):
            tp = typing.get_args(tp)[0]
        else:
            return tp


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or "(" in str(part):
            continue  # pydantic's union/validator tags are not part of the document
        else:
            out += ("." if out else "") + str(part)
    return out or "(object)"


def _message(err: Any, model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        allowed = sorted((f.alias or n) for n, f in parent.model_fields.items()) if parent else []
        return f"unknown field {loc[-1]!r}; allowed here: {', '.join(allowed)}"
    if kind == "missing":
        return "required field is missing"
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        return msg[len("Value error, ") :]
    value = err.get("input")
    if isinstance(value, (str, int, float, bool)):
        return f"{msg} (got {value!r})"
    return msg


def validate_object(obj: Any, file: str) -> list[Problem]:
    """Problems of one document; an empty list when it is valid or not one of our objects.

    The verdict is the API server's (api/schema.py: the generated CRD's schema and CEL
    rules); then the controller's own loader must accept what the server stores — a
    disagreement there is a bug, reported as such rather than hidden."""
    if not isinstance(obj, dict):
        line, col = _position(obj, ())
        return [Problem(file, line, col, "(document)", "(object)", "is not a mapping; expected a Kubernetes object")]
    api_version = str(obj.get("apiVersion") or "")
    kind = obj.get("kind")
    if not isinstance(kind, str):
        if not api_version.startswith(f"{keys.GROUP}/"):
            return []  # not ours to judge
        line, col = _position(obj, ("kind",))
        return [
            Problem(
                file, line, col, "(object)", "kind",
                f"must be the string {' or '.join(KINDS)}, not {'a list' if isinstance(kind, list) else 'a map' if isinstance(kind, dict) else repr(kind)}",
            )
        ]  # fmt: skip
    if not api_version.startswith(f"{keys.GROUP}/") and kind not in KINDS:
        return []  # not ours to judge
    meta = obj.get("metadata")
    label = f"{obj.get('kind')}/{meta.get('name', '?') if isinstance(meta, dict) else '?'}"
    found, stored = check(obj)
    problems = []
    for loc, message in found:
        line, col = _position(obj, loc)
        problems.append(Problem(file, line, col, label, _path(loc), message))
    if problems:
        return problems
    try:
        KINDS[str(obj["kind"])].model_validate(stored)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        line, col = _position(obj, loc)
        return [
            Problem(
                file, line, col, label, _path(loc),
                f"the API server would store this, but the controller cannot read it ({err['msg']}); "
                "please report it as a Headroom bug",
            )
        ]  # fmt: skip
    return []


def validate_file(path: Path, valid: list[tuple[str, Any]] | None = None) -> tuple[int, list[Problem]]:
    """(number of HeadroomConfig/NodePoolProfile objects checked, problems); each object
    that is valid on its own is appended to `valid` as (file, object)."""
    docs = load_documents(path)
    checked, problems = 0, []
    for obj in objects(docs):
        ours = isinstance(obj, dict) and isinstance(obj.get("kind"), str) and obj["kind"] in KINDS
        checked += ours
        found = validate_object(obj, str(path))
        problems.extend(found)
        if not found and valid is not None and ours:
            valid.append((str(path), obj))
    return checked, problems


def merge_problems(valid: list[tuple[str, Any]], live_configs: list[Any] | None = None) -> list[Problem]:
    """Profiles valid alone but not once merged with the HeadroomConfig: the one among the
    files, else the live one (`--live`), else the defaults. The controller's own rule
    (api/resolve.py) decides; such a profile would be frozen on the cluster."""
    configs = [o for _, o in valid if o.get("kind") == keys.CONFIG_KIND]
    if not configs:
        configs = live_configs or [
            {"apiVersion": keys.API_VERSION, "kind": keys.CONFIG_KIND, "metadata": {"name": keys.SINGLETON_NAME}}
        ]
    profiles = [(f, o) for f, o in valid if o.get("kind") == keys.PROFILE_KIND]
    res = resolve(configs, [o for _, o in profiles])
    out = []
    for file, obj in profiles:
        name = str((obj.get("metadata") or {}).get("name"))
        exc = res.merge_problems.get(name)
        if exc is not None:
            line, col = _position(obj, tuple(exc.path.split(".")))
            out.append(Problem(file, line, col, f"{keys.PROFILE_KIND}/{name}", exc.path, exc.detail))
    return out


def tie_warnings(valid: list[tuple[str, Any]], nodes: list[Any] | None = None) -> list[str]:
    """Profiles of the same priority that select the same nodes: the name that sorts first
    wins them, which is rarely what was meant. With `nodes` (`--live`), the nodes both
    select are counted; offline, only profiles with the very same selector are certain to
    meet. Warnings, not errors: the server accepts both."""
    from .models import NodePoolProfile, profile_from

    profiles = []
    for _, obj in valid:
        if obj.get("kind") == keys.PROFILE_KIND:
            try:
                profiles.append(profile_from(NodePoolProfile.model_validate(obj)))
            except (ValidationError, ValueError):
                continue
    out = []
    for i, a in enumerate(profiles):
        for b in profiles[i + 1 :]:
            if a.priority != b.priority or a.name == b.name:
                continue
            first, second = sorted((a.name, b.name))
            if nodes is not None:
                both = sum(1 for labels in nodes if a.node_selector.matches(labels) and b.node_selector.matches(labels))
                if not both:
                    continue
                where = f"both select {both} node(s) of the cluster"
            elif a.node_selector == b.node_selector:
                where = "have the same nodeSelector"
            else:
                continue
            out.append(
                f"warning: NodePoolProfile/{first} and NodePoolProfile/{second} {where} at priority {a.priority}: "
                f"{first} wins them only because its name sorts first; give the one that should win a higher "
                "spec.priority"
            )
    return out
