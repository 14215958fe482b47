"""The one statistical model behind every interval, speedup, verdict and diff:
calibrated by simulation, not just narrower."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xbench import stats


def _coverage(rng, configurations: int, replicates: int, sigmas, simulations: int = 600) -> tuple[float, float]:
    """Share of 95 % intervals that hold the true (geometric) mean 1, and their median half-width."""
    hits, total, halves = 0, 0, []
    for _ in range(simulations):
        sigma = sigmas(configurations)
        groups = [np.exp(rng.normal(0.0, s, replicates)) for s in sigma]
        for means, spread in zip(groups, stats.pooled_log_spreads(groups)):
            low, high = stats.log_interval(means, spread)
            hits += low <= 1 <= high
            total += 1
            halves.append((high - low) / 2)
    return hits / total, float(np.median(halves))


@pytest.mark.parametrize("configurations,replicates", [(8, 2), (8, 3), (4, 3), (16, 3)])
def test_pooled_intervals_cover_the_true_mean_95_percent_of_the_time(configurations, replicates):
    """Equal and unequal (2-10 %) between-process spreads: coverage 0.93-0.98 in every case
    (about ±0.01 at these simulation counts). How much narrower than each configuration alone:
    the next test."""
    rng = np.random.default_rng(configurations * 10 + replicates)
    equal, _ = _coverage(rng, configurations, replicates, lambda n: np.full(n, 0.05))
    unequal, half = _coverage(rng, configurations, replicates,
                              lambda n: np.exp(rng.uniform(math.log(0.02), math.log(0.10), n)))
    assert 0.93 <= equal <= 0.985, equal
    assert 0.925 <= unequal <= 0.985, unequal
    assert half < 0.12  # usable widths from 2-3 replicates


def test_pooled_intervals_are_far_narrower_than_each_configuration_alone():
    rng = np.random.default_rng(3)
    groups = [np.exp(rng.normal(0.0, 0.05, 2)) for _ in range(8)]
    pooled = [stats.log_interval(g, s) for g, s in zip(groups, stats.pooled_log_spreads(groups))]
    alone = [stats.replicated_summary([[m] for m in g]) for g in groups]
    assert np.mean([(h - lo) / 2 for lo, h in pooled]) * 3 < np.mean([a.ci_half_width for a in alone])


def test_equal_variances_pool_into_one_estimate_with_the_group_degrees_of_freedom():
    groups = [[100.0, 110.0], [200.0, 220.0], [50.0, 55.0], [10.0, 11.0]]
    spreads = stats.pooled_log_spreads(groups)
    assert all(s.df == 4 for s in spreads)
    assert all(s.var == pytest.approx(np.log(1.1) ** 2 / 2) for s in spreads)


def test_a_configuration_noisier_than_its_group_is_still_mostly_covered():
    """The floor at its own variance: 7 configurations at 3 %, one at 20 %, 6 replicates; that
    one is covered about 92 % of the time (shrinkage alone: 88 %)."""
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(400):
        groups = [np.exp(rng.normal(0, s, 6)) for s in [0.03] * 7 + [0.20]]
        low, high = stats.log_interval(groups[-1], stats.pooled_log_spreads(groups)[-1])
        hits += low <= 1 <= high
    assert hits / 400 >= 0.87


def test_one_very_noisy_configuration_keeps_most_of_its_own_spread():
    rng = np.random.default_rng(5)
    quiet = [np.exp(rng.normal(0, 0.01, 3)) for _ in range(7)]
    noisy = np.array([1.0, 1.4, 0.7])
    spreads = stats.pooled_log_spreads([*quiet, noisy])
    assert spreads[-1].var > 5 * max(s.var for s in spreads[:-1])


def test_a_single_replicate_borrows_the_group_spread_and_few_configurations_borrow_nothing():
    four = stats.pooled_log_spreads([[100.0, 103.0], [10.0, 10.2, 9.9], [7.0, 7.1], [42.0]])
    assert four[3].known and four[3].df <= 4
    two = stats.pooled_log_spreads([[100.0, 103.0], [10.0, 10.2, 9.9], [42.0]])
    assert (two[0].df, two[1].df) == (1, 2)  # under three configurations with a spread: each its own
    assert two[2].known  # the lone replicate takes their pooled spread
    none = stats.pooled_log_spreads([[1.0], [2.0]])
    assert not any(s.known for s in none)
    assert all(math.isnan(v) for v in stats.log_interval([1.0], none[0]))


def test_the_ratio_interval_and_its_test_agree_and_the_detectable_change_shrinks_with_replicates():
    spread = stats.LogSpread(0.03 ** 2, 20)
    a = np.exp(np.random.default_rng(1).normal(0, 0.03, 3))
    for b in (a * 1.02, a * 1.2, a * 0.8):
        r = stats.log_ratio(b, spread, a, spread)
        assert (r.p_value < 0.05) == (not r.ci_low <= 1 <= r.ci_high)
        assert r.ci_low < r.ratio < r.ci_high
    few = stats.log_ratio(a, spread, a, spread).detectable()
    many = stats.log_ratio(np.tile(a, 4), spread, np.tile(a, 4), spread).detectable()
    assert 0 < many < few < 0.2
    with_run = stats.log_ratio(a, spread, a, spread, run_var=0.05 ** 2)
    assert with_run.detectable() > few  # a run-level shift hides small changes


def test_a_run_level_variance_widens_the_interval_and_more_replicates_do_not_remove_it():
    spread = stats.LogSpread(0.02 ** 2, 30)
    low, high = stats.log_interval(np.ones(100), spread, run_var=0.05 ** 2)
    assert (high - low) / 2 > 0.09  # about 1.96 x 5 %, whatever the replicates


def test_a_known_run_level_term_is_not_multiplied_by_a_small_samples_t():
    # Two replicates (one degree of freedom, t = 12.7) that agree: the interval is the run-level
    # term's, at the normal quantile, not 12.7 times it; without that term, t(1) applies.
    spread = stats.LogSpread(1e-8, 1.0)
    low, high = stats.log_interval(np.ones(2), spread, run_var=0.03 ** 2)
    assert math.log(high) == pytest.approx(1.96 * 0.03, rel=0.01) and math.log(low) == pytest.approx(-1.96 * 0.03,
                                                                                                        rel=0.01)
    low, high = stats.log_interval(np.ones(2), spread)
    assert math.log(high) == pytest.approx(12.706 * math.sqrt(1e-8 / 2), rel=0.01)


def test_the_diff_floor_is_the_run_level_terms_alone():
    from xbench.results.diff import _floor

    few = stats.log_ratio(np.ones(2), stats.LogSpread(1e-4, 1.0), np.ones(2), stats.LogSpread(1e-4, 1.0))
    assert few.df < 3
    floor = _floor(few, 0.03 ** 2, 0.05)
    assert floor == pytest.approx(math.expm1((1.96 + 0.8416) * math.sqrt(2) * 0.03), rel=0.01)
