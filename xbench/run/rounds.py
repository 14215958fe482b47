"""Timing a run's trials: the planned rounds, then adaptive rounds of one more replicate for the
configurations still wider than the target while the time budget lasts (`adaptive`), with the
fork servers and the compilation cache the workers share."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xbench.contract import COMPILE_CACHE_VARIABLE, Trial
from xbench.results.fit import MemoryCheck
from xbench.results.records import RUN_FILE, Record, RecordWriter, read_records, read_run, write_json
from xbench.run import launcher, zygote
from xbench.run.adaptive import Budget, adaptive, next_round, seconds_timing
from xbench.run.comparison import Comparison, Observer, planned_trials
from xbench.run.memory_check import memory_checks
from xbench.run.plan import group_trials


def execute(comparison: Comparison, environment: dict[str, Any], verification: dict[str, dict[str, Any]],
            listener: Observer | None = None, done: set[str] | frozenset[str] = frozenset(),
            servers: zygote.ForkServers | None = None) -> list[Record]:
    """Time every trial of the backends whose verification did not fail and whose estimated
    memory per device fits the devices (`xbench.run.memory_check`); the others get a skipped
    record with the reason; trials in `done` (a resumed run's) are left out. Workers are forked
    from `servers` (`run_fork_servers`); None: from scratch.
    Returns the new records, each already in records.jsonl."""
    writer = RecordWriter(comparison.run_dir)
    checks = memory_checks(planned_trials(comparison), comparison.lineups, comparison.devices, environment)
    with compile_cache(comparison.spec.protocol) as cache_env:
        ctx = launcher.Context(
            run_id=comparison.run_id,
            run_dir=comparison.run_dir,
            environment=environment,
            write=writer.append,
            annotate=lambda trial: {"verification": verification[trial.implementation],
                                    **({"memory": checks[trial.config_id].facts()} if trial.config_id in checks
                                       else {})},
            launch=comparison.launch,
            env=cache_env,
            startup_timeout_s=comparison.startup_timeout_s,
            fork_servers=servers,
        )
        return _execute(comparison, ctx, writer, verification, listener, done, checks)


def run_fork_servers(comparison: Comparison, listener: Observer | None = None) -> zygote.ForkServers | None:
    """The run's fork servers (`xbench.run.zygote`): those that found its devices, held by the
    comparison and ended by its `release` (None where fork servers are off); turning them off
    from now on is kept in run.json, and so is an earlier turn-off (before run.json existed)."""
    servers = comparison.fork_servers
    if servers is not None:
        servers.turned_off = lambda why: _fork_servers_off(comparison.run_dir, listener, why)
        if servers.off is not None:
            servers.turned_off(servers.off)
    return servers


def _fork_servers_off(run_dir: Path, listener: Observer | None, why: str) -> None:
    """Said once, and kept in run.json: the rest of the run starts its workers from scratch."""
    run = read_run(run_dir)
    run["fork_server_off"] = why
    write_json(run_dir / RUN_FILE, run)
    if listener is not None:
        listener.note(f"{why}: fork servers off, workers start from scratch for the rest of the run")


@contextlib.contextmanager
def compile_cache(protocol: Any):
    """The workers' environment for `protocol.compile_cache`: "run" gives the replicates of
    this run a compilation cache of their own (so a run never reuses another run's programs),
    removed when the run ends."""
    if protocol.compile_cache != "run":
        yield {}
        return
    path = tempfile.mkdtemp(prefix="xbench-compile-cache-")
    try:
        yield {COMPILE_CACHE_VARIABLE: path}
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _execute(comparison: Comparison, ctx: launcher.Context, writer: RecordWriter,
             verification: dict[str, dict[str, Any]], listener: Observer | None,
             done: set[str] | frozenset[str], checks: Mapping[str, MemoryCheck]) -> list[Record]:
    if listener is not None:
        ctx.listener = listener
    records: list[Record] = []
    everything = planned_trials(comparison)
    positions = {t.id: i for i, t in enumerate(everything)}
    trials = [t for t in everything if t.id not in done]
    runnable = []
    for trial in trials:
        reason = _not_launched(trial, verification, checks)
        if reason is None:
            runnable.append(trial)
            continue
        record = launcher.skipped_record(trial, ctx, reason)
        writer.append(record)
        ctx.listener.trial_finished(trial, record)
        records.append(record)
    targets = {e.name: e.target for e in comparison.entries}
    started = time.monotonic()
    records += launcher.run_groups(group_trials(runnable, targets, positions), ctx)
    budget = _spent(comparison, done)  # a resumed run: what it timed before counts too
    budget.charge(time.monotonic() - started, len(runnable))
    budget.at_least(comparison.spec.protocol.adaptive_floor or 0.0)
    timed = [t for t in everything if verification[t.implementation]["status"] != "failed"]
    return records + _extra_rounds(comparison, ctx, timed, budget, listener)


def _not_launched(trial: Trial, verification: dict[str, dict[str, Any]],
                  checks: Mapping[str, MemoryCheck]) -> str | None:
    """Why `trial` is skipped without a worker: its program failed verification, or its
    estimated memory per device passes the device's (`xbench.results.fit`); None: launch it."""
    if verification[trial.implementation]["status"] == "failed":
        return "verification failed: " + "; ".join(verification[trial.implementation]["failed"])
    found = checks.get(trial.config_id)
    return None if found is None or found.fits else found.reason


def _extra_rounds(comparison: Comparison, ctx: launcher.Context, planned: list[Trial], budget: Budget,
                  observer: Observer | None) -> list[Record]:
    """Adaptive replicates (`xbench.run.adaptive`): rounds of one more replicate for each
    configuration still wider than the target, while the budget lasts. Not across nodes: each
    node sees only its own records, and the nodes must agree on every round."""
    protocol = comparison.spec.protocol
    if not adaptive(protocol) or comparison.launch.multi_node:
        return []
    targets = {e.name: e.target for e in comparison.entries}
    planned_rounds = protocol.replicates or 1
    target = f"±{100 * (protocol.interval_target or 0):.3g}%"
    added: list[Record] = []
    for number in itertools.count(1):
        found = next_round(planned, read_records(comparison.run_dir), protocol, number)
        if not found.trials or ctx.cancel.is_set():
            break
        if not budget.affords(len(found.trials)):
            if observer is not None:
                observer.note(f"{found.configurations} configuration(s) still wider than "
                              f"{target}; another round would pass the "
                              f"{protocol.time_budget_s:g} s time budget (--time-budget)")
            break
        if observer is not None:
            wider = sum(trial.all_reduce for trial in found.trials)  # not counting compute-only twins
            observer.round_added(len(found.trials), f"round {planned_rounds + number}: {wider} configuration(s) wider "
                                 f"than {target}, one more replicate each "
                                 f"({budget.left:.0f} s of the time budget left)")
        positions = {t.id: len(planned) * (number + planned_rounds) + i for i, t in enumerate(found.trials)}
        started = time.monotonic()
        added += launcher.run_groups(group_trials(list(found.trials), targets, positions), ctx)
        budget.charge(time.monotonic() - started, len(found.trials))
    return added


def round_due(comparison: Comparison, done: set[str]) -> bool:
    """Whether a resumed run would add an adaptive round, judged as `_extra_rounds` judges it:
    the next round's trials against the budget that the finished trials have spent."""
    protocol = comparison.spec.protocol
    if not adaptive(protocol) or comparison.launch.multi_node:
        return False
    found = next_round(planned_trials(comparison), read_records(comparison.run_dir), protocol, 1)
    budget = _spent(comparison, done)
    budget.at_least(protocol.adaptive_floor or 0.0)
    return bool(found.trials) and budget.affords(len(found.trials))


def _spent(comparison: Comparison, done: set[str] | frozenset[str]) -> Budget:
    """The run's time budget, charged with what its finished trials (a resumed run's) took."""
    budget = Budget(comparison.spec.protocol.time_budget_s or 0.0)
    if done:
        earlier = [r for r in read_records(comparison.run_dir) if r["trial_id"] in done]
        budget.charge(seconds_timing(earlier), len(earlier))
    return budget
