"""Statistics over repeated timing windows: pure functions, no state, no formatting.

The sample of a trial is one value per timed window (throughput in samples/s). Outliers are
removed with the modified z-score (Iglewicz and Hoaglin), then the mean gets a Student-t
interval. Two samples are compared with Welch's t-test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

OUTLIER_THRESHOLD = 3.5
CONFIDENCE = 0.95
SIGNIFICANCE = 0.05


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


def modified_z_scores(values: Sequence[float]) -> np.ndarray:
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


def remove_outliers(values: Sequence[float], threshold: float = OUTLIER_THRESHOLD) -> tuple[np.ndarray, int]:
    """The values whose |modified z-score| is at most `threshold`, and how many were dropped."""
    x = np.asarray(values, dtype=float)
    keep = np.abs(modified_z_scores(x)) <= threshold
    return x[keep], int(x.size - keep.sum())


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Two-sided Student-t confidence interval of the mean; needs two or more values."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    if x.size < 2:
        raise ValueError("a confidence interval needs at least two values")
    half = stats.t.ppf(0.5 + confidence / 2, df=x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean() - half), float(x.mean() + half)


def summarize(values: Sequence[float], threshold: float = OUTLIER_THRESHOLD,
              confidence: float = CONFIDENCE) -> Summary:
    """Remove outliers, then describe what is left."""
    kept, removed = remove_outliers(values, threshold)
    return describe(kept, removed, confidence)


def describe(kept: Sequence[float], removed: int = 0, confidence: float = CONFIDENCE) -> Summary:
    """Location, spread and interval of values already cleaned of outliers."""
    x = np.asarray(kept, dtype=float)
    low, high = t_interval(x, confidence)
    return Summary(n=int(x.size), removed=removed, median=float(np.median(x)),
                   mean=float(x.mean()), std=float(x.std(ddof=1)), ci_low=low, ci_high=high)


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test that `a` and `b` have equal means.

    A large p-value does not show the means are equal, only that these samples cannot tell
    them apart. Two constant samples give 1.0 when equal and 0.0 otherwise.
    """
    from scipy import stats

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.std() == 0 and y.std() == 0:
        return 1.0 if x.mean() == y.mean() else 0.0
    return float(stats.ttest_ind(x, y, equal_var=False).pvalue)


@dataclass(frozen=True)
class Scaling:
    """N-device throughput against the same backend's 1-device throughput."""

    devices: int
    speedup: float  # ratio of mean throughputs
    efficiency: float  # speedup / devices
    p_value: float  # Welch, on the two throughput samples
    significant: bool


def scaling(multi: Sequence[float], single: Sequence[float], devices: int,
            alpha: float = SIGNIFICANCE) -> Scaling:
    """Compare outlier-free throughput samples of an N-device and a 1-device run."""
    speedup = float(np.mean(multi) / np.mean(single))
    p_value = welch_p_value(multi, single)
    return Scaling(devices=devices, speedup=speedup, efficiency=speedup / devices,
                   p_value=p_value, significant=p_value < alpha)


@dataclass(frozen=True)
class Ratio:
    """mean(b) / mean(a) with a confidence interval and Welch's test of equal means."""

    ratio: float
    ci_low: float
    ci_high: float
    p_value: float


def ratio_interval(b: Sequence[float], a: Sequence[float], confidence: float = CONFIDENCE) -> Ratio:
    """Interval of mean(b)/mean(a) from the delta method on log means, with Welch's degrees of
    freedom; each sample needs two or more values."""
    from scipy import stats as sps

    x, y = np.asarray(b, dtype=float), np.asarray(a, dtype=float)
    vx, vy = x.var(ddof=1) / x.size / x.mean() ** 2, y.var(ddof=1) / y.size / y.mean() ** 2
    ratio = float(x.mean() / y.mean())
    if vx + vy == 0:
        return Ratio(ratio, ratio, ratio, welch_p_value(b, a))
    df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1))
    half = sps.t.ppf(0.5 + confidence / 2, df) * math.sqrt(vx + vy)
    return Ratio(ratio, ratio * math.exp(-half), ratio * math.exp(half), welch_p_value(b, a))
