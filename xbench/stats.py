"""Statistics over repeated timing: pure functions, no state, no formatting.

A configuration is measured by R *replicates*, each a fresh worker process timing several
windows (one throughput value per window). The independent units are the processes, not the
windows: each process makes its kernel, autotuning and thread-placement choices once and all of
its windows share them, so windows of one process vary far less than processes do. Hence a
configuration's interval is over its R replicate means, on a log scale (throughput varies by
factors, and an interval on a log scale never runs below zero), with windows as the inner level
that only sharpens each replicate's mean (Kalibera and Jones, "Rigorous Benchmarking in
Reasonable Time", ISMM 2013).

A handful of replicates estimates its own variance badly (2 replicates: one degree of freedom,
a t quantile of 12.7). The configurations of one backend in one regime vary alike, so
`pooled_log_spreads` borrows strength across them (an empirical-Bayes random-effects model of
the variances), and every statement about a configuration, alone (`log_interval`) or against
another (`log_ratio`: speedups, the fastest, `xbench diff`), comes from that one model, so a
verdict can never contradict the interval printed beside it.

The two levels are reported as variance components of a one-way random-effects model: the
pooled within-replicate variance of windows, the between-replicate variance left after the
window noise in the replicate means is subtracted, and the one-way ANOVA p-value that the
replicate means differ more than their windows explain.

Outliers are handled only at the window level, within each replicate, with the modified z-score
(Iglewicz and Hoaglin): windows of one process are exchangeable. Replicates are never screened:
with a handful of them no test can tell an outlier from the between-process variation that the
interval must cover.

The single-sample functions (`summarize`, `describe`, `t_interval`) treat their values as
independent: right for replicate means, too narrow for windows of one process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

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
    ci_low: float  # interval of the mean over processes (`log_interval`); nan without a spread
    ci_high: float
    between_var: float  # variance component between replicates, >= 0 (nan when R < 2)
    within_var: float  # pooled within-replicate variance of windows (nan when no replicate has 2 windows)
    anova_p: float  # one-way ANOVA F-test p: replicate means differ more than windows explain (nan when R < 2)
    spread: float  # sample std (ddof=1) of replicate means / mean (nan when R < 2)
    log_var: float = _NAN  # the variance of one replicate's log mean behind the interval (pooled: summary.py)
    df: float = 0.0  # its degrees of freedom

    @property
    def log_spread(self) -> LogSpread:
        return LogSpread(self.log_var, self.df)

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

    The interval is the Student-t interval of the log replicate means (df = R - 1), back on the
    throughput scale: it covers the configuration's (geometric) mean over processes, not just
    one process's. `with_spread` narrows it with the spread its group shares. Empty replicates are
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

    own = LogSpread(max(float(np.log(means).var(ddof=1)), _LEAST_LOG_VAR), float(r - 1)) \
        if np.all(means > 0) else LogSpread(_NAN, 0.0)
    low, high = log_interval(means, own, confidence)
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
                      within_var=within_var, anova_p=anova_p, spread=spread, log_var=own.var, df=own.df)


def with_spread(summary: Replicated, spread: LogSpread, confidence: float = CONFIDENCE,
                run_var: float = 0.0) -> Replicated:
    """The summary with its interval taken from a pooled spread (`pooled_log_spreads`) and,
    where given, a run-level variance (`log_interval`)."""
    low, high = log_interval(summary.means, spread, confidence, run_var)
    return replace(summary, ci_low=low, ci_high=high, log_var=spread.var, df=spread.df)


@dataclass(frozen=True)
class LogSpread:
    """The variance of one replicate's log mean throughput in a configuration, and the
    degrees of freedom behind that estimate (0: none; the interval is then nan)."""

    var: float
    df: float

    @property
    def known(self) -> bool:
        return self.df > 0 and self.var == self.var


# Variances of log replicate means below this (a relative spread of 1e-6) count as this: two
# replicates that agree to every printed digit still differ by the clock's resolution.
_LEAST_LOG_VAR = 1e-12
MAX_DF = 1e6  # "infinitely many": the t quantile is then the normal one


def pooled_log_spreads(groups: Sequence[Values]) -> list[LogSpread]:
    """Each configuration's between-replicate variance on a log scale, borrowing strength from
    the others of its group (one backend in one regime, whose processes vary alike).

    samples[i] = configuration i's replicate means (positive). The model is Smyth's empirical
    Bayes one (limma; "Linear models and empirical Bayes methods for assessing differential
    expression", 2004): each configuration's true variance is drawn from a scaled inverse
    chi-square prior (s0², d0) fitted to the group's sample variances by the method of
    moments; the posterior variance (d0·s0² + d·s²) / (d0 + d) has d0 + d degrees of freedom.
    When the group's variances agree (d0 unbounded) it is the pooled variance; when they
    disagree, each configuration keeps mostly its own. The degrees of freedom never exceed the
    group's total, and a configuration with one replicate takes the prior alone. With fewer
    than three configurations that have two replicates, nothing is borrowed.

    One conservative change to the textbook estimate: a configuration never gets a variance
    below its own sample variance. Shrinking every variance toward the group's would narrow
    the interval of the one configuration that really is noisier than its group (a simulated
    group of seven at 3 % and one at 20 %, 3 replicates: that one covered 76 % with shrinkage
    alone, 85 % with the floor; with 6 replicates 88 % and 92 %). Simulated coverage of the
    95 % interval (tests/unit/test_pooled_intervals.py): 94-96 % for 4 to 16 configurations
    of 2 or 3 replicates with equal or unequal (2-10 %) variances; the Student-t interval of
    one configuration alone covers 95 % too but is 3-9x wider at 2 replicates.
    """
    logs = [np.log(np.asarray(g, dtype=float)) for g in groups]
    d = np.array([max(x.size - 1, 0) for x in logs], dtype=float)
    s2 = np.array([max(float(x.var(ddof=1)), _LEAST_LOG_VAR) if x.size > 1 else _NAN for x in logs])
    own = d > 0
    total = float(d.sum())
    if own.sum() == 0:
        return [LogSpread(_NAN, 0.0) for _ in logs]
    pooled = float((d[own] * s2[own]).sum() / total)
    if own.sum() < 3:
        return [LogSpread(float(s2[i]), float(d[i])) if own[i] else LogSpread(pooled, total) for i in range(len(logs))]
    if not np.all(np.isfinite(s2[own])):
        return [LogSpread(float(s2[i]), float(d[i])) if own[i] else LogSpread(_NAN, 0.0) for i in range(len(logs))]
    d0, s0 = _prior(s2[own], d[own])
    found = []
    for i in range(len(logs)):
        if not own[i]:
            found.append(LogSpread(pooled if math.isinf(d0) else s0, min(d0, total)))
        elif math.isinf(d0):
            found.append(LogSpread(max(pooled, float(s2[i])), total))
        else:
            moderated = float((d0 * s0 + d[i] * s2[i]) / (d0 + d[i]))
            found.append(LogSpread(max(moderated, float(s2[i])), min(d0 + d[i], total)))
    return found


def _prior(s2: np.ndarray, d: np.ndarray) -> tuple[float, float]:
    """(d0, s0²) of the scaled inverse chi-square prior, by moments of log s² (Smyth 2004, §6.2)."""
    from scipy import optimize, special

    e = np.log(s2) - special.digamma(d / 2) + np.log(d / 2)
    excess = float(e.var(ddof=1) - special.polygamma(1, d / 2).mean())
    if excess <= 0:
        return math.inf, _NAN
    if excess < 1e-6:  # trigamma(x) ~ 1/x: beyond any df a run could have
        return math.inf, _NAN
    half_d0 = optimize.brentq(lambda x: float(special.polygamma(1, x)) - excess, 1e-8, 1e7)
    d0 = 2 * half_d0
    return d0, float(math.exp(float(e.mean()) + special.digamma(half_d0) - math.log(half_d0)))


def log_interval(means: Values, spread: LogSpread, confidence: float = CONFIDENCE,
                 run_var: float = 0.0) -> tuple[float, float]:
    """The interval of a configuration's (geometric) mean throughput from its replicate means
    and its pooled spread: exp(mean log ± t(df) · sqrt(var / n + run_var)). `run_var`: the
    variance of a whole run's log mean on this machine (measured over several invocations), a
    level of variation the replicates of one run share and cannot see. It is a given constant,
    not estimated from these replicates, so df is Welch-Satterthwaite's for the sum (the
    spread's df scaled up by the share run_var adds), not the spread's alone: a t of 12.7 at
    one degree of freedom must not multiply a known term. nan without a spread."""
    x = np.log(np.asarray(means, dtype=float))
    if not spread.known or x.size == 0:
        return _NAN, _NAN
    center = float(x.mean())
    sampled = spread.var / x.size
    total = sampled + run_var
    df = total ** 2 / (sampled ** 2 / spread.df) if sampled > 0 else MAX_DF
    half = _t_quantile(confidence, min(df, MAX_DF)) * math.sqrt(total)
    return math.exp(center - half), math.exp(center + half)


@dataclass(frozen=True)
class LogRatio:
    """What `log_ratio` found: the ratio of geometric means, its interval and test, and the
    smallest change the comparison could have detected."""

    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    se: float  # standard error of the log ratio
    df: float

    def detectable(self, alpha: float = SIGNIFICANCE, power: float = 0.8) -> float:
        """The smallest relative change (e.g. 0.07) that a two-sided test at `alpha` would
        detect with probability `power`: exp((t(1 - alpha/2) + t(power)) · se) - 1."""
        if not self.se == self.se or self.df <= 0:
            return _NAN
        from scipy import special

        df = min(self.df, MAX_DF)
        z = float(special.stdtrit(df, 1 - alpha / 2)) + float(special.stdtrit(df, power))
        return math.expm1(z * self.se)


def log_ratio(b: Values, b_spread: LogSpread, a: Values, a_spread: LogSpread,
              confidence: float = CONFIDENCE, run_var: float = 0.0, b_run_var: float | None = None,
              shared: bool = False) -> LogRatio:
    """geomean(b) / geomean(a) with its interval and two-sided p-value, from each side's
    replicate means and pooled spread (Welch-Satterthwaite degrees of freedom). `run_var` (and
    `b_run_var` for b, when it differs) is each side's run-level variance: a rerun shifts each
    configuration's mean by its own amount. `shared`: both spreads come from one pooled
    estimate, so their degrees of freedom are not independent and do not add up."""
    from scipy import special

    x, y = np.log(np.asarray(b, dtype=float)), np.log(np.asarray(a, dtype=float))
    if x.size == 0 or y.size == 0:
        return LogRatio(_NAN, _NAN, _NAN, _NAN, _NAN, 0.0)
    log_ratio_ = float(x.mean() - y.mean())
    ratio = math.exp(log_ratio_)
    if not (a_spread.known and b_spread.known):
        return LogRatio(ratio, _NAN, _NAN, _NAN, _NAN, 0.0)
    ub, ua = b_spread.var / x.size, a_spread.var / y.size
    total = ub + ua + run_var + (run_var if b_run_var is None else b_run_var)
    se = math.sqrt(total)
    if shared:
        df = max(a_spread.df, b_spread.df)
    else:
        df = total ** 2 / (ub**2 / b_spread.df + ua**2 / a_spread.df) if ub + ua > 0 else MAX_DF
    df = min(df, MAX_DF)
    half = _t_quantile(confidence, df) * se
    p_value = float(2 * special.stdtr(df, -abs(log_ratio_) / se)) if se > 0 else float(log_ratio_ == 0)
    return LogRatio(ratio, math.exp(log_ratio_ - half), math.exp(log_ratio_ + half), p_value, se, df)


@dataclass(frozen=True)
class Scaling:
    """N-device throughput against the same backend's 1-device throughput."""

    devices: int
    speedup: float  # ratio of geometric mean throughputs
    efficiency: float  # speedup / devices
    p_value: float  # of the log ratio (`log_ratio`); nan without a spread on a side
    significant: bool
    ci_low: float = _NAN  # interval of the speedup (`log_ratio`); nan without a spread on a side
    ci_high: float = _NAN
    run_var: float = 0.0  # the run-level variance in the log speedup (both sides'): no replicate narrows it

    @property
    def run_floor(self) -> float:
        """The ±95 % (a fraction) the run-level variance alone gives the speedup."""
        return math.expm1(1.96 * math.sqrt(self.run_var))


def scaling(multi: Replicated, single: Replicated, devices: int, alpha: float = SIGNIFICANCE,
            run_vars: tuple[float, float] = (0.0, 0.0), shared: bool = False) -> Scaling:
    """An N-device configuration against the 1-device one, from the same model as their
    intervals (`log_ratio` of their replicate means with their spreads and run-level variances
    `run_vars` = (multi's, single's)): the speedup is the ratio of geometric means;
    `significant` when the interval excludes 1 (p < alpha). Without a spread on a side, p_value
    and the interval are nan and `significant` is False."""
    r = log_ratio(multi.means, multi.log_spread, single.means, single.log_spread, 1 - alpha,
                  run_var=run_vars[1], b_run_var=run_vars[0], shared=shared)
    return Scaling(devices=devices, speedup=r.ratio, efficiency=r.ratio / devices, p_value=r.p_value,
                   significant=bool(r.p_value < alpha), ci_low=r.ci_low, ci_high=r.ci_high, run_var=sum(run_vars))


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
    near zero do not dominate; the normwise error decides pass or fail. Computed in place on
    one float64 copy of each side: a full-size model's gradients are hundreds of MB.
    """
    if not len(actual) or not len(expected):
        raise ValueError("relative_errors needs arrays on both sides: nothing to compare")
    a, e = _flat64(actual), _flat64(expected)
    if a.shape != e.shape or not np.all(np.isfinite(a)):
        return math.inf, math.inf, math.inf
    diff = np.subtract(a, e, out=a)
    err_norm, norm = float(np.linalg.norm(diff)), float(np.linalg.norm(e))
    norm_rel = err_norm / norm if norm > 0 else err_norm
    np.abs(diff, out=diff)
    scale = np.abs(e, out=e)
    floor = max(1e-3 * float(scale.max(initial=0.0)), float(np.finfo(np.float32).tiny))
    max_abs = float(diff.max(initial=0.0))
    np.divide(diff, np.maximum(scale, floor, out=scale), out=diff)
    return max_abs, float(diff.max(initial=0.0)), norm_rel


def _flat64(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The arrays raveled into one new float64 vector (one copy, converted as it is filled)."""
    found = [np.asarray(x) for x in arrays]
    out = np.empty(sum(x.size for x in found), np.float64)
    at = 0
    for x in found:
        out[at:at + x.size] = np.ravel(x)
        at += x.size
    return out


def median_interval(values: Values, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Distribution-free confidence interval of the median: the order statistics (X(k), X(n+1-k)).

    For independent values from any continuous distribution, the interval covers the population
    median with probability 1 - 2 * P(B <= k-1), B ~ Binomial(n, 1/2); k is the largest rank
    for which that is at least `confidence` (with ties the coverage only grows). None when even
    (min, max) falls short: fewer than 6 values at 95%. Like `t_interval`, it treats the values
    as independent: windows of one process cover that process's median, not another's.
    """
    from scipy import special

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie between 0 and 1, got {confidence}")
    x = np.sort(np.asarray(values, dtype=float))
    n = int(x.size)
    if n == 0:
        return None
    tails = special.bdtr(np.arange(n), n, 0.5)  # P(B <= j) for j = 0..n-1
    ranks = np.flatnonzero(1 - 2 * tails >= confidence)  # j = k-1 whose interval is wide enough
    if ranks.size == 0:
        return None
    k = int(ranks[-1]) + 1
    return float(x[k - 1]), float(x[n - k])
