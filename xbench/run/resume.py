"""Resuming a run: the comparison a run directory's run.json describes (its spec, launchers
and, for a complete run, its devices, so that no worker starts to find them again), and
whether anything is left to run."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from xbench.contract import DATA_PARALLEL
from xbench.errors import SpecError, XbenchError
from xbench.experiment import Spec, build_spec
from xbench.models.model_spec import ModelSpec, model_table
from xbench.results.records import (
    ALLREDUCE_FILE,
    RECORDS_FILE,
    RUN_FILE,
    check_same_run,
    finished_trials,
    iter_records,
    read_run,
)
from xbench.run import launcher, zygote
from xbench.run.cluster import Launch
from xbench.run.comparison import Comparison, trial_count
from xbench.run.environment import command_line
from xbench.run.readiness import append_logs, choose_launchers, choose_lineups, ready_with_fork_servers
from xbench.run.registry import resolve
from xbench.run.rounds import round_due
from xbench.run.rundir import RunDirLock


def resume(run_dir: Path, startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S) -> Comparison:
    """The comparison a run directory's run.json describes, to run its unfinished trials; it
    holds the directory's lock until its `release`."""
    run_dir = Path(run_dir)
    if not (run_dir / RUN_FILE).exists():
        raise XbenchError(f"--resume: no {RUN_FILE} in {run_dir}; is it an xbench run directory?")
    lock = RunDirLock(run_dir).acquire(command_line())
    try:
        return _resumed(run_dir, lock, startup_timeout_s)
    except BaseException:
        lock.release()
        raise


def _resumed(run_dir: Path, lock: RunDirLock, startup_timeout_s: float) -> Comparison:
    saved = read_run(run_dir)
    adopt_member_logs(run_dir)
    source = str(run_dir / RUN_FILE)
    try:
        spec = saved_spec(saved["spec"], source)
        fields = {k: v for k, v in saved.get("launch", {}).items() if k != "backends"}
        launch = Launch(**{**fields, "hosts": tuple(fields.get("hosts", ()))})
    except (KeyError, TypeError, ValueError) as err:
        raise XbenchError(f"--resume: {source} is damaged ({type(err).__name__}: {err})") from None
    records = run_dir / RECORDS_FILE
    if records.exists():
        check_same_run(saved["run_id"], (r.get("run_id") for r in iter_records(records)), records,
                       fix="resume a directory that holds one run")
    finished = _as_recorded(spec, saved, run_dir, launch, lock, startup_timeout_s)
    if finished is not None:
        return finished
    with tempfile.TemporaryDirectory(prefix="xbench-describe-") as tmp:
        ready, servers = ready_with_fork_servers(spec, Path(tmp), strict_devices=False, launch=launch,
                                                 startup_timeout_s=startup_timeout_s)
        with zygote.closed_on_error(servers):
            append_logs(Path(tmp), run_dir / launcher.LOG_FILE, servers)
            # The launchers the run started with, so that trial ids (and what counts as done) match.
            launchers = {**ready.launchers, **saved.get("launch", {}).get("backends", {})}
            return Comparison(spec, tuple(ready.entries), ready.devices, run_dir, saved["run_id"],
                              bool(saved.get("breakdown", False)), launch, launchers, ready.lineups,
                              startup_timeout_s, lock, fork_servers=servers,
                              left_out=tuple(saved.get("devices_left_out", ())))


def _as_recorded(spec: Spec, saved: Mapping[str, Any], run_dir: Path, launch: Launch, lock: RunDirLock,
                 startup_timeout_s: float) -> Comparison | None:
    """A complete run as its run.json describes it, devices included: nothing is left to run,
    so no worker starts to find them again. None when something is left (or run.json lacks
    the devices)."""
    if not isinstance(saved.get("devices"), dict):
        return None
    entries = resolve(spec.backends)
    launchers = {**choose_launchers(entries, launch), **saved.get("launch", {}).get("backends", {})}
    recorded = Comparison(spec, tuple(entries), saved["devices"], run_dir, saved["run_id"],
                          bool(saved.get("breakdown", False)), launch, launchers, choose_lineups(spec, entries),
                          startup_timeout_s, lock)
    return recorded if complete(recorded) else None


def complete(comparison: Comparison) -> bool:
    """Whether a run has nothing left to run: every planned trial has a final record, no
    adaptive round is due and (--breakdown) the all-reduce is measured; a --resume of it
    would start no worker."""
    done = finished_trials(comparison.run_dir)
    if trial_count(comparison, done):
        return False
    multi_device = any(n > 1 for n in comparison.spec.devices)
    if comparison.breakdown and multi_device and not (comparison.run_dir / ALLREDUCE_FILE).exists():
        return False
    return not round_due(comparison, done)


def saved_spec(raw: Mapping[str, Any], source: str) -> Spec:
    """A run's spec from its run.json. A run recorded before replicates existed is finished
    the way it started: one replicate, in plan order, every window, no time budget; one
    recorded before plain programs existed times the data-parallel program on 1 device."""
    raw = {**raw, "single_device": raw.get("single_device", DATA_PARALLEL)}
    if isinstance(raw.get("models"), list):  # asdict of each ModelSpec; older runs lack family and dims
        raw["models"] = [_saved_model(m, source) for m in raw["models"]]
    if not raw.get("variants"):
        raw.pop("variants", None)
    protocol = dict(raw.get("protocol") or {})
    if "interval_target" not in protocol:  # before adaptive replicates: the planned ones only
        protocol["interval_target"] = 0
        raw = {**raw, "protocol": protocol}
    if "replicates" in protocol:
        return build_spec(raw, source=source)
    legacy = {**protocol, "target_ci": 0, "window_budget_s": 1e9}
    spec = build_spec({**raw, "protocol": legacy}, source=source)
    return replace(spec, protocol=replace(spec.protocol, replicates=1, order_seed=spec.seed))


def _saved_model(raw: Any, source: str) -> Any:
    """A stored ModelSpec as a [[models]] table (older ones are tables already)."""
    if not isinstance(raw, Mapping) or "family" not in raw:
        return raw
    try:
        return model_table(ModelSpec.from_dict(raw))
    except (KeyError, TypeError, ValueError) as err:
        raise SpecError(f"a model in {source} is not one xbench wrote ({err}); start a new run") from None


def adopt_member_logs(run_dir: Path) -> None:
    """Member logs left by a run killed before its gangs stopped (SIGKILL) go into the run's
    log, so that a resumed run leaves no stray file and loses none of their lines."""
    log_path = Path(run_dir) / launcher.LOG_FILE
    for path in sorted(Path(run_dir).glob(f"{launcher.LOG_FILE}.*")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        launcher.append_log(log_path, f"--- {path.name}, left by an interrupted run\n".encode() + data)
        path.unlink(missing_ok=True)
