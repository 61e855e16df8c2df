"""Kubernetes resource quantities as exact numbers.

A hand-written parser rather than `kubernetes.utils.parse_quantity`: the core must not
import the client, and the watch path parses several quantities per pod event. The
client's function stays the reference in `tests/unit/test_quantity.py`, which checks that
both agree on every quantity the grammar allows.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

_GRAMMAR = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<bin>[KMGTPE]i)|(?P<dec>[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]+))?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_EXP = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message says what is allowed."""


def parse_quantity(value: object) -> Decimal:
    """Parse `500m`, `1.5`, `2`, `128Mi`, `1e3` (or an int/float) into an exact Decimal."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity; use a number or a string like '500m'")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity; use a number or a string like '500m'")
    m = _GRAMMAR.match(value.strip())
    if m is None:
        raise QuantityError(
            f"{value!r} is not a quantity; use a number with an optional suffix "
            "(m, k, M, G, Ki, Mi, Gi, ... or an exponent), e.g. '500m', '2', '1.5'"
        )
    try:
        number = Decimal(m["num"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"{value!r} is not a quantity") from exc
    if m["bin"]:
        return number * _BINARY[m["bin"]]
    if m["dec"]:
        return number.scaleb(_DECIMAL_EXP[m["dec"]])
    if m["exp"]:
        return number.scaleb(int(m["exp"]))
    return number


def _milli_fast(value: str) -> int | None:
    """The two spellings nearly every pod uses, without Decimal: `250m` and `2`."""
    if value.endswith("m") and value[:-1].isdigit():
        return int(value[:-1])
    if value.isdigit():
        return int(value) * 1000
    return None


def cpu_milli(value: object) -> int:
    """CPU quantity in whole millicores, rounded up like the API server's MilliValue()."""
    if isinstance(value, str):
        fast = _milli_fast(value)
        if fast is not None:
            return fast
    return int((parse_quantity(value) * 1000).to_integral_value(rounding=ROUND_CEILING))


def whole_units(value: object) -> int:
    """Any quantity (memory in bytes) rounded up to a whole number, like Value()."""
    if isinstance(value, str):
        if value.isdigit():
            return int(value)
        mult = _BINARY.get(value[-2:])
        if mult is not None and value[:-2].isdigit():  # the usual 256Mi / 1Gi
            return int(value[:-2]) * mult
    return int(parse_quantity(value).to_integral_value(rounding=ROUND_CEILING))


def format_milli(milli: int) -> str:
    """Millicores in the canonical form the API server writes back (`1500m`, `2`)."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
