"""Read YAML the way kubectl does, keeping line numbers for error messages.

kubectl (and Argo CD, Flux and Helm) turn YAML into JSON with sigs.k8s.io/yaml, whose
scalar rules are YAML 1.1's as go-yaml v2 implements them, not YAML 1.2's. ruamel.yaml
(which keeps every key's position) reads the structure; every *plain* scalar is then
resolved by these rules, and quoted ones stay strings:

- `true/false` in any of `y Y yes Yes YES on On ON true True TRUE` and the matching
  `n N no No NO off Off OFF false False FALSE` spellings are booleans;
- `~`, `null`, `Null`, `NULL` and the empty value are null;
- integers as Go's `strconv.ParseInt(s, 0, 64)` reads them after `_` is removed:
  `0750` is octal (488), `0x1F` hex, `0b101` and `0o17` too, with an optional sign;
- floats matching `[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?` (`1e3`, `08`,
  `1.0`), and `.inf`, `-.inf`, `.nan`;
- then, as the JSON step does, a float that is a whole number within int64 is an integer
  (`priority: 1.0` is `1`, `minBurstFloor: 1e3` is `1000`);
- `.inf` and `.nan` have no JSON form: kubectl refuses such a file, and so does this;
- map keys become strings (`yes:` is the key `"true"`), and `<<` merge keys and anchors
  work as in YAML 1.1.

The one deliberate difference: a duplicate key is an error here, where kubectl keeps the
last value silently. Nesting deeper than MAX_DEPTH is refused, and so is a document whose
aliases expand it past go-yaml's aliasing bound (an "alias bomb").
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.compat import ordereddict
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.resolver import VersionedResolver
from ruamel.yaml.scalarstring import ScalarString
from ruamel.yaml.tag import Tag

MAX_DEPTH = 100
MAX_EXPANDED = 4_000_000  # values a document may hold once its aliases are expanded

_TRUE = {"y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE"}
_FALSE = {"n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE"}
_NULL = {"~", "null", "Null", "NULL", ""}
_INF = {".inf": math.inf, ".Inf": math.inf, ".INF": math.inf, "+.inf": math.inf, "+.Inf": math.inf}
_INF |= {"+.INF": math.inf, "-.inf": -math.inf, "-.Inf": -math.inf, "-.INF": -math.inf}
_NAN = {".nan", ".NaN", ".NAN"}
_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_GO_INT = re.compile(r"^[-+]?(0[xX][0-9a-fA-F]+|0[oO]?[0-7]*|0[bB][01]+|[1-9][0-9]*)$")
_INT64 = (-(2**63), 2**63 - 1)


class PlainResolver(VersionedResolver):
    """Every plain scalar is a string until `resolve_plain` reads it; only `<<` is special."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is ScalarNode and implicit[0]:
            return Tag(suffix="tag:yaml.org,2002:merge" if value == "<<" else "tag:yaml.org,2002:str")
        return super().resolve(kind, value, implicit)


def _go_int(text: str) -> int | None:
    """strconv.ParseInt(text, 0, 64), or ParseUint; None when neither reads it."""
    if len(text) > 70 or not _GO_INT.match(text):  # 64 binary digits, a sign and a prefix at most
        return None
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    if body[:2] in ("0x", "0X"):
        value = int(body[2:], 16)
    elif body[:2] in ("0o", "0O"):
        value = int(body[2:], 8) if len(body) > 2 else 0
    elif body[:2] in ("0b", "0B"):
        value = int(body[2:], 2)
    elif body.startswith("0") and len(body) > 1:
        value = int(body[1:], 8)
    else:
        value = int(body)
    value *= sign
    if _INT64[0] <= value <= 2**64 - 1:
        return value
    return None


def resolve_plain(text: str) -> Any:
    """One plain scalar as go-yaml v2 reads it, then as JSON carries it."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    if text in _NULL:
        return None
    if text in _INF:
        return _INF[text]
    if text in _NAN:
        return math.nan
    if text[:1] in "+-.0123456789":
        plain = text.replace("_", "")
        as_int = _go_int(plain)
        if as_int is not None:
            return as_int
        if _FLOAT.match(plain):
            value = float(plain)
            if math.isinf(value):  # out of float64's range: Go's ParseFloat fails, go-yaml keeps the string
                return text
            if value.is_integer() and _INT64[0] <= value <= _INT64[1]:
                return int(value)
            return value
    return text


def _key(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _allowed_alias_ratio(decoded: int) -> float:
    """go-yaml's bound on aliasing (yaml.v2 decode.go, allowedAliasRatio), which the API
    server's and kubectl's YAML reader applies: 99 % of small documents may come through
    aliases, falling to 10 % of documents past 4 million nodes."""
    if decoded <= 400_000:
        return 0.99
    if decoded >= 4_000_000:
        return 0.10
    return 0.99 - 0.89 * (decoded - 400_000) / 3_600_000


def _refuse_equal_keys(node: CommentedMap, resolved: dict[Any, str]) -> None:
    """Two keys that are one after YAML 1.1 resolution (`on` and `true`, `1` and `0x1`)
    are a duplicate key, as two equal spellings are: refused, not merged."""
    first: dict[str, Any] = {}
    for k, new in resolved.items():
        if new not in first:
            first[new] = k
            continue

        def where(key: Any) -> str:
            try:
                return f" (line {node.lc.key(key)[0] + 1})"
            except (AttributeError, KeyError, TypeError):
                return ""

        raise DuplicateKey(
            f"duplicate key {new!r}: written {first[new]!r}{where(first[new])} and {k!r}{where(k)}, which YAML 1.1 "
            "reads as the same key (kubectl keeps the last silently); keep one"
        )


class _Walk:
    """Resolves a document once per node, and counts it as if every alias were expanded
    (what turning it into JSON would do), to refuse an alias bomb the way go-yaml does."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}  # id of a resolved container -> its expanded node count
        self.decoded = 0
        self.aliases = 0

    def check(self) -> None:
        if self.decoded > MAX_EXPANDED or (
            self.aliases > 100
            and self.decoded > 1000
            and self.aliases / self.decoded > _allowed_alias_ratio(self.decoded)
        ):
            raise DepthError(
                f"the document contains excessive aliasing (its anchors and aliases expand past {self.decoded:,} "
                "values); write the values out, or use fewer aliases"
            )

    def resolve(self, node: Any, depth: int) -> tuple[Any, int]:
        """The resolved node and its expanded size."""
        if depth > MAX_DEPTH:
            raise DepthError(f"nested more than {MAX_DEPTH} levels")
        if isinstance(node, CommentedMap | CommentedSeq):
            size = self.sizes.get(id(node))
            if size is not None:  # an alias of a node already resolved: counted, not walked again
                self.aliases += 1
                self.decoded += size
                self.check()
                return node, size
            size = 1
            self.decoded += 1
            if isinstance(node, CommentedMap):
                keys = list(node.keys())
                resolved = {k: _key(resolve_plain(k)) if type(k) is str else _key(k) for k in keys}
                _refuse_equal_keys(node, resolved)
                for k in keys:
                    v = node[k]
                    new_key = resolved[k]
                    value, n = self.resolve(v, depth + 1)
                    size += n
                    # The plain dict's own methods: a map that merges another (`<<`), or is
                    # merged into one, would otherwise pass the change on to the other map,
                    # where the old key may be missing (a KeyError) or must not change.
                    if new_key != k:
                        ordereddict.__delitem__(node, k)
                    ordereddict.__setitem__(node, new_key, value)
            else:
                for i, v in enumerate(node):
                    node[i], n = self.resolve(v, depth + 1)
                    size += n
            self.sizes[id(node)] = size
            self.check()
            return node, size
        self.decoded += 1
        if isinstance(node, TaggedScalar):
            return str(node.value), 1
        if isinstance(node, ScalarString):  # quoted, literal or folded: a string
            return str(node), 1
        if type(node) is str:
            node = resolve_plain(node)
        if isinstance(node, float) and not math.isfinite(node):
            raise DepthError(f"{node} has no JSON form: kubectl refuses the file (quote it if it is a string)")
        return node, 1


class DepthError(ValueError):
    """A document kubectl could not turn into JSON: nested too deeply, or holding `.inf`/`.nan`."""


class DuplicateKey(DepthError):
    """Two keys of one map that YAML 1.1 resolves to the same key."""


def load_all(text: str) -> list[Any]:
    """Every non-empty document of `text`, resolved as kubectl reads it. Raises ruamel's
    YAMLError (duplicate keys included) or DepthError."""
    yaml = YAML(typ="rt")
    yaml.Resolver = PlainResolver
    yaml.preserve_quotes = True
    yaml.allow_duplicate_keys = False
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * MAX_DEPTH + 200))
    try:
        docs = list(yaml.load_all(text))
    except RecursionError:
        raise DepthError(f"nested more than {MAX_DEPTH} levels") from None
    finally:
        sys.setrecursionlimit(limit)
    out = []
    for doc in docs:
        value, _ = _Walk().resolve(doc, 0)
        if value is not None:
            out.append(value)
    return out
