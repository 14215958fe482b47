"""Run a comparison: the short orchestrator over spec x backends x launcher.

The CLI parses and prints; this module decides what runs, in order: the backends made ready
(`readiness`) and the run directory claimed (`comparison`), `run.json` written, verification
(`verify_phase`), the trials timed round by round (`rounds`), the all-reduce (--breakdown,
`allreduce_phase`), each record in `records.jsonl` as its trial ends. `resume` picks up a run
directory where it was left.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from xbench.contract import implementation
from xbench.experiment import Spec
from xbench.results.links import links_record
from xbench.results.links import notes as link_notes
from xbench.results.records import (
    ALLREDUCE_FILE,
    RUN_FILE,
    AllReduceRecord,
    Record,
    ResultsNotWritten,
    RunInfo,
    finished_trials,
    latest_per_trial,
    read_records,
    read_run,
    write_json,
)
from xbench.run import drift, launcher, links, zygote
from xbench.run.allreduce_phase import breakdown_allreduce
from xbench.run.cluster import Launch
from xbench.run.comparison import Comparison, Observer, claim_new_run_dir, new_run_id, planned_trials
from xbench.run.environment import command_line, host_environment
from xbench.run.estimate import Estimate, costs_for, estimate, host_flops
from xbench.run.readiness import (
    append_logs,
    check_options,
    check_spmd_devices,
    choose_launchers,
    choose_lineups,
    ready_with_fork_servers,
    resolved,
    within_the_machine,
)
from xbench.run.registry import resolve
from xbench.run.rounds import execute, run_fork_servers
from xbench.run.verify_phase import failed_verification, started_without_verify, verification_outcome


def prepare(spec: Spec, run_dir: Path | None, strict_devices: bool = True, breakdown: bool = False,
            launch: Launch | None = None, startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S) -> Comparison:
    """Ready the backends, then claim the run directory (only once the input is known to be
    good, so bad input leaves nothing behind). The comparison holds the directory's lock, and
    the fork servers that found the devices, until its `release`."""
    launch = launch or Launch()
    with tempfile.TemporaryDirectory(prefix="xbench-describe-") as tmp:
        ready, servers = ready_with_fork_servers(spec, Path(tmp), strict_devices, launch, startup_timeout_s)
        with zygote.closed_on_error(servers):
            spec = resolved(spec, ready.devices, launch)
            # Across nodes every node must plan alike, whatever devices it found: no trimming.
            spec, left_out = ((spec, ()) if strict_devices or launch.multi_node
                              else within_the_machine(spec, ready.devices, ready.launchers, launch))
            if left_out:
                choose_lineups(spec, list(ready.entries))  # a variant named for a program no longer timed: refused
            comparison = Comparison(spec, tuple(ready.entries), ready.devices, Path(), new_run_id(), breakdown,
                                    launch, ready.launchers, ready.lineups, startup_timeout_s, fork_servers=servers,
                                    left_out=left_out)
            comparison = claim_new_run_dir(comparison, Path(run_dir) if run_dir else None)
        try:
            append_logs(Path(tmp), comparison.run_dir / launcher.LOG_FILE, servers)
        except OSError as err:
            comparison.release()
            raise ResultsNotWritten(f"cannot write into {comparison.run_dir}: {err.strerror or err}; nothing was "
                                    "run") from None
    return comparison


def planned_cost(comparison: Comparison, no_verify: bool = False,
                 done: set[str] | frozenset[str] = frozenset()) -> Estimate:
    """What the comparison's trials not in `done` will cost, verification included unless it
    is off (--no-verify, or across nodes, where it does not run)."""
    gpu = any(not info.get("simulated", True) for info in comparison.devices.values())
    costs = costs_for("gpu" if gpu else "cpu", None if gpu else host_flops(),
                      {e.name: e.backend for e in comparison.entries})
    verify = not no_verify and not comparison.launch.multi_node
    return estimate(comparison.spec, [e.name for e in comparison.entries], comparison.lineups, comparison.launchers,
                    costs, "gpu" if gpu else "cpu", comparison.breakdown, verify, done)


def dry_run(spec: Spec, launch: Launch | None = None, breakdown: bool = False,
            no_verify: bool = False) -> tuple[Spec, Estimate]:
    """The plan of a run and its cost without starting any worker: the backends, their
    options, variants and launchers checked as a run checks them before it looks for devices
    (so a bad spec gets the run's own one-line error), the platform taken from the spec or,
    for `auto`, from whether this machine has NVIDIA's tools. Device counts are not checked:
    only a worker can find the devices."""
    launch = launch or Launch()
    entries = resolve(spec.backends)
    check_options(spec, entries)
    lineups = choose_lineups(spec, entries)
    launchers = choose_launchers(entries, launch)
    check_spmd_devices(spec, launchers, launch)
    gpu = spec.platform == "gpu" or (spec.platform == "auto" and shutil.which("nvidia-smi") is not None)
    devices = {e.name: {"simulated": not gpu} for e in entries}
    spec = resolved(spec, devices, launch)
    costs = costs_for("gpu" if gpu else "cpu", None if gpu else host_flops(), {e.name: e.backend for e in entries})
    verify = not no_verify and not launch.multi_node
    return spec, estimate(spec, [e.name for e in entries], lineups, launchers, costs, "gpu" if gpu else "cpu",
                          breakdown, verify)


def start_run(comparison: Comparison, no_verify: bool = False,
              nccl: dict[str, str] | None = None) -> dict[str, Any]:
    """Write run.json before anything runs (a resumed run adds to its "resumed" list);
    returns the host environment, with the links the workers' collectives use (`nccl`: NCCL's
    variables in their environment)."""
    environment = {**host_environment(), "links": links_record(comparison.spec.p2p, nccl or {}, comparison.devices,
                                                                comparison.spec.devices)}
    path = comparison.run_dir / RUN_FILE
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if path.exists():
        previous = read_run(comparison.run_dir)
        previous.setdefault("resumed", []).append({"at": now, "command": command_line(), "no_verify": no_verify,
                                                   "environment": environment})
        write_json(path, previous)
        return environment
    run: RunInfo = {
        "run_id": comparison.run_id,
        "command": command_line(),
        "started_at": now,
        "spec": asdict(comparison.spec),
        "breakdown": comparison.breakdown,
        "no_verify": no_verify,
        "launch": {**comparison.launch.to_dict(), "backends": comparison.launchers},
        "environment": environment,
        "devices": comparison.devices,
    }
    # The plan's trial ids, so that a report of a run that never finished can say what is missing.
    run["planned"] = [t.id for t in planned_trials(comparison)]
    if comparison.left_out:
        run["devices_left_out"] = list(comparison.left_out)
    write_json(path, run)
    return environment


@dataclass(frozen=True)
class Outcome:
    """A finished comparison."""

    records: list[Record]  # every trial's latest record, this run's and a resumed run's earlier ones
    allreduce: list[AllReduceRecord]
    failures: int  # trials or all-reduce sizes that failed, or backends that failed verification
    seconds: float
    new_records: int = 0  # of `records`, those this invocation made (the rest a resumed run's earlier ones)

    @property
    def tally(self) -> str:
        """The trial replicates this invocation ran, and those recorded before it: "32 trial
        replicate(s)", "0 new trial replicate(s) (32 recorded earlier)"."""
        earlier = len(latest_per_trial(self.records)) - self.new_records
        if not earlier:
            return f"{self.new_records} trial replicate(s)"
        return f"{self.new_records} new trial replicate(s) ({earlier} recorded earlier)"


def run(comparison: Comparison, observer: Observer, no_verify: bool = False, resumed: bool = False) -> Outcome:
    """Verify, time every trial not yet done, time the all-reduce (--breakdown); every record
    is in the run directory as soon as it exists. Ctrl-C propagates as KeyboardInterrupt,
    with every finished record kept."""
    with links.applied(comparison.spec.p2p) as nccl:  # every worker of the run inherits NCCL's variables
        return _run(comparison, observer, no_verify, resumed, nccl)


def _run(comparison: Comparison, observer: Observer, no_verify: bool, resumed: bool, nccl: dict[str, str]) -> Outcome:
    started = time.monotonic()
    done = finished_trials(comparison.run_dir) if resumed else set()
    if resumed and not no_verify and started_without_verify(comparison.run_dir):
        observer.note("the run started with --no-verify: its rest runs without verification too")
        no_verify = True
    environment = start_run(comparison, no_verify, nccl)
    for line in link_notes(environment["links"]):
        observer.note(line)
    # One fork server per backend for verification, timing and the all-reduce: one framework import each.
    servers = run_fork_servers(comparison, observer)
    outcome = verification_outcome(comparison, environment, observer, no_verify, resumed, servers)
    drift.record(comparison.run_dir, "before")
    records = execute(comparison, environment, outcome, observer, done, servers)
    drift.record(comparison.run_dir, "after")
    allreduce: list[AllReduceRecord] = []
    if comparison.breakdown and resumed and (comparison.run_dir / ALLREDUCE_FILE).exists():
        allreduce = read_records(comparison.run_dir, ALLREDUCE_FILE)  # measured before the interruption
    elif comparison.breakdown:
        with observer.phase("timing each backend's all-reduce at the gradient sizes…"):
            allreduce = breakdown_allreduce(comparison, environment, servers)
    new = len(records)
    if resumed:
        records = read_records(comparison.run_dir)
    failed = [name for name, result in outcome.items() if result["status"] == "failed"]
    return _outcome(records, allreduce, failed, time.monotonic() - started, new)


def recorded(comparison: Comparison) -> Outcome:
    """A complete run's outcome from what it recorded (a --resume with nothing left to run)."""
    run_dir = comparison.run_dir
    allreduce = read_records(run_dir, ALLREDUCE_FILE) if (run_dir / ALLREDUCE_FILE).exists() else []
    return _outcome(read_records(run_dir), allreduce, failed_verification(run_dir), 0.0, 0)


def _outcome(records: list[Record], allreduce: list[AllReduceRecord], failed_verification: list[str],
             seconds: float, new: int) -> Outcome:
    # A resumed run's retried trials: their latest record counts, not the failure it replaced.
    failed = sum(map(_failed, latest_per_trial(records))) + sum(r["status"] == "failed" for r in allreduce)
    # A program that failed verification and is not timed (the data-parallel one on 1 device,
    # where the plain one is timed) still fails the run.
    timed = {implementation(r["trial"]["backend"], r["trial"]["variant"], r["trial"]["program"]) for r in records}
    untimed_failures = [name for name in failed_verification if name not in timed]
    return Outcome(records, allreduce, failed + len(untimed_failures), seconds, new)


def _failed(record: Record) -> bool:
    """A trial that failed, or that ran although its program failed verification. "unsupported"
    is a capability the backend lacks (e.g. jax-auto's compute-only twin), not a failure."""
    verification = record.get("verification")
    return (record["status"] not in ("ok", "skipped", "unsupported")
            or (verification is not None and verification.get("status") == "failed"))
