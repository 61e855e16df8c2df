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

# Bounds that keep every parse cheap and every result usable as an int64 on the wire:
# a quantity is at most MAX_LENGTH characters, an exponent at most two digits, and the
# value below 2**63 (the largest the API server can hold as an integer). Beyond them the
# text is refused instead of reaching Decimal arithmetic that can overflow.
MAX_LENGTH = 64
MAX_EXPONENT = 99
MAX_VALUE = Decimal(2**63 - 1)


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message says what is allowed."""


def parse_quantity(value: object, *, bounded: bool = True) -> Decimal:
    """Parse `500m`, `1.5`, `2`, `128Mi`, `1e3` (or an int/float) into an exact Decimal.
    `bounded=False` lifts only the int64 value bound (length and exponent stay bounded), for
    judging a quantity as the API server's CEL `quantity()` does."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity; use a number or a string like '500m'")
    if isinstance(value, int):
        return _bounded(value, Decimal(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{value!r} is not a quantity; use a finite number")
        return _bounded(value, Decimal(repr(value)))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity; use a number or a string like '500m'")
    if len(value) > MAX_LENGTH:
        raise QuantityError(f"{value[:20]!r}... is not a quantity: longer than {MAX_LENGTH} characters")
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
    if m["exp"] and abs(int(m["exp"])) > MAX_EXPONENT:
        raise QuantityError(f"{value!r} is not a quantity: the exponent is beyond ±{MAX_EXPONENT}")
    if m["bin"]:
        result = number * _BINARY[m["bin"]]
    elif m["dec"]:
        result = number.scaleb(_DECIMAL_EXP[m["dec"]])
    elif m["exp"]:
        result = number.scaleb(int(m["exp"]))
    else:
        result = number
    return _bounded(value, result) if bounded else result


def _bounded(value: object, result: Decimal) -> Decimal:
    if abs(result) > MAX_VALUE:
        raise QuantityError(f"{value!r} is too large a quantity: at most {MAX_VALUE} (2^63 - 1)")
    return result


def _milli_fast(value: str) -> int | None:
    """The two spellings nearly every pod uses, without Decimal: `250m` and `2`."""
    if not value.isascii():  # str.isdigit() also accepts '²' and other non-ASCII digits
        return None
    # Up to 15 digits cannot reach the int64 bound; longer ones take the checked path.
    if value.endswith("m") and value[:-1].isdigit() and len(value) <= 16:
        return int(value[:-1])
    if value.isdigit() and len(value) <= 15:
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
    if isinstance(value, str) and value.isascii():
        if value.isdigit() and len(value) <= 15:
            return int(value)
        mult = _BINARY.get(value[-2:])
        if mult is not None and value[:-2].isdigit() and len(value) <= 8:  # the usual 256Mi / 1Gi
            units = int(value[:-2]) * mult
            if units <= MAX_VALUE:
                return units
    return int(parse_quantity(value).to_integral_value(rounding=ROUND_CEILING))


def format_milli(milli: int) -> str:
    """Millicores in the canonical form the API server writes back (`1500m`, `2`)."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
