"""Shared field types of the API: quantities, durations, label selectors, exclusions."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from ..core.quantity import MAX_LENGTH, QuantityError, parse_quantity

# Non-negative Kubernetes quantity; the same grammar the CRD's `pattern` enforces, with the
# parser's bounds (core/quantity.py): an integer exponent of at most two digits, at most
# MAX_LENGTH characters, a value below 2^63 (a CEL rule on the CRD, a check here).
QUANTITY_PATTERN = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$"
QUANTITY_MAX_CEL = "9223372036854775807"
DURATION_PATTERN = r"^([0-9]{1,9}(\.[0-9]{1,9})?(ms|s|m|h)){1,4}$"
DURATION_MAX_LENGTH = 48
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class Model(BaseModel):
    """Base of every API type: camelCase on the wire, unknown fields rejected, and strict
    types (no "5" for 5, no "no" for false) so offline validation rejects what the API
    server rejects."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, validate_default=True, strict=True
    )


def _check_quantity(value: Any) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{value!r} is not a quantity; use an integer or a string such as '500m' or '1.5'")
    if isinstance(value, str) and (len(value) > MAX_LENGTH or not re.fullmatch(QUANTITY_PATTERN, value)):
        raise ValueError(
            f"{value[:70]!r} is not a quantity; use e.g. '500m', '2' or '1.5' "
            f"(no sign, an exponent of at most two digits, at most {MAX_LENGTH} characters)"
        )
    try:
        if parse_quantity(value) < 0:
            raise ValueError(f"{value!r} is negative; use 0 or more")
    except QuantityError as exc:  # too large: the CRD's CEL rule says the same
        raise ValueError(str(exc)) from None
    return value


Quantity = Annotated[
    Any,
    BeforeValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "maxLength": MAX_LENGTH,
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                {"rule": "type(self) == string || self >= 0", "message": "must not be negative"},
                {
                    "rule": f"type(self) != string || !isQuantity(self) || "
                    f"quantity(self).isLessThan(quantity('{QUANTITY_MAX_CEL}')) || "
                    f"quantity(self).compareTo(quantity('{QUANTITY_MAX_CEL}')) == 0",
                    "message": f"must be at most {QUANTITY_MAX_CEL} (2^63 - 1)",
                },
            ],
        }
    ),
]


def duration_seconds(text: str) -> float:
    """`2s`, `500ms`, `1m30s` → seconds (the subset of Go's time.ParseDuration we accept)."""
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))


def _go_duration(seconds: float) -> str:
    """A bound in the form CEL's duration() reads."""
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{int(seconds * 1000)}ms"


def duration(max_seconds: float, min_seconds: float = 0.0) -> Any:
    """A duration string bounded to [min_seconds, max_seconds]: the pattern bounds its
    length, a CEL rule (CEL's duration() is Go's time.ParseDuration) bounds its value,
    and the check below says the same offline."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or len(value) > DURATION_MAX_LENGTH or not re.fullmatch(DURATION_PATTERN, value):
            raise ValueError(
                f"{str(value)[:60]!r} is not a duration; use a string such as '2s', '500ms' or '1m30s' (units ms, s, m, h)"
            )
        seconds = duration_seconds(value)
        if not min_seconds <= seconds <= max_seconds:
            raise ValueError(
                f"{value!r} is out of range; use between {_go_duration(min_seconds)} and {_go_duration(max_seconds)}"
            )
        return value

    lo, hi = _go_duration(min_seconds), _go_duration(max_seconds)
    return Annotated[
        Any,
        BeforeValidator(check),
        WithJsonSchema(
            {
                "type": "string",
                "maxLength": DURATION_MAX_LENGTH,
                # The shape as a CEL rule rather than an OpenAPI `pattern`, so the server's
                # message can give an example instead of quoting the regular expression.
                "x-kubernetes-validations": [
                    {
                        "rule": f"self.matches(r'{DURATION_PATTERN}')",
                        "message": "must be a duration such as 2s, 500ms or 1m30s (units ms, s, m, h)",
                    },
                    {
                        "rule": f"!self.matches(r'{DURATION_PATTERN}') || "
                        f"(duration(self) >= duration('{lo}') && duration(self) <= duration('{hi}'))",
                        "message": f"must be between {lo} and {hi}",
                    },
                ],
            }
        ),
    ]


def _selector_values_ok(req: LabelSelectorRequirement) -> LabelSelectorRequirement:
    if req.operator in ("In", "NotIn") and not req.values:
        raise ValueError(f"operator {req.operator} needs a non-empty 'values' list")
    if req.operator in ("Exists", "DoesNotExist") and req.values:
        raise ValueError(f"operator {req.operator} takes no 'values'; remove them")
    return req


class LabelSelectorRequirement(Model):
    """One label requirement, as in metav1.LabelSelectorRequirement."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) "
                    ": (!has(self.values) || size(self.values) == 0)",
                    "message": "In and NotIn need a non-empty values list; Exists and DoesNotExist take no values",
                }
            ]
        }
    )
    key: str = Field(min_length=1, description="The label key the requirement applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the key relates to the values: In, NotIn, Exists or DoesNotExist."
    )
    values: list[str] | None = Field(
        default=None,
        description="Values for In and NotIn (non-empty); must be empty for Exists and DoesNotExist.",
    )


CheckedRequirement = Annotated[LabelSelectorRequirement, AfterValidator(_selector_values_ok)]


class LabelSelector(Model):
    """A label query, as in metav1.LabelSelector; all requirements are ANDed."""

    match_labels: dict[str, str] | None = Field(
        default=None, description="Exact label key/value pairs that must all be present."
    )
    match_expressions: list[CheckedRequirement] | None = Field(
        default=None, description="Set-based requirements that must all hold."
    )

    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


class Exclusions(Model):
    """What Headroom never manages. In a NodePoolProfile these add to the global ones."""

    namespaces: list[str] | None = Field(default=None, description="Namespaces whose pods are never managed.")
    pod_selector: LabelSelector | None = Field(
        default=None, description="Pods whose labels match this selector are never managed."
    )
    owner_kinds: list[str] | None = Field(
        default=None,
        description="Kinds of a pod's controller ownerReference (e.g. Job, DaemonSet) whose pods are never managed.",
    )
    containers: list[str] | None = Field(
        default=None,
        description="Container names (e.g. istio-proxy) that never get a computed limit; "
        "they keep their limit and still count in the node's booking.",
    )
    node_selector: LabelSelector | None = Field(
        default=None,
        description="Nodes where nothing is managed, e.g. nodes with the static CPU manager policy.",
    )


class GlobalExclusions(Exclusions):
    """What Headroom never manages, cluster-wide. Setting other fields keeps kube-system out."""

    namespaces: list[str] | None = Field(
        default=["kube-system"],
        description="Namespaces whose pods are never managed. Defaults to [kube-system]; "
        "set [] to manage kube-system too.",
    )
