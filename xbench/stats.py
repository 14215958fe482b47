"""Statistics over repeated timing: pure functions, no state, no formatting.

A configuration is measured by R *replicates*, each a fresh worker process timing several
windows (one throughput value per window). The independent units are the processes, not the
windows: each process makes its kernel, autotuning and thread-placement choices once and all of
its windows share them, so windows of one process vary far less than processes do. Hence the
interval of a configuration's mean (`replicated_summary`) is a Student-t interval over the R
replicate means (df = R - 1), with windows as the inner level that only sharpens each
replicate's mean (Kalibera and Jones, "Rigorous Benchmarking in Reasonable Time", ISMM 2013).

The two levels are reported as variance components of a one-way random-effects model: the
pooled within-replicate variance of windows, the between-replicate variance left after the
window noise in the replicate means is subtracted, and the one-way ANOVA p-value that the
replicate means differ more than their windows explain.

Outliers are handled only at the window level, within each replicate, with the modified z-score
(Iglewicz and Hoaglin): windows of one process are exchangeable. Replicates are never screened:
with a handful of them no test can tell an outlier from the between-process variation that the
interval must cover.

The single-sample functions (`summarize`, `describe`, `t_interval`, `welch_p_value`) treat their
values as independent; `scaling` and `ratio_interval` compare two sets of independent values
(xbench passes replicate means, never the windows of one process) with Welch's test and a
delta-method interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Values = Sequence[float] | np.ndarray  # numbers, as a list or an array

OUTLIER_THRESHOLD = 3.5
CONFIDENCE = 0.95
SIGNIFICANCE = 0.05
UNSTABLE_P = 0.01  # ANOVA p below which replicates disagree beyond what windows explain
UNSTABLE_SPREAD = 0.05  # ... and the between-replicate spread (std of replicate means / mean) exceeds this
MIN_WINDOWS = 5  # adaptive stop never ends a replicate before this many windows

_NAN = float("nan")


def _t_quantile(confidence: float, df: float) -> float:
    """The two-sided Student-t critical value: scipy.stats.t.ppf(0.5 + confidence / 2, df)."""
    from scipy import special

    return float(special.stdtrit(df, 0.5 + confidence / 2))


@dataclass(frozen=True)
class Summary:
    """A sample after outlier removal: location, spread and a confidence interval of the mean."""

    n: int  # values kept
    removed: int  # outliers removed
    median: float
    mean: float
    std: float  # sample standard deviation (ddof=1)
    ci_low: float
    ci_high: float

    @property
    def ci_half_width(self) -> float:
        return (self.ci_high - self.ci_low) / 2


def modified_z_scores(values: Values) -> np.ndarray:
    """0.6745 * (x - median) / MAD; with MAD = 0 the mean absolute deviation stands in
    (scaled by 1.253314, its ratio to the standard deviation), and all-equal data scores 0."""
    x = np.asarray(values, dtype=float)
    deviations = x - np.median(x)
    mad = np.median(np.abs(deviations))
    if mad > 0:
        return 0.6745 * deviations / mad
    mean_ad = np.mean(np.abs(deviations))
    if mean_ad > 0:
        return deviations / (1.253314 * mean_ad)
    return np.zeros_like(x)


def remove_outliers(values: Values, threshold: float = OUTLIER_THRESHOLD) -> tuple[np.ndarray, int]:
    """The values whose |modified z-score| is at most `threshold`, and how many were dropped."""
    x = np.asarray(values, dtype=float)
    keep = np.abs(modified_z_scores(x)) <= threshold
    return x[keep], int(x.size - keep.sum())


def t_interval(values: Values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Two-sided Student-t confidence interval of the mean of independent values; needs two or
    more values."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        raise ValueError("a confidence interval needs at least two values")
    half = _t_quantile(confidence, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean() - half), float(x.mean() + half)


def summarize(values: Sequence[float], threshold: float = OUTLIER_THRESHOLD,
              confidence: float = CONFIDENCE) -> Summary:
    """Remove outliers, then describe what is left."""
    kept, removed = remove_outliers(values, threshold)
    return describe(kept, removed, confidence)


def describe(kept: Values, removed: int = 0, confidence: float = CONFIDENCE) -> Summary:
    """Location, spread and interval of values already cleaned of outliers. The interval treats
    the values as independent: right for replicate means, too narrow for windows of one process."""
    x = np.asarray(kept, dtype=float)
    low, high = t_interval(x, confidence)
    return Summary(n=int(x.size), removed=removed, median=float(np.median(x)),
                   mean=float(x.mean()), std=float(x.std(ddof=1)), ci_low=low, ci_high=high)


def enough_windows(values: Sequence[float], target: float, minimum: int = MIN_WINDOWS,
                   confidence: float = CONFIDENCE) -> bool:
    """True when there are at least `minimum` (and two) values and, after outlier removal, the t-interval
    half-width of their mean is at most `target` * |mean|. `target` <= 0 means never.

    For an adaptive stop of one replicate's windows: it bounds the window noise of that
    replicate's mean only, never the between-replicate variation."""
    if target <= 0 or len(values) < max(minimum, 2):
        return False
    kept, _ = remove_outliers(values)
    if kept.size < 2:
        return False
    low, high = t_interval(kept, confidence)
    return bool((high - low) / 2 <= target * abs(float(kept.mean())))


@dataclass(frozen=True)
class Replicated:
    """Two-level summary of one configuration: windows (inner level) within replicates
    (outer level: one fresh worker process each)."""

    replicates: int  # R, replicates with at least one kept window
    means: tuple[float, ...]  # each replicate's mean of its kept windows, in input order
    windows: int  # windows kept, all replicates
    removed: int  # windows dropped as outliers (within their own replicate)
    mean: float  # grand mean: the unweighted mean of replicate means
    median: float  # median of the replicate medians (for a representative step time)
    ci_low: float  # t-interval over replicate means, df = R-1; nan when R < 2
    ci_high: float
    between_var: float  # variance component between replicates, >= 0 (nan when R < 2)
    within_var: float  # pooled within-replicate variance of windows (nan when no replicate has 2 windows)
    anova_p: float  # one-way ANOVA F-test p: replicate means differ more than windows explain (nan when R < 2)
    spread: float  # sample std (ddof=1) of replicate means / mean (nan when R < 2)

    @property
    def ci_half_width(self) -> float:
        return (self.ci_high - self.ci_low) / 2

    @property
    def unstable(self) -> bool:
        """Replicates disagree beyond their window noise (anova_p < UNSTABLE_P) by a margin that
        matters (spread > UNSTABLE_SPREAD); False when either is nan."""
        return bool(self.anova_p < UNSTABLE_P and self.spread > UNSTABLE_SPREAD)


def replicated_summary(samples: Sequence[Sequence[float]], threshold: float = OUTLIER_THRESHOLD,
                       confidence: float = CONFIDENCE) -> Replicated:
    """samples[r] = the window values of replicate r. Outliers are removed WITHIN each replicate
    (modified z-score, as remove_outliers does: windows of one process are exchangeable;
    replicates are not screened for outliers, since with a handful of them no test can tell an
    outlier from the between-process variation the interval must cover).

    The interval is the Student-t interval of the mean over the replicate means (df = R - 1): it
    covers the configuration's mean over processes, not just one process's. Empty replicates are
    ignored; ValueError when none is left.
    """
    from scipy import special

    groups, removed = [], 0
    for values in samples:
        if len(values) == 0:
            continue
        kept, dropped = remove_outliers(values, threshold)
        groups.append(kept)
        removed += dropped
    if not groups:
        raise ValueError("no replicate has any window")

    counts = np.array([g.size for g in groups], dtype=float)
    means = np.array([g.mean() for g in groups])
    r, n = len(groups), int(counts.sum())
    mean = float(means.mean())
    median = float(np.median([np.median(g) for g in groups]))
    ss_within = float(sum(((g - m) ** 2).sum() for g, m in zip(groups, means)))
    within_var = ss_within / (n - r) if n > r else _NAN
    if r < 2:
        return Replicated(replicates=1, means=(mean,), windows=n, removed=removed, mean=mean,
                          median=median, ci_low=_NAN, ci_high=_NAN, between_var=_NAN,
                          within_var=within_var, anova_p=_NAN, spread=_NAN)

    low, high = t_interval(means, confidence)
    var_means = float(means.var(ddof=1))
    n_h = r / float((1 / counts).sum())
    between_var = var_means if math.isnan(within_var) else max(0.0, var_means - within_var / n_h)
    weighted = float((counts * means).sum()) / n
    ms_between = float((counts * (means - weighted) ** 2).sum()) / (r - 1)
    if n == r or ss_within == 0:
        anova_p = 0.0 if np.ptp(means) > 0 else 1.0
    else:
        anova_p = float(special.fdtrc(r - 1, n - r, ms_between / within_var))
    spread = math.sqrt(var_means) / mean if mean != 0 else _NAN
    return Replicated(replicates=r, means=tuple(float(m) for m in means), windows=n, removed=removed,
                      mean=mean, median=median, ci_low=low, ci_high=high, between_var=between_var,
                      within_var=within_var, anova_p=anova_p, spread=spread)


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test that `a` and `b` have equal means.

    A large p-value does not show the means are equal, only that these samples cannot tell
    them apart. Two constant samples give 1.0 when equal and 0.0 otherwise; otherwise a side
    with fewer than two values gives nan.
    """
    from scipy import special

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size and y.size and x.std() == 0 and y.std() == 0:
        return 1.0 if x.mean() == y.mean() else 0.0
    if x.size < 2 or y.size < 2:
        return _NAN
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1))
    t = abs(float(x.mean() - y.mean())) / math.sqrt(vx + vy)
    return float(2 * special.stdtr(df, -t))


@dataclass(frozen=True)
class Scaling:
    """N-device throughput against the same backend's 1-device throughput."""

    devices: int
    speedup: float  # ratio of mean throughputs
    efficiency: float  # speedup / devices
    p_value: float  # Welch, on the two sets of values; nan when a side has fewer than 2
    significant: bool
    ci_low: float = _NAN  # interval of the speedup (see ratio_interval); nan when a side has fewer than 2
    ci_high: float = _NAN


def scaling(multi: Sequence[float], single: Sequence[float], devices: int,
            alpha: float = SIGNIFICANCE) -> Scaling:
    """Compare the independent throughput values (xbench: replicate means) of an N-device
    and a 1-device configuration: speedup = mean(multi) / mean(single); `significant` when
    Welch's p < alpha; the CONFIDENCE interval of the speedup is the delta-method interval on
    log means with Welch's df (`ratio_interval`). With fewer than two values on a side, p_value
    and the interval are nan and `significant` is False."""
    r = ratio_interval(multi, single)
    return Scaling(devices=devices, speedup=r.ratio, efficiency=r.ratio / devices, p_value=r.p_value,
                   significant=bool(r.p_value < alpha), ci_low=r.ci_low, ci_high=r.ci_high)


@dataclass(frozen=True)
class Ratio:
    """mean(b) / mean(a) with a confidence interval and Welch's test of equal means."""

    ratio: float
    ci_low: float
    ci_high: float
    p_value: float


def ratio_interval(b: Sequence[float], a: Sequence[float], confidence: float = CONFIDENCE) -> Ratio:
    """mean(b) / mean(a) of two sets of independent values (xbench: replicate means), with the
    delta-method interval on log means with Welch's degrees of freedom, and Welch's p-value.

    With fewer than two values on a side the interval and p are nan (an empty side, or a zero
    mean(a), makes the ratio nan as well). The interval is approximate: it assumes both means
    are positive and well away from zero relative to their standard errors."""
    x, y = np.asarray(b, dtype=float), np.asarray(a, dtype=float)
    if x.size == 0 or y.size == 0 or y.mean() == 0:
        return Ratio(_NAN, _NAN, _NAN, _NAN)
    ratio = float(x.mean() / y.mean())
    if x.size < 2 or y.size < 2:
        return Ratio(ratio, _NAN, _NAN, _NAN)
    p_value = welch_p_value(b, a)
    if x.mean() == 0:
        return Ratio(ratio, _NAN, _NAN, p_value)
    vx, vy = x.var(ddof=1) / x.size / x.mean() ** 2, y.var(ddof=1) / y.size / y.mean() ** 2
    if vx + vy == 0:
        return Ratio(ratio, ratio, ratio, p_value)
    df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1))
    half = _t_quantile(confidence, df) * math.sqrt(vx + vy)
    return Ratio(ratio, ratio * math.exp(-half), ratio * math.exp(half), p_value)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of p-values for testing them together: an adjusted p below
    alpha rejects with a family-wise error rate of at most alpha (the chance that ANY of the
    tests rejects when nothing changed). nan p-values stay nan and do not count as tests."""
    order = sorted((p, i) for i, p in enumerate(p_values) if p == p)
    adjusted = [_NAN] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        adjusted[index] = running
    return adjusted


def relative_errors(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> tuple[float, float, float]:
    """Max absolute, max elementwise relative, and normwise relative error of `actual`.

    Elementwise relative errors divide by max(|expected|, 1e-3 * max|expected|), so entries
    near zero do not dominate; the normwise error decides pass or fail.
    """
    a = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in actual])
    e = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in expected])
    if a.shape != e.shape:
        return math.inf, math.inf, math.inf
    diff = np.abs(a - e)
    scale = np.max(np.abs(e)) if e.size else 0.0
    floor = max(1e-3 * float(scale), float(np.finfo(np.float32).tiny))
    norm = np.linalg.norm(e)
    norm_rel = float(np.linalg.norm(a - e) / norm) if norm > 0 else float(np.linalg.norm(a - e))
    if not np.all(np.isfinite(a)):
        return math.inf, math.inf, math.inf
    return float(diff.max(initial=0.0)), float(np.max(diff / np.maximum(np.abs(e), floor), initial=0.0)), norm_rel
