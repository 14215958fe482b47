"""Adaptive replicates: after the planned rounds, more replicates where the intervals are wide.

A configuration's interval narrows with its replicates (fresh worker processes), not with its
windows. So instead of a fixed count, xbench runs the planned rounds, then round after round
adds one replicate to each configuration whose 95 % interval is still wider than the spec's
`interval_target`, while the time budget lasts (pyperf and nvbench also decide by noise, not by
count). Rounds interleave the configurations, as the planned ones do, so that slow drift of the
machine spreads over all of them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from xbench.contract import Trial
from xbench.contract.timing import TimingProtocol
from xbench.results.records import Record
from xbench.results.summary import Row, can_narrow, rows_from_records, wide

COMPUTE_ONLY = "/compute-only"  # a compute-only twin's configuration id adds this (`contract.trial_id`)


@dataclass(frozen=True)
class Round:
    """The trials of one extra round, and why they run."""

    trials: tuple[Trial, ...]
    configurations: int  # configurations still wider than the target
    at_most: int  # of them, those that reached max_replicates (not run again)


def next_round(planned: Sequence[Trial], records: Sequence[Record], protocol: TimingProtocol,
               number: int) -> Round:
    """One more replicate of every planned configuration whose interval is wider than the
    target, that replicates could narrow (`can_narrow`) and that has fewer than
    `max_replicates`, each with its compute-only twin (--breakdown) right after it; shuffled by
    the run's order seed and the round `number`, so that nodes and reruns of the same records
    agree."""
    replicates: dict[str, int] = {}
    for record in records:
        config = record["trial_id"].rsplit("/r", 1)[0]
        replicates[config] = max(replicates.get(config, 0), record["trial"].get("replicate", 0) + 1)
    first = {trial.config_id: trial for trial in planned if trial.replicate == 0}
    wanted = [row.trial_id for row in rows_from_records(records)
              if row.all_reduce and wide(row) and row.trial_id in first and can_narrow(row)]
    ready = [config for config in wanted if replicates.get(config, 0) < protocol.max_replicates]
    units = [[replace(first[config], replicate=replicates[config])] for config in ready]
    for unit in units:
        twin = first.get(unit[0].config_id + COMPUTE_ONLY)
        if twin is not None:
            unit.append(replace(twin, replicate=unit[0].replicate))
    return Round(tuple(_interleaved(units, random.Random(f"{protocol.order_seed}/{number}"))), len(wanted),
                 len(wanted) - len(ready))


def _interleaved(units: list[list[Trial]], rng: random.Random) -> list[Trial]:
    """The units grouped by worker process (backend, devices, launcher), the processes in a
    shuffled order, each running its configurations in a shuffled order."""
    rng.shuffle(units)
    groups: dict[tuple, list[Trial]] = {}
    for unit in units:
        groups.setdefault((unit[0].backend, unit[0].devices, unit[0].launcher), []).extend(unit)
    order = list(groups.values())
    rng.shuffle(order)
    return [trial for group in order for trial in group]


@dataclass
class Budget:
    """The seconds of timing a run may spend, and what a trial has cost so far."""

    seconds: float
    spent: float = 0.0
    trials: int = 0

    def charge(self, seconds: float, trials: int) -> None:
        self.spent += seconds
        self.trials += trials

    def affords(self, trials: int) -> bool:
        """Whether `trials` more, at the cost per trial seen so far, end within the budget."""
        if self.trials == 0:
            return self.spent < self.seconds
        return self.spent + trials * self.spent / self.trials <= self.seconds

    def at_least(self, share: float) -> None:
        """Once the planned replicates are charged: the rounds may run `share` times their
        seconds, even where that passes the budget (`TimingProtocol.adaptive_floor`)."""
        self.seconds = max(self.seconds, self.spent * (1 + share))

    @property
    def left(self) -> float:
        return max(0.0, self.seconds - self.spent)


def seconds_timing(records: Sequence[Record]) -> float:
    """The seconds these records' trials ran, from their start and end stamps."""
    return sum(max(0.0, (datetime.fromisoformat(r["finished_at"]) - datetime.fromisoformat(r["started_at"]))
                   .total_seconds()) for r in records)


def reached(rows: Sequence[Row]) -> tuple[int, int, int]:
    """(rows within the target, measured rows that have one, rows that no number of replicates
    could bring within it: this machine's run-to-run variation alone is wider)."""
    targeted = [row for row in rows if row.throughput is not None and row.interval_target and row.all_reduce]
    return (sum(not wide(row) for row in targeted), len(targeted),
            sum(wide(row) and not can_narrow(row) for row in targeted))


def adaptive(protocol: TimingProtocol) -> bool:
    """Whether the protocol asks for adaptive replicates at all."""
    return bool(protocol.interval_target) and bool(protocol.time_budget_s)
