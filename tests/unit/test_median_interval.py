"""stats.median_interval: the order-statistic interval of the median keeps its promise."""

import math

import numpy as np
import pytest

from xbench import stats


def exact_coverage(n: int, k: int) -> float:
    """P(X(k) <= median <= X(n+1-k)) for continuous data: 1 - 2 P(Binomial(n, 1/2) <= k-1)."""
    return 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2**n


@pytest.mark.parametrize("n", [6, 10, 25])
def test_it_covers_the_median_of_a_skewed_distribution_as_often_as_promised(n):
    rng = np.random.default_rng(n)
    trials = 2000
    samples = rng.exponential(size=(trials, n))  # skewed: its median ln 2 is not its mean 1
    intervals = [stats.median_interval(s) for s in samples]
    assert all(i is not None for i in intervals)
    covered = np.mean([lo <= math.log(2) <= hi for lo, hi in intervals])
    low_rank = int(np.searchsorted(np.sort(samples[0]), intervals[0][0])) + 1
    promised = exact_coverage(n, low_rank)
    se = math.sqrt(promised * (1 - promised) / trials)
    assert promised >= 0.95 and abs(covered - promised) < 4 * se


def test_ties_only_make_it_wider():
    rng = np.random.default_rng(1)
    samples = rng.integers(0, 4, size=(2000, 10)).astype(float)  # median of {0, 1, 2, 3}: 1.5
    covered = np.mean([lo <= 1.5 <= hi for lo, hi in map(stats.median_interval, samples)])
    assert covered >= 0.95


def test_the_ranks_of_the_textbook_interval():
    # n = 100 at 95%: the 40th and 61st smallest values
    assert stats.median_interval(np.arange(1.0, 101.0)) == (40.0, 61.0)
    assert stats.median_interval([5.0, 1.0, 3.0, 2.0, 4.0, 6.0]) == (1.0, 6.0)  # order does not matter


def test_too_few_values_have_no_interval():
    assert stats.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # (min, max) covers 93.75% < 95%
    assert stats.median_interval([]) is None
    assert stats.median_interval([1.0, 2.0, 3.0, 4.0, 5.0], confidence=0.9) == (1.0, 5.0)


def test_confidence_must_be_a_probability():
    with pytest.raises(ValueError):
        stats.median_interval([1.0] * 10, confidence=95)
