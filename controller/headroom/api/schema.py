"""The API server's verdict on a HeadroomConfig or NodePoolProfile, offline.

One schema, two engines: the generated CRD (crds.py, from the pydantic models) is what
the API server validates with, and this module validates with the same document, in the
order the server does:

1. `apiVersion`, `kind` and `metadata` as the apiserver checks any object (names, label
   and annotation keys and values, unknown metadata fields);
2. `null` where the schema has a default is dropped (the server prunes it and defaults);
   `null` elsewhere is refused (server-side apply refuses it);
3. defaults from the schema are filled in (structural defaulting);
4. the OpenAPI schema, with `jsonschema` (unknown fields refused, as with
   `fieldValidation=Strict`);
5. the CRD's CEL rules (`x-kubernetes-validations`), with `cel-python`, plus the
   Kubernetes CEL library functions the rules use (`isQuantity`, `quantity`), unless the
   schema found a *blocking* error — a wrong type, a value outside an enum, a missing
   required field, too long a string, too many items or properties — as the server does:
   then it adds one line saying the rules were not checked. Other schema errors (a
   minimum, a pattern) are reported together with the rules' own.

`status` is dropped first: the server ignores it on create (the status subresource).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import celpy
import jsonschema
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from ..core import keys
from ..core.quantity import QuantityError, parse_quantity
from . import crds

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_META_FIELDS = {
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
}
MAX_ANNOTATIONS = 256 * 1024


@functools.cache
def _schemas() -> dict[str, dict[str, Any]]:
    out = {}
    for crd in crds.definitions().values():
        kind = crd["spec"]["names"]["kind"]
        out[kind] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return out


def _qualified_name(key: str) -> str | None:
    """Why `key` is not a valid label or annotation key; None when it is."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "the prefix must be a DNS subdomain (lower case letters, digits, '-' and '.', at most 253)"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return "the name must be 63 characters or fewer, start and end with a letter or digit, with '-', '_' or '.' between"
    return None


def _metadata(obj: dict[str, Any]) -> Iterator[Problem]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        yield ("metadata",), "required object is missing"
        return
    for key in meta:
        if key not in _META_FIELDS:
            yield ("metadata", key), f"unknown field {key!r}"
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        yield ("metadata", "name"), "required field is missing"
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        yield (
            ("metadata", "name"),
            (
                f"{name!r} is not a valid name: lower case letters, digits, '-' and '.', starting and ending "
                "with a letter or digit, at most 253 characters"
            ),
        )
    for field, values in (("labels", True), ("annotations", False)):
        m = meta.get(field)
        if m is None:
            continue
        if not isinstance(m, dict):
            yield ("metadata", field), "must be a map of strings"
            continue
        for k, v in m.items():
            why = _qualified_name(str(k))
            if why:
                yield ("metadata", field, str(k)), f"invalid key: {why}"
            if not isinstance(v, str):
                yield ("metadata", field, str(k)), f"must be a string, not {type(v).__name__} (quote it)"
            elif values and (len(v) > 63 or not _LABEL_VALUE.match(v)):
                yield (
                    ("metadata", field, str(k)),
                    (
                        f"invalid value {v!r}: 63 characters or fewer, letters, digits, '-', '_' and '.', "
                        "starting and ending with a letter or digit"
                    ),
                )
        if field == "annotations" and sum(len(str(k)) + len(str(v)) for k, v in m.items()) > MAX_ANNOTATIONS:
            yield ("metadata", "annotations"), "the annotations exceed 256 KiB"


# --- nulls and defaults --------------------------------------------------------------


def _prune_and_default(value: Any, schema: dict[str, Any], loc: Loc, out: list[Problem]) -> Any:
    """A copy of `value` with nulls handled and defaults filled in, as the server does."""
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        result = {}
        for k, v in value.items():
            sub = props.get(k)
            if v is None and sub is not None:
                if "default" not in sub:
                    out.append(((*loc, k), "null is not allowed here (server-side apply refuses it); remove the field"))
                continue  # pruned; defaulted below when the schema has a default
            result[k] = _prune_and_default(v, sub, (*loc, k), out) if sub is not None else v
        for k, sub in props.items():
            if k not in result and "default" in sub:
                result[k] = _prune_and_default(_copy(sub["default"]), sub, (*loc, k), out)
        return result
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        sub = schema["additionalProperties"]
        return {k: _prune_and_default(v, sub, (*loc, k), out) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune_and_default(v, schema["items"], (*loc, i), out) for i, v in enumerate(value)]
    return value


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


# --- the OpenAPI schema ----------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """The CRD schema as jsonschema reads it: unknown fields refused where the server
    prunes (and, with Strict field validation, refuses) them."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if k != "x-kubernetes-validations"}
    pattern = out.get("pattern")
    if isinstance(pattern, str) and pattern.endswith("$") and not pattern.endswith("\\$"):
        # Go's `$` matches only at the very end; Python's also before a final newline.
        out["pattern"] = pattern[:-1] + r"\Z"
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


def _integral_bound(keyword: str) -> Any:
    """The server's `minimum`/`maximum` (go-openapi): an integral value is compared with the
    bound truncated to an integer, so `clientQPS: 0` passes `minimum: 0.1` there (and only
    the CEL rule refuses it), while `0.05` fails it."""
    draft4 = jsonschema.Draft4Validator.VALIDATORS[keyword]

    def check(validator: Any, bound: Any, instance: Any, schema: dict[str, Any]) -> Any:
        if isinstance(instance, int) and not isinstance(instance, bool) and isinstance(bound, float):
            bound = int(bound)
        yield from draft4(validator, bound, instance, schema)

    return check


# OpenAPI 3.0 is Draft 4 in these respects (boolean exclusiveMinimum).
_Draft4 = jsonschema.validators.extend(
    jsonschema.Draft4Validator, {"minimum": _integral_bound("minimum"), "maximum": _integral_bound("maximum")}
)


@functools.cache
def _validator(kind: str) -> jsonschema.protocols.Validator:
    return _Draft4(_strict(_schemas()[kind]))


def _schema_problems(kind: str, obj: dict[str, Any]) -> Iterator[Problem]:
    for err in sorted(_validator(kind).iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        loc = tuple(err.absolute_path)
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            for key in extra:
                props = sorted(err.schema.get("properties", {}))
                yield (
                    (*loc, key),
                    f"unknown field {key!r}{_did_you_mean(str(key), props)}; allowed here: {', '.join(props)}",
                )
            continue
        if err.validator == "required":
            for key in err.validator_value:
                if isinstance(err.instance, dict) and key not in err.instance:
                    yield (*loc, key), "required field is missing"
            continue
        if err.validator == "anyOf" and "x-kubernetes-int-or-string" in err.schema:
            yield loc, f"{err.instance!r} must be an integer or a string"
            continue
        yield loc, _message(err)


# The schema errors after which the API server does not evaluate the CEL rules (its
# field.ErrorTypes TypeInvalid, NotSupported, Required, TooLong and TooMany), and what it says.
_BLOCKING = frozenset({"type", "anyOf", "enum", "required", "maxLength", "maxItems", "maxProperties"})
NOT_CHECKED = (
    "some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)


def _blocks_cel(kind: str, obj: dict[str, Any]) -> bool:
    return any(err.validator in _BLOCKING for err in _validator(kind).iter_errors(obj))


def _unknown_only(schema: dict[str, Any], value: Any) -> Iterator[Problem]:
    for err in jsonschema.Draft4Validator(_strict(schema)).iter_errors(value):
        if err.validator == "additionalProperties":
            for key in sorted(set(err.instance) - set(err.schema.get("properties", {}))):
                yield (*tuple(err.absolute_path), key), f"unknown field {key!r}"


def _did_you_mean(key: str, allowed: list[str]) -> str:
    """`; did you mean 'maxMultiplier'?` for a near miss (a typo, another case, snake_case)."""
    folded = {a.lower().replace("_", ""): a for a in allowed}
    exact = folded.get(key.lower().replace("_", ""))
    close = [exact] if exact else difflib.get_close_matches(key, allowed, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _message(err: jsonschema.ValidationError) -> str:
    v = err.validator
    value = err.instance
    if v == "type":
        return f"{value!r} must be of type {err.validator_value}"
    if v == "enum":
        return f"{value!r} is not one of {', '.join(map(str, err.validator_value))}"
    if v == "minimum":
        op = ">" if err.schema.get("exclusiveMinimum") is True else ">="
        return f"{value!r} must be {op} {err.validator_value}"
    if v == "maximum":
        op = "<" if err.schema.get("exclusiveMaximum") is True else "<="
        return f"{value!r} must be {op} {err.validator_value}"
    if v == "pattern":
        return f"{value!r} does not match the pattern {err.validator_value}"
    if v == "maxLength":
        return f"longer than {err.validator_value} characters"
    if v == "minLength":
        return f"shorter than {err.validator_value} character(s)"
    if v == "required":
        return str(err.message).replace("is a required property", "is required")
    return str(err.message)


# --- CEL --------------------------------------------------------------------------------


class _Quantity:
    """Kubernetes CEL `quantity()` values: compared exactly."""

    def __init__(self, value: Decimal) -> None:
        self.value = value


def _is_quantity(s: Any) -> celtypes.BoolType:
    try:
        parse_quantity(str(s), bounded=False)
    except QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _quantity(s: Any) -> Any:
    return _Quantity(parse_quantity(str(s), bounded=False))


def _compare(a: _Quantity, b: _Quantity) -> celtypes.IntType:
    return celtypes.IntType((a.value > b.value) - (a.value < b.value))


_FUNCTIONS: dict[str, Any] = {
    "isQuantity": _is_quantity,
    "quantity": _quantity,
    "isLessThan": lambda a, b: celtypes.BoolType(a.value < b.value),
    "isGreaterThan": lambda a, b: celtypes.BoolType(a.value > b.value),
    "compareTo": _compare,
}


@functools.cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule), functions=_FUNCTIONS)


def _to_cel(value: Any, schema: dict[str, Any]) -> Any:
    """A JSON value as the API server hands it to CEL: by the schema's type (a `number`
    is a double even when written as 0)."""
    if value is None:
        return None
    t = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        return celtypes.StringType(value) if isinstance(value, str) else celtypes.IntType(value)
    if t == "number":
        return celtypes.DoubleType(float(value))
    if t == "integer":
        return celtypes.IntType(value)
    if t == "boolean":
        return celtypes.BoolType(value)
    if t == "string":
        return celtypes.StringType(value)
    if t == "array":
        return celtypes.ListType([_to_cel(v, schema.get("items") or {}) for v in value])
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else {}
        return celtypes.MapType(
            {celtypes.StringType(k): _to_cel(v, props.get(k, extra or {})) for k, v in value.items()}
        )
    return json_to_cel(value)


def _cel_problems(value: Any, schema: dict[str, Any], loc: Loc) -> Iterator[Problem]:
    if value is None:
        return
    for rule in schema.get("x-kubernetes-validations") or []:
        where = loc + tuple(p for p in str(rule.get("fieldPath", "")).split(".") if p)
        if rule["rule"].startswith("self.metadata.name =="):
            where = ("metadata", "name")  # the server cannot take a fieldPath into metadata; its message names it
        try:
            ok = _program(rule["rule"]).evaluate({"self": _to_cel(value, schema)})
        except (CELEvalError, TypeError, ValueError, QuantityError) as exc:
            yield where, f"{rule.get('message', rule['rule'])} (the rule could not be evaluated: {str(exc)[:100]})"
            continue
        if isinstance(ok, CELEvalError) or not bool(ok):
            yield where, str(rule.get("message") or f"failed rule: {rule['rule']}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for k, v in value.items():
            if k in props:
                yield from _cel_problems(v, props[k], (*loc, k))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            yield from _cel_problems(v, schema["items"], (*loc, i))


def _list_problems(value: Any, schema: dict[str, Any], loc: Loc) -> Iterator[Problem]:
    """What the server's list checks say: an item of an `x-kubernetes-list-type: map` list
    whose keys another item already has, or a repeated item of a `set` list, is a
    duplicate."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for k, v in value.items():
            if k in props:
                yield from _list_problems(v, props[k], (*loc, k))
        return
    if not isinstance(value, list) or not isinstance(schema.get("items"), dict):
        return
    kind, keys_ = schema.get("x-kubernetes-list-type"), schema.get("x-kubernetes-list-map-keys") or []
    seen: set[str] = set()
    for i, item in enumerate(value):
        if kind == "map" and isinstance(item, dict):
            key = json.dumps([item.get(k) for k in keys_], sort_keys=True)
            shown = ", ".join(f"{k}: {item.get(k)!r}" for k in keys_)
        elif kind == "set":
            key, shown = json.dumps(item, sort_keys=True), repr(item)
        else:
            key = None
        if key is not None:
            if key in seen:
                yield (*loc, i), f"duplicate value ({shown}): another item already has it; keep one"
            seen.add(key)
        yield from _list_problems(item, schema["items"], (*loc, i))


# --- the verdict --------------------------------------------------------------------------


def check(obj: dict[str, Any]) -> tuple[list[Problem], dict[str, Any]]:
    """(problems, the object as the server would store it: nulls pruned, defaults in)."""
    problems: list[Problem] = []
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if api_version != keys.API_VERSION:
        problems.append((("apiVersion",), f"{api_version!r} is not served; use {keys.API_VERSION}"))
    if kind not in _schemas():
        problems.append((("kind",), f"{kind!r} is not a kind of {keys.GROUP}; use HeadroomConfig or NodePoolProfile"))
    if problems:
        return problems, obj
    schema = _schemas()[str(kind)]
    # The server drops `status` on create, but strict decoding still refuses unknown fields in it.
    status = obj.get("status")
    if isinstance(status, dict):
        status_schema = {"type": "object", "properties": {"status": schema["properties"]["status"]}}
        for loc, message in _unknown_only(status_schema, {"status": status}):
            problems.append((loc, message))
    body = {k: v for k, v in obj.items() if k != "status"}
    problems.extend(_metadata(body))
    stored = _prune_and_default(body, schema, (), problems)
    found = [p for p in _schema_problems(str(kind), stored) if p[0][:1] != ("metadata",)]
    unknown = [p for p in problems + found if p[1].startswith("unknown field")]
    if unknown:  # strict field validation fails on these alone, before any other check
        return unknown, stored
    problems.extend(found)
    problems.extend(_list_problems(stored, schema, ()))
    if not _blocks_cel(str(kind), stored):
        problems.extend(_cel_problems(stored, schema, ()))
    elif found:
        problems.append(((), NOT_CHECKED))
    return problems, stored
