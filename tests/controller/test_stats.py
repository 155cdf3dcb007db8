"""The one percentile definition (controller.stats): linear between closest ranks (type 7)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.stats import percentile, percentiles


@pytest.mark.parametrize(("values", "p", "expected"), [
    ([7.0], 0, 7.0), ([7.0], 50, 7.0), ([7.0], 99, 7.0), ([7.0], 100, 7.0),  # n = 1
    ([1.0, 3.0], 0, 1.0), ([1.0, 3.0], 50, 2.0),  # n = 2: the midpoint at p50
    ([1.0, 3.0], 99, 2.98), ([1.0, 3.0], 100, 3.0),
    ([5.0, 1.0, 4.0, 2.0, 3.0], 0, 1.0), ([5.0, 1.0, 4.0, 2.0, 3.0], 50, 3.0),  # n = 5, odd
    ([5.0, 1.0, 4.0, 2.0, 3.0], 25, 2.0),  # h = 1: a rank, no interpolation
    ([5.0, 1.0, 4.0, 2.0, 3.0], 99, 4.96),  # h = 3.96: 0.96 of the way from 4 to 5
    ([5.0, 1.0, 4.0, 2.0, 3.0], 100, 5.0),
    ([10.0, 20.0, 30.0, 40.0], 50, 25.0),  # n = 4, even: the mean of the two middle values
    ([10.0, 20.0, 30.0, 40.0], 10, 13.0),  # h = 0.3
    ([10.0, 20.0, 30.0, 40.0], 99, 39.7),  # h = 2.97
])
def test_linear_between_closest_ranks(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == pytest.approx(expected, abs=1e-12)


def test_other_definitions_would_give_other_figures() -> None:
    """The cases above tell type 7 from the definitions it replaced: nearest rank (p50 of
    [1, 3] = 1), upper median (= 3), floor index (p99 of 5 values = 5)."""
    assert percentile([1.0, 3.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 99) < 5.0


def test_empty_input_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="percentile of no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="percentile of no values"):
        percentiles(iter(()), [50, 99])


@pytest.mark.parametrize("p", [-1, 100.5, float("nan")])
def test_p_outside_0_100_is_refused(p: float) -> None:
    with pytest.raises(ValueError, match=r"outside 0\.\.100"):
        percentile([1.0, 2.0], p)


def test_nan_values_are_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        percentile([1.0, float("nan")], 50)


def test_percentiles_sorts_once_and_agrees_with_percentile() -> None:
    values = [3.0, 9.0, 1.0, 4.0]
    assert percentiles(values, [0, 50, 90, 100]) == [percentile(values, p)
                                                     for p in (0, 50, 90, 100)]
    assert values == [3.0, 9.0, 1.0, 4.0]  # the input is not sorted in place


finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)
#: measured times: none so small that doubling it leaves the normal floats' exact range
times = finite.filter(lambda v: v == 0.0 or abs(v) > 1e-9)


@given(st.lists(finite, min_size=1, max_size=40), st.floats(min_value=0, max_value=100))
def test_agrees_with_numpy_linear_and_stays_within_the_samples(values: list[float],
                                                                p: float) -> None:
    got = percentile(values, p)
    assert got == pytest.approx(float(np.percentile(values, p)), rel=1e-9, abs=1e-6)
    assert min(values) <= got <= max(values)


@given(st.lists(finite, min_size=1, max_size=40))
def test_p50_is_statistics_median(values: list[float]) -> None:
    assert percentile(values, 50) == pytest.approx(statistics.median(values), rel=1e-12,
                                                   abs=1e-6)


@given(st.lists(times, min_size=1, max_size=40), st.floats(min_value=0, max_value=100))
def test_doubling_the_values_doubles_it_exactly(values: list[float], p: float) -> None:
    """Wall-time and model-time figures differ by the dilation factor alone."""
    assert percentile([2 * v for v in values], p) == 2 * percentile(values, p)
