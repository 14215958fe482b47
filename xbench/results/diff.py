"""Compare two runs configuration by configuration: which got slower, and is it real?

Each side's sample is its replicate means (one per worker process), not its windows: windows of
one process share that process's luck, so testing them would call every rerun a change. A
configuration changed when Welch's test on the replicate means is significant after Holm's
correction for the number of configurations compared, and the ratio of means lies beyond the
threshold. Without the correction a rerun of 30 unchanged configurations would show some
"change" in most reruns (each test alone errs 5 % of the time); with it, in about 5 % of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from xbench import stats
from xbench.results.records import Record
from xbench.results.summary import Row, rows_from_records

Key = tuple[str, str, int, int, str, str, bool]  # backend, model, devices, batch, scaling, precision, all-reduce


@dataclass(frozen=True)
class DiffRow:
    key: Key
    a_mean: float
    b_mean: float
    ratio: stats.Ratio  # throughput of B over A
    a_replicates: int = 0
    b_replicates: int = 0
    a_interval: tuple[float, float] = (float("nan"), float("nan"))  # A's 95 % interval of its mean
    adjusted_p: float = float("nan")  # Welch's p after Holm's correction over every compared configuration

    def change(self, threshold: float) -> str:
        """regression / improvement (significant after Holm's correction, and beyond the
        threshold), else why not."""
        r = self.ratio
        if not self.adjusted_p < stats.SIGNIFICANCE:  # also nan: one replicate on a side tests nothing
            return "n.s."
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

    @property
    def untested(self) -> list[DiffRow]:
        """Rows with fewer than two replicates on a side (runs recorded before replicates, or
        interrupted): no test is possible, so they can never count as changed."""
        return [row for row in self.rows if min(row.a_replicates, row.b_replicates) < 2]


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
    adjusted = stats.holm([row.ratio.p_value for row in rows])
    return tuple(replace(row, adjusted_p=p) for row, p in zip(rows, adjusted))


def _diff_row(key: Key, a: Row, b: Row) -> DiffRow:
    ta, tb = a.measured, b.measured
    return DiffRow(key, ta.mean, tb.mean, stats.ratio_interval(b.means, a.means), ta.replicates, tb.replicates,
                   (ta.ci_low, ta.ci_high))


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
