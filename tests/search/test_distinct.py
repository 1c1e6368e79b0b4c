"""planner.search.layout.distinct: pandas.factorize's coding with numpy alone -- sorted below
HASHED_VALUES values, hashed from there on (its own hash table, collisions resolved exactly)
-- so that no plan imports pandas for it."""

import sys

import numpy as np
import pandas as pd
import pytest

from planner.search import layout
from planner.search.layout import distinct, unique_rows


def factorized(values):
    """What distinct returned when it was pandas.factorize: first occurrences, codes."""
    codes, uniques = pd.factorize(np.asarray(values))
    first = np.empty(len(uniques), dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    return first, codes.astype(np.int64)


RNG = np.random.default_rng(24)
CASES = {
    "narrow ints": RNG.integers(0, 5, 1000),
    "wide ints": RNG.integers(-2**62, 2**62, 5000),
    "few wide ints": RNG.choice([2**62, -2**62, 0, 7], 1000),
    "shifted ints": RNG.integers(-3, 3, 50) << 40,
    "uint8": RNG.integers(0, 50, 300).astype(np.uint8),
    "bool": RNG.integers(0, 2, 100).astype(bool),
    "floats with signed zeros": RNG.choice([0.5, 0.25, -0.0, 0.0, 1e12], 1000),
    "distinct floats": RNG.random(1000),
    "infinities": RNG.choice([3.0, np.inf, -np.inf], 100),
    "complex": RNG.choice([1.0, 2.0], 200) + 1j * RNG.choice([3.0, -0.0, 0.0], 200),
    "bytes + code": RNG.integers(0, 3000, 4000) * 1e6 + 1j * RNG.integers(0, 9, 4000),
    "strings": np.array(["b", "a", "b", "c", "a"]),
    "one": np.array([7.5]),
    "none": np.zeros(0, dtype=np.int64),
}


@pytest.mark.parametrize("hashed", [False, True], ids=["numpy", "hashed"])
@pytest.mark.parametrize("name", list(CASES))
def test_distinct_codes_as_pandas_factorize(monkeypatch, name, hashed):
    monkeypatch.setattr(layout, "_hashed", lambda count: hashed)
    values = CASES[name]
    first, inverse = distinct(values)
    want_first, want_inverse = factorized(values)
    np.testing.assert_array_equal(first, want_first)
    np.testing.assert_array_equal(inverse, want_inverse)
    assert first.dtype == inverse.dtype == np.int64


def test_unique_rows_in_order_of_appearance():
    n = 2000
    cols = {"tp": RNG.integers(0, 2**40, n) % 7, "a": RNG.integers(0, 2**40, n) % 5 * 2**40,
            "b": RNG.choice([0.1, 0.2, 0.3], n), "c": RNG.integers(0, 2**62, n) % 3 * 2**61}
    few, inverse = unique_rows(cols, ("tp", "a", "b", "c"))
    rows = list(zip(*(cols[name].tolist() for name in cols)))
    order = list(dict.fromkeys(rows))  # distinct rows in order of appearance
    assert list(zip(*(few[name].tolist() for name in cols))) == order
    assert [order[i] for i in inverse] == rows


@pytest.mark.parametrize("values", [np.array([3, 1, 3, 2, 1]), np.array([[2.5, -0.0], [0.0, 2.5]]),
                                    np.array([4]), np.array(7), np.zeros(0, dtype=np.int64)])
def test_sorted_distinct_is_np_unique(values):
    got = layout.sorted_distinct(values)
    np.testing.assert_array_equal(got, np.unique(values))
    assert got.dtype == values.dtype


def test_distinct_hashes_large_inputs_without_pandas(monkeypatch):
    assert not layout._hashed(layout.HASHED_VALUES - 1) and layout._hashed(layout.HASHED_VALUES)
    monkeypatch.delitem(sys.modules, "pandas")
    values = RNG.integers(0, 3000, 50_000) * 1e6 + 1j * RNG.integers(0, 9, 50_000)
    first, inverse = distinct(values)
    assert "pandas" not in sys.modules
    monkeypatch.setitem(sys.modules, "pandas", pd)
    want_first, want_inverse = factorized(values)
    np.testing.assert_array_equal(first, want_first)
    np.testing.assert_array_equal(inverse, want_inverse)


@pytest.mark.parametrize("distinct_values", [3, 1000, 60_000, 200_000])
def test_hashed_collisions_resolved_exactly(distinct_values):
    """About as many distinct values as rows fill the hash table's slots with several values
    each: the rows that miss their slot's first row are hashed again (and again), to the
    same coding."""
    rows = 200_000
    pool = RNG.random(distinct_values) * 1e15
    values = pool[RNG.integers(0, distinct_values, rows)]
    first, inverse = distinct(values)
    want_first, want_inverse = factorized(values)
    np.testing.assert_array_equal(first, want_first)
    np.testing.assert_array_equal(inverse, want_inverse)
    keys = layout._hash_keys(values)
    np.testing.assert_array_equal(layout._first_equal(keys), first[inverse])
    # the fallback past the last level of multipliers: the same answer
    np.testing.assert_array_equal(layout._first_equal(keys, level=99), first[inverse])


PAIRS = {
    "bytes + code": (RNG.integers(0, 3000, 50_000) * 1e6, RNG.integers(0, 9, 50_000) * 1.0),
    "signed zeros": (RNG.choice([-0.0, 0.0, 2.0], 8000), RNG.choice([-0.0, 0.0, 5.0], 8000)),
    "distinct": (RNG.random(20_000), RNG.random(20_000)),
    "infinite part": (RNG.choice([1.0, np.inf], 5000), RNG.choice([np.inf, 3.0, -np.inf], 5000)),
    "nan part": (RNG.choice([1.0, np.nan], 5000), RNG.choice([2.0, 3.0], 5000)),
    "few rows": (RNG.choice([1.0, 2.0], 100), RNG.choice([3.0, -0.0, 0.0], 100)),
    "none": (np.zeros(0), np.zeros(0)),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_distinct_pair_is_distinct_of_the_complex_numbers(name):
    """distinct_pair(a, b) hashes the two arrays without the complex array: the same coding
    as distinct(a + 1j * b), which the rollout choice and the rollout memory read before."""
    real, imag = PAIRS[name]
    first, inverse = layout.distinct_pair(real, imag)
    want_first, want_inverse = distinct(real + 1j * imag)
    np.testing.assert_array_equal(first, want_first)
    np.testing.assert_array_equal(inverse, want_inverse)
    assert first.dtype == inverse.dtype == np.int64


def test_unique_rows_with_kept_codes_is_unique_rows():
    """Codes kept across calls on the same columns (StepGroups' two training passes): the same
    rows and inverse as each call coding its fields itself."""
    n = 6000
    cols = {"tp": RNG.integers(0, 4, n), "a": RNG.integers(0, 2**40, n) % 5 * 2**40,
            "b": RNG.choice([0.1, 0.2, 0.3], n), "c": np.broadcast_to(np.int64(3), (n,)),
            "d": RNG.integers(0, 2**62, n) % 3 * 2**61}
    codes_of = {}
    for names in (("tp", "a", "b", "c"), ("tp", "b", "c", "d"), ("a", "d")):
        few, inverse = unique_rows(cols, names, codes_of)
        want_few, want_inverse = unique_rows(cols, names)
        np.testing.assert_array_equal(inverse, want_inverse)
        for name in cols:
            np.testing.assert_array_equal(few[name], want_few[name])
    assert codes_of["c"] is None and set(codes_of) == {"tp", "a", "b", "c", "d"}


def _hidden_fifth_value():
    values = RNG.choice([0.25, 0.5, 0.75, 1.0], 10_000)
    values[1] = 3.0  # one more value where the evenly spaced sample does not look
    return values


@pytest.mark.parametrize("values", [
    RNG.choice([0.0, 0.5, 1.0], 10_000),
    RNG.choice([0.0, -0.0, 0.5], 10_000),
    RNG.choice([0.1, 0.2, 0.3, 0.4], 10_000),
    _hidden_fifth_value(),
    RNG.random(10_000),
], ids=["three", "signed zeros", "four", "a fifth the sample misses", "many"])
def test_few_floats_are_found_by_comparison_as_hashing_finds_them(values):
    """A knob's few fractions (at most FEW_FLOATS) are coded by comparison, the same codes as
    hashing and pandas; more fall back to hashing."""
    first, inverse = distinct(values)
    want_first, want_inverse = factorized(values)
    np.testing.assert_array_equal(first, want_first)
    np.testing.assert_array_equal(inverse, want_inverse)
    assert first.dtype == inverse.dtype == np.int64
    found = layout._few_floats(values)
    assert (found is None) == (len(want_first) > layout.FEW_FLOATS)


@pytest.mark.parametrize("period", [1, 3, 12])
@pytest.mark.parametrize("name", ["bytes + code", "signed zeros", "distinct"])
def test_distinct_pair_beyond_repeats_is_the_same_coding(name, period):
    """Rows repeating the pair ``period`` rows before (a knob table read row by row) hashed
    once: the same first occurrences and codes, whatever the period."""
    real, imag = PAIRS[name]
    # runs of repeated blocks, as neighbouring core rows' knob tables
    block = np.repeat(np.arange(len(real) // (4 * period)), 4)
    at = (block[:, None] * period + np.arange(period)).reshape(-1)
    for values in ((real, imag), (real[at], imag[at])):
        first, inverse = layout.distinct_pair(*values, period=period)
        want_first, want_inverse = distinct(values[0] + 1j * values[1])
        np.testing.assert_array_equal(first, want_first)
        np.testing.assert_array_equal(inverse, want_inverse)
        assert first.dtype == inverse.dtype == np.int64
