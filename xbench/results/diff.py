"""Compare two runs configuration by configuration: which got slower, and is it real?

Each side's sample is its replicate means (one per worker process), not its windows: windows of
one process share that process's luck, so testing them would call every rerun a change. The
ratio, its interval and its test come from the model behind every interval xbench prints
(`stats.log_ratio`: log replicate means, each side's spread pooled over its backend's
configurations, plus the machine's run-to-run variation where the spec gives it). A
configuration changed when that test is significant after Holm's correction for the number of
configurations compared, and the ratio lies beyond the threshold. Without the correction a rerun
of 30 unchanged configurations would show some "change" in most reruns (each test alone errs
5 % of the time); with it, in about 5 % of them.

A diff also knows its power: each row's smallest change it would detect (80 % of the time, at
the Bonferroni level that bounds Holm's). "no change" is said only where a change of the
threshold's size would have been seen; elsewhere the row is "too few replicates to tell".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from xbench import stats
from xbench.results.records import Record
from xbench.results.summary import Row, rows_from_records

NO_CHANGE = "no change"
UNDERPOWERED = "too few replicates to tell"
TOO_NOISY = "machine too noisy to tell"  # the run-level variation alone hides a change this size
POWER = 0.8

Key = tuple[str, str, int, int, str, str, bool]  # backend, model, devices, batch, scaling, precision, all-reduce


@dataclass(frozen=True)
class DiffRow:
    key: Key
    a_mean: float
    b_mean: float
    ratio: stats.LogRatio  # throughput of B over A
    a_replicates: int = 0
    b_replicates: int = 0
    a_interval: tuple[float, float] = (float("nan"), float("nan"))  # A's 95 % interval of its mean
    adjusted_p: float = float("nan")  # the test's p after Holm's correction over every compared configuration
    run_var: float = 0.0  # the run-level variance of each run's log mean
    detectable: float = float("nan")  # smallest relative change this row would detect (see module doc)
    floor: float = float("nan")  # the same with unlimited replicates: the run-level variation's part

    def change(self, threshold: float) -> str:
        """regression / improvement (significant after Holm's correction, and beyond the
        threshold); within threshold (significant, but smaller); no change (not significant, and
        a change of the threshold's size would have been detected); else too noisy (the machine's
        run-to-run variation alone hides such a change) or underpowered (more replicates would tell)."""
        r = self.ratio
        if not self.adjusted_p < stats.SIGNIFICANCE:  # also nan: no spread on a side tests nothing
            if self.detectable <= threshold:
                return NO_CHANGE
            return TOO_NOISY if self.floor > threshold else UNDERPOWERED
        if r.ratio < 1 - threshold:
            return "regression"
        if r.ratio > 1 + threshold:
            return "improvement"
        return "within threshold"


@dataclass(frozen=True)
class Diff:
    rows: tuple[DiffRow, ...]
    only_a: tuple[Key, ...]
    only_b: tuple[Key, ...]
    environment_changes: tuple[str, ...]

    def regressions(self, threshold: float) -> list[DiffRow]:
        return [row for row in self.rows if row.change(threshold) == "regression"]

    def underpowered(self, threshold: float) -> list[DiffRow]:
        """Rows that could not have detected a change of the threshold's size, for either reason."""
        return [row for row in self.rows if row.change(threshold) in (UNDERPOWERED, TOO_NOISY)]

    @property
    def untested(self) -> list[DiffRow]:
        """Rows without a spread on a side (one replicate, and no other configuration of the
        backend to borrow from): no test is possible, so they can never count as changed."""
        return [row for row in self.rows if row.ratio.p_value != row.ratio.p_value]


def diff_runs(a: Sequence[Record], b: Sequence[Record]) -> Diff:
    """Match measured trials of runs A and B by configuration and compare throughputs."""
    rows_a, rows_b = _by_key(a), _by_key(b)
    both = [k for k in rows_a if k in rows_b]
    return Diff(
        rows=_holm_adjusted([_diff_row(k, rows_a[k], rows_b[k]) for k in both]),
        only_a=tuple(k for k in rows_a if k not in rows_b),
        only_b=tuple(k for k in rows_b if k not in rows_a),
        environment_changes=tuple(environment_changes(a, b)),
    )


def _holm_adjusted(rows: list[DiffRow]) -> tuple[DiffRow, ...]:
    """Holm's p-values, and each row's detectable change at the level Holm's first step uses
    (alpha / tests): a change that large is flagged whatever the other rows hold."""
    adjusted = stats.holm([row.ratio.p_value for row in rows])
    level = stats.SIGNIFICANCE / max(1, sum(p == p for p in adjusted))
    return tuple(replace(row, adjusted_p=p, detectable=row.ratio.detectable(level, POWER),
                         floor=_floor(row.ratio, row.run_var, level)) for row, p in zip(rows, adjusted))


def _floor(ratio: stats.LogRatio, run_var: float, level: float) -> float:
    """The detectable change with unlimited replicates: only the two runs' shifts remain, a
    known variance (no degrees of freedom lost to estimating it)."""
    if not run_var:
        return 0.0
    return replace(ratio, se=(2 * run_var) ** 0.5, df=stats.MAX_DF).detectable(level, POWER)


def _diff_row(key: Key, a: Row, b: Row) -> DiffRow:
    ta, tb = a.measured, b.measured
    run_var = max(a.run_var, b.run_var)
    ratio = stats.log_ratio(b.means, tb.log_spread, a.means, ta.log_spread, run_var=run_var)
    return DiffRow(key, ta.mean, tb.mean, ratio, ta.replicates, tb.replicates, (ta.ci_low, ta.ci_high),
                   run_var=run_var)


def _by_key(records: Sequence[Record]) -> dict[Key, Row]:
    precision = {r["trial"]["backend"]: r["trial"]["precision"] for r in records}
    return {(row.label, row.model, row.devices, row.global_batch, row.scaling_mode, precision[row.backend],
             row.all_reduce): row
            for row in rows_from_records(records) if row.throughput is not None}


def environment_changes(a: Sequence[Record], b: Sequence[Record]) -> list[str]:
    """What differs between the runs' machines and frameworks (a diff across them is weaker)."""
    def facts(records: Sequence[Record]) -> dict[str, str]:
        out: dict[str, str] = {}
        for record in records:
            env = record.get("environment", {})
            out["cpu"] = str(env.get("cpu"))
            out["gpus"] = ", ".join(g.get("name", "?") for g in env.get("gpus") or []) or "none"
            d = record.get("devices")
            if d:
                out[f"{record['trial']['backend']} framework"] = f"{d['framework']} {d['framework_version']}"
        return out

    fa, fb = facts(a), facts(b)
    return [f"{key}: {fa.get(key, '-')} -> {fb.get(key, '-')}" for key in sorted(set(fa) | set(fb))
            if fa.get(key) != fb.get(key)]
