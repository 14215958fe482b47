import numpy as np
import pytest

from xbench import stats


def test_modified_z_score_flags_a_far_value():
    values = [100, 101, 99, 100, 102, 98, 100, 160]
    kept, removed = stats.remove_outliers(values)
    assert removed == 1 and 160 not in kept


def test_modified_z_score_formula():
    x = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    # median 3, MAD = median(|x-3|) = median(2,1,0,1,97) = 1
    np.testing.assert_allclose(stats.modified_z_scores(x), 0.6745 * (x - 3) / 1)


def test_constant_sample_has_no_outliers():
    kept, removed = stats.remove_outliers([5.0] * 6)
    assert removed == 0 and len(kept) == 6


def test_zero_mad_falls_back_to_mean_absolute_deviation():
    kept, removed = stats.remove_outliers([5.0] * 6 + [50.0])
    assert removed == 1


def test_t_interval_matches_textbook_value():
    low, high = stats.t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3, s = 1.5811, t(0.975, 4) = 2.7764 -> half width 1.9632
    assert low == pytest.approx(3 - 1.9632, abs=1e-3) and high == pytest.approx(3 + 1.9632, abs=1e-3)


def test_t_interval_needs_two_values():
    with pytest.raises(ValueError):
        stats.t_interval([1.0])


def test_95_percent_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(1234)
    trials, true_mean = 4000, 10.0
    hits = 0
    for _ in range(trials):
        low, high = stats.t_interval(rng.normal(true_mean, 2.0, size=8))
        hits += low <= true_mean <= high
    coverage = hits / trials
    # Binomial sd at 4000 trials is 0.0034; allow about 4 sd.
    assert 0.936 <= coverage <= 0.964, coverage


def test_welch_detects_a_real_difference_and_not_a_fake_one():
    rng = np.random.default_rng(7)
    a = rng.normal(100, 2, 30)
    assert stats.welch_p_value(a, rng.normal(103, 2, 30)) < 0.001
    false_alarms = sum(stats.welch_p_value(rng.normal(100, 2, 20), rng.normal(100, 2, 20)) < 0.05
                       for _ in range(1000))
    assert 25 <= false_alarms <= 80  # about 5 %


def test_welch_on_constant_samples():
    assert stats.welch_p_value([1, 1, 1], [1, 1, 1]) == 1.0
    assert stats.welch_p_value([1, 1, 1], [2, 2, 2]) == 0.0


def test_scaling_speedup_and_efficiency():
    s = stats.scaling(multi=[180, 182, 178], single=[100, 101, 99], devices=2)
    assert s.speedup == pytest.approx(1.8) and s.efficiency == pytest.approx(0.9)
    assert s.significant


def test_summarize_reports_removed_count():
    summary = stats.summarize([10, 10.1, 9.9, 10.05, 9.95, 30])
    assert summary.removed == 1 and summary.n == 5
    assert summary.ci_low < summary.mean < summary.ci_high
