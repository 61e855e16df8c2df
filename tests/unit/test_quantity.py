"""The hand-written quantity parser against the client's `parse_quantity` (the reference)."""

from decimal import ROUND_CEILING

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as reference

from headroom.core.quantity import MAX_VALUE, QuantityError, cpu_milli, format_milli, parse_quantity, whole_units

SUFFIXES = ["", "m", "n", "u", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "e3", "E-2", "e+1"]


@pytest.mark.parametrize(
    "text,milli",
    [
        ("500m", 500),
        ("2", 2000),
        ("1.5", 1500),
        ("0.1", 100),
        ("100u", 1),
        ("1n", 1),
        ("1e3", 1_000_000),
        ("1k", 1_000_000),
        (".5", 500),
        ("1500m", 1500),
        (3, 3000),
        (0.25, 250),
    ],
)
def test_cpu_millicores(text, milli):
    assert cpu_milli(text) == milli


@given(
    st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False, allow_infinity=False),
    st.sampled_from(SUFFIXES),
)
def test_agrees_with_kubernetes_client(number, suffix):
    text = f"{number}{suffix}"
    if reference(text) > MAX_VALUE:  # beyond int64: refused, never an overflow further on
        with pytest.raises(QuantityError, match="too large"):
            parse_quantity(text)
        return
    assert parse_quantity(text) == reference(text)
    expected_milli = int((reference(text) * 1000).to_integral_value(rounding=ROUND_CEILING))
    assert cpu_milli(text) == expected_milli
    assert whole_units(text) == int(reference(text).to_integral_value(rounding=ROUND_CEILING))


@pytest.mark.parametrize("bad", ["lots", "1 core", "", "1.2.3", "5mm", "--1", True, None, [1]])
def test_rejects_what_is_not_a_quantity(bad):
    with pytest.raises(QuantityError, match="not a quantity"):
        cpu_milli(bad)


@pytest.mark.parametrize("milli,text", [(1500, "1500m"), (2000, "2"), (10, "10m"), (0, "0")])
def test_format_round_trips(milli, text):
    assert format_milli(milli) == text
    assert cpu_milli(text) == milli


@pytest.mark.parametrize(
    "hostile",
    [
        "1e999999",
        "1e9999999",
        "9" * 70,
        "1e100",
        "9223372036854775808",
        "9Ei",
        "²m",
        "١٢m",
        "1e1.5",
        float("inf"),
        10**30,
    ],
)
def test_hostile_quantities_are_refused_not_raised(hostile):
    """Bounded where parsed: too long, too large an exponent or value, non-ASCII digits."""
    with pytest.raises(QuantityError):
        cpu_milli(hostile)
    with pytest.raises(QuantityError):
        whole_units(hostile)


def test_largest_int64_quantity_parses():
    assert whole_units("9223372036854775807") == 2**63 - 1
    assert cpu_milli("99e2") == 9_900_000
