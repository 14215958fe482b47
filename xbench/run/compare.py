"""Run a comparison: the short orchestrator over spec x backends x launcher.

The CLI parses and prints; this module decides what runs and writes the run directory:
`run.json` (spec, command, environment, devices each backend sees) first, then one record per
trial in `records.jsonl` as each trial ends.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from xbench.contract import (
    COMPILE_CACHE_VARIABLE,
    DATA_PARALLEL,
    PLAIN,
    Trial,
    ValidatesOptions,
    implementation,
    launchers_of,
    programs_of,
    variants_of,
)
from xbench.errors import BackendError, SpecError, XbenchError
from xbench.experiment import ALL_VARIANTS, Spec, build_spec, resolve_protocol
from xbench.models.model_spec import ModelSpec, model_table
from xbench.results.allreduce import sizes_for
from xbench.results.records import (
    ALLREDUCE_FILE,
    RECORDS_FILE,
    RUN_FILE,
    AllReduceRecord,
    Record,
    RecordWriter,
    ResultsNotWritten,
    RunInfo,
    check_same_run,
    finished_trials,
    iter_records,
    latest_per_trial,
    prepare_run_dir,
    read_records,
    read_run,
    write_json,
)
from xbench.run import drift, launcher, zygote
from xbench.run.adaptive import Budget, adaptive, next_round, seconds_timing
from xbench.run.cluster import Launch
from xbench.run.environment import command_line, host_environment
from xbench.run.plan import AS_WRITTEN_VARIANT, Lineup, group_trials, plan_trials
from xbench.run.registry import BackendEntry, discover, resolve
from xbench.run.rundir import RunDirLock, check_new_run_dir, discard_run_files, present_run_files
from xbench.run.verification import Progress as VerificationProgress
from xbench.run.verification import Verification, checks_as_dicts, verify

VERIFY_FILE = "verify.json"


@dataclass(frozen=True)
class Comparison:
    """Everything decided before the first trial runs."""

    spec: Spec
    entries: tuple[BackendEntry, ...]
    devices: dict[str, dict[str, Any]]  # backend name -> DeviceInfo as a dict
    run_dir: Path
    run_id: str
    breakdown: bool = False  # time compute-only twins and the all-reduce too
    launch: Launch = field(default_factory=Launch)
    launchers: dict[str, str] = field(default_factory=dict)  # backend name -> the launcher that starts it
    lineups: dict[str, Lineup] = field(default_factory=dict)  # backend name -> its variants and programs
    startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S  # for a worker (gang) to start and find its devices
    lock: RunDirLock | None = None  # held from prepare/resume until `release`
    created: bool = False  # this run made run_dir (so it may remove it while it holds nothing of a run)
    found: frozenset[str] = frozenset()  # run files run_dir held when this run claimed it: never its to delete

    def release(self) -> None:
        """Give up the run directory. A run that never started (no run.json: nothing to resume)
        takes back what it wrote, and the directory too when it made it; never without holding
        the lock, so that a run that lost the race for a directory leaves the winner's alone."""
        held = self.lock is not None and self.lock.held
        unstarted = held and not (self.run_dir / RUN_FILE).exists()
        if unstarted:
            discard_run_files(self.run_dir, keep=self.found)  # only what this invocation wrote
        if self.lock is not None:
            self.lock.release()
        if unstarted and self.created:
            with contextlib.suppress(OSError):  # not empty: another run's files arrived meanwhile
                self.run_dir.rmdir()

    @property
    def implementations(self) -> list[str]:
        """Every backend x variant x program the run times, as verify and the tables name them."""
        return [implementation(name, variant.name, program)
                for name in (e.name for e in self.entries)
                for variant in self.lineups.get(name, Lineup()).variants
                for program in self.lineups.get(name, Lineup()).verified_programs(1)]


def new_run_id() -> str:
    return datetime.now().strftime("%Y-%m-%dT%H-%M-%S")


def default_run_dir(run_id: str, root: Path = Path("results")) -> Path:
    """results/<run id>, made here, with a suffix when a run started in the same second: mkdir
    is atomic, so runs started together never share one."""
    n, path = 1, root / run_id
    try:
        root.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                path.mkdir()
                return path
            except FileExistsError:
                n += 1
                path = root / f"{run_id}-{n}"
    except OSError as err:
        raise XbenchError(f"cannot write results to {path}: {err.strerror or err}; choose another --out") from None


def check_options(spec: Spec, entries: list[BackendEntry]) -> None:
    """Each backend validates its own [options.NAME] table, when it has a validator; a table
    for a backend that is not registered at all is a typo."""
    registered = discover()
    for name in spec.options:
        if name not in registered:
            raise BackendError(f"[options.{name}] names no registered backend; registered: {', '.join(registered)}")
    for entry in entries:
        options = dict(spec.options.get(entry.name, {}))
        if not isinstance(entry.backend, ValidatesOptions):
            if options:
                raise BackendError(f"backend {entry.name!r} takes no options, got {', '.join(options)}")
            continue
        try:
            entry.backend.validate_options(options)
        except ValueError as err:
            raise BackendError(f"[options.{entry.name}]: {err}") from None


def probe_devices(entries: list[BackendEntry], platform: str, log_dir: Path,
                  startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S) -> dict[str, dict[str, Any]]:
    """Start one short worker per backend, in parallel, to learn which devices it sees; each
    writes its output to log_dir/describe-NAME.log."""
    def describe(entry: BackendEntry) -> dict[str, Any]:
        return launcher.describe(entry.target, platform, log_dir / f"describe-{entry.name}.log", startup_timeout_s)

    with ThreadPoolExecutor(max_workers=max(1, len(entries))) as pool:
        results = dict(zip((e.name for e in entries), pool.map(describe, entries)))
    for name, answer in results.items():
        if "reason" in answer:
            raise BackendError(f"backend {name!r} cannot start on platform {platform!r}: {answer['reason']}")
    return {name: answer["device_info"] for name, answer in results.items()}


def check_device_counts(spec: Spec, devices: dict[str, dict[str, Any]]) -> None:
    """More devices than a backend can use is an error the user fixes with --devices."""
    for name, info in devices.items():
        too_many = [n for n in spec.devices if n > info["available"]]
        if too_many:
            kind = "simulated CPU" if info["simulated"] else info["platform"].upper()
            most = info["available"]
            hint = f"--devices 1,{most}" if most > 1 else "--devices 1"
            raise XbenchError(f"{max(too_many)} devices asked, but backend {name!r} has {most} "
                              f"{kind} device(s); use at most {most}, e.g. {hint}")


def choose_launchers(entries: Sequence[BackendEntry], launch: Launch) -> dict[str, str]:
    """Each backend's launcher: its preferred one under --launcher auto, else the one asked
    for, which the backend must support."""
    chosen = {}
    for entry in entries:
        supported = launchers_of(entry.backend)
        if launch.launcher == "auto":
            chosen[entry.name] = supported[0]
        elif launch.launcher in supported:
            chosen[entry.name] = launch.launcher
        else:
            raise XbenchError(f"backend {entry.name!r} cannot be started by --launcher {launch.launcher} "
                              f"(it supports: {', '.join(supported)})")
    return chosen


def choose_lineups(spec: Spec, entries: Sequence[BackendEntry]) -> dict[str, Lineup]:
    """Each backend's variants (as written first, then those `spec.variants` names, or all of
    them) and whether its plain program runs; a one-line error for a variant that names an
    unselected backend or one the backend lacks."""
    by_name = {entry.name: entry for entry in entries}
    wanted: dict[str, list[str]] = {name: [] for name in by_name}
    for item in spec.variants:
        if item == ALL_VARIANTS:
            for name, entry in by_name.items():
                wanted[name] += list(variants_of(entry.backend))
            continue
        backend, _, variant = item.partition(":")
        if backend not in by_name:
            raise XbenchError(f"variant {item!r} names backend {backend!r}, which this run does not time; "
                              f"add it to --backends or drop the variant")
        known = variants_of(by_name[backend].backend)
        if variant not in known:
            listed = ", ".join(known) or "none"
            program = "; plain is a program, not a variant: --single-device plain or both" if variant == PLAIN else ""
            raise XbenchError(f"backend {backend!r} has no variant {variant!r}; its variants: {listed}{program}")
        wanted[backend].append(variant)
    lineups = {}
    for name, entry in by_name.items():
        variants = variants_of(entry.backend)
        chosen = tuple(variants[v] for v in dict.fromkeys(wanted[name]))
        lineups[name] = Lineup((AS_WRITTEN_VARIANT, *chosen), single_device_programs(spec, entry))
    return lineups


def single_device_programs(spec: Spec, entry: BackendEntry) -> tuple[str, ...]:
    """The programs a backend times on 1 device: the spec's choice, the data-parallel one
    where the backend has no plain program."""
    if PLAIN not in programs_of(entry.backend) or spec.single_device == DATA_PARALLEL:
        return (DATA_PARALLEL,)
    return (PLAIN,) if spec.single_device == PLAIN else (DATA_PARALLEL, PLAIN)


def check_spmd_devices(spec: Spec, launchers: Mapping[str, str], launch: Launch) -> None:
    """Under spmd every node runs the same share of each trial's ranks."""
    if "spmd" not in launchers.values():
        return
    for n in spec.devices:
        if n % launch.nnodes:
            raise XbenchError(f"{n} devices cannot be split evenly over {launch.nnodes} nodes; "
                              f"use device counts that {launch.nnodes} divides")
        if launch.nproc_per_node is not None and n // launch.nnodes > launch.nproc_per_node:
            raise XbenchError(f"{n} devices need {n // launch.nnodes} processes per node, more than "
                              f"--nproc-per-node {launch.nproc_per_node}")


def check_same_platform(devices: dict[str, dict[str, Any]]) -> None:
    """A comparison across frameworks means something only on the same kind of device."""
    kinds = {name: ("simulated CPU" if info["simulated"] else info["platform"]) for name, info in devices.items()}
    if len(set(kinds.values())) > 1:
        found = ", ".join(f"{name}: {kind}" for name, kind in kinds.items())
        raise XbenchError(f"the backends would run on different devices ({found}); use --platform cpu, "
                          "or install each framework's GPU build")


@dataclass(frozen=True)
class Ready:
    """The backends of a run, checked and described."""

    entries: list[BackendEntry]
    devices: dict[str, dict[str, Any]]  # backend name -> DeviceInfo as a dict (1-device worker)
    launchers: dict[str, str]  # backend name -> launcher
    lineups: dict[str, Lineup]  # backend name -> variants and programs


def ready_backends(spec: Spec, log_dir: Path, strict_devices: bool = True, launch: Launch | None = None,
                   startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S) -> Ready:
    """The spec's backends, their options and launchers checked and their devices found
    (describe logs go to `log_dir`); one-line errors for anything the user must change."""
    launch = launch or Launch()
    entries = resolve(spec.backends)
    check_options(spec, entries)
    lineups = choose_lineups(spec, entries)
    launchers = choose_launchers(entries, launch)
    check_spmd_devices(spec, launchers, launch)
    devices = probe_devices(entries, spec.platform, log_dir, startup_timeout_s)
    if strict_devices:
        check_device_counts(spec, {name: _per_node(info, launchers[name], launch) for name, info in devices.items()})
    check_same_platform(devices)
    return Ready(entries, devices, launchers, lineups)


def _per_node(info: dict[str, Any], launcher: str, launch: Launch) -> dict[str, Any]:
    """Device counts are per run; under multi-node spmd each node holds a share of them."""
    if launcher != "spmd" or launch.nnodes == 1:
        return info
    return {**info, "available": info["available"] * launch.nnodes}


def prepare(spec: Spec, run_dir: Path | None, strict_devices: bool = True, breakdown: bool = False,
            launch: Launch | None = None, startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S) -> Comparison:
    """Ready the backends, then claim the run directory (only once the input is known to be
    good, so bad input leaves nothing behind). The comparison holds the directory's lock until
    its `release`."""
    launch = launch or Launch()
    with tempfile.TemporaryDirectory(prefix="xbench-describe-") as tmp:
        ready = ready_backends(spec, Path(tmp), strict_devices, launch, startup_timeout_s)
        spec = resolved(spec, ready.devices, launch)
        run_id = new_run_id()
        comparison = Comparison(spec, tuple(ready.entries), ready.devices, Path(), run_id, breakdown, launch,
                                ready.launchers, ready.lineups, startup_timeout_s)
        comparison = claim_new_run_dir(comparison, Path(run_dir) if run_dir else None)
        try:
            with open(comparison.run_dir / launcher.LOG_FILE, "a", encoding="utf-8") as log:
                for path in sorted(Path(tmp).iterdir()):
                    log.write(path.read_text(encoding="utf-8", errors="replace"))
        except OSError as err:
            comparison.release()
            raise ResultsNotWritten(f"cannot write into {comparison.run_dir}: {err.strerror or err}; nothing was "
                                    "run") from None
    return comparison


def claim_new_run_dir(comparison: Comparison, run_dir: Path | None) -> Comparison:
    """Create (or take an empty) run directory, results/<run id> by default, and lock it; a
    one-line error when another run holds it or it already holds a run."""
    try:
        created = run_dir is None or not run_dir.exists()
    except OSError as err:  # a name too long, a path through a file: the system's own words
        raise XbenchError(f"cannot use {_shown_path(run_dir)} as a run directory: {err.strerror or err}; "
                          "choose another --out") from None
    run_dir = prepare_run_dir(run_dir or default_run_dir(comparison.run_id))
    lock = RunDirLock(run_dir)
    claimed = replace(comparison, run_dir=run_dir, lock=lock, created=created)
    try:
        lock.acquire(command_line())
        claimed = replace(claimed, found=present_run_files(run_dir))  # a refused directory keeps all of it
        check_new_run_dir(run_dir)
    except BaseException:
        claimed.release()
        raise
    return claimed


def _shown_path(path: Path | None, limit: int = 120) -> str:
    """A path for a one-line error, its middle cut out when it is long."""
    text = str(path)
    return text if len(text) <= limit else f"{text[:limit // 2]}…{text[-limit // 2:]} ({len(text)} characters)"


def resolved(spec: Spec, devices: Mapping[str, Mapping[str, Any]], launch: Launch) -> Spec:
    """The spec with what it left open decided for this machine: replicates (GPUs vary most
    between processes) and the seed of the run order: random, so that independent runs do not
    share an order, except across the nodes of one run, which must agree on it."""
    gpu = any(not info["simulated"] for info in devices.values())
    order_seed = spec.seed if launch.multi_node else secrets.randbelow(2**31)
    return replace(spec, protocol=resolve_protocol(spec.protocol, gpu, order_seed))


def start_run(comparison: Comparison, no_verify: bool = False) -> dict[str, Any]:
    """Write run.json before anything runs (a resumed run adds to its "resumed" list);
    returns the host environment."""
    environment = host_environment()
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
    write_json(path, run)
    return environment


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
    launcher.adopt_member_logs(run_dir)
    source = str(run_dir / RUN_FILE)
    try:
        spec = _saved_spec(saved["spec"], source)
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
        ready = ready_backends(spec, Path(tmp), strict_devices=False, launch=launch,
                               startup_timeout_s=startup_timeout_s)
    # The launchers the run started with, so that trial ids (and what counts as done) match.
    launchers = {**ready.launchers, **saved.get("launch", {}).get("backends", {})}
    return Comparison(spec, tuple(ready.entries), ready.devices, run_dir, saved["run_id"],
                      bool(saved.get("breakdown", False)), launch, launchers, ready.lineups, startup_timeout_s, lock)


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
    return not _round_due(comparison, done)


def _round_due(comparison: Comparison, done: set[str]) -> bool:
    """Whether a resumed run would add an adaptive round, judged as `_execute` and
    `_extra_rounds` judge it."""
    protocol = comparison.spec.protocol
    if not adaptive(protocol) or comparison.launch.multi_node:
        return False
    records = read_records(comparison.run_dir)
    found = next_round(plan(comparison), records, protocol, 1)
    budget = Budget(protocol.time_budget_s or 0.0)
    earlier = [r for r in records if r["trial_id"] in done]
    budget.charge(seconds_timing(earlier), len(earlier))
    return bool(found.trials) and budget.affords(len(found.trials))


def _saved_spec(raw: Mapping[str, Any], source: str) -> Spec:
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


def verify_backends(comparison: Comparison, environment: dict[str, Any],
                    progress: VerificationProgress | None = None) -> Verification:
    """Check identical work and real all-reduces for the backends and device counts about to
    be timed (`progress` hears of each reference run); writes verify.json. Arrays stay in a
    temporary directory."""
    with tempfile.TemporaryDirectory(prefix="xbench-verify-") as tmp:
        result = verify(comparison.spec, comparison.entries, comparison.spec.devices, Path(tmp),
                        environment, progress, log_dir=comparison.run_dir, launch=comparison.launch,
                        launchers=comparison.launchers, parallel=parallel_verification(comparison.devices),
                        lineups=comparison.lineups, startup_timeout_s=comparison.startup_timeout_s)
    write_json(comparison.run_dir / VERIFY_FILE, {
        "checks": checks_as_dicts(result.checks),
        "problems": result.problems,
        "failed_backends": sorted(result.failed),
        "rounding_floors": [{"backend": b, "model": m, "floor": f} for (b, m), f in sorted(result.floors.items())],
        "no_floor": [{"backend": b, "model": m, "why": why} for (b, m), why in sorted(result.no_floor.items())],
        "precision_floors": [{"backend": b, "model": m, "precision": p, "gradients": start, "training": steps}
                             for (b, m, p), (start, steps) in sorted(result.precision_floors.items())],
        "unverifiable": result.unverifiable,
    })
    return result


def parallel_verification(devices: Mapping[str, Mapping[str, Any]]) -> int:
    """Worker processes that may verify at once: verification is not timed, so the backends and
    device counts run side by side, a few per core (most of a verification worker's time is
    the framework's import and compilation). Simulated CPU devices share the host's cores,
    so there at most one per core: their collectives wait for each other (pitfall 3)."""
    cores = os.cpu_count() or 1
    if any(info["simulated"] for info in devices.values()):
        return max(1, min(2, cores))
    return max(1, min(8, cores // 4))


def unverified(reason: str) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason}


def execute(comparison: Comparison, environment: dict[str, Any], verification: dict[str, dict[str, Any]],
            listener: Observer | None = None, done: set[str] | frozenset[str] = frozenset()
            ) -> list[Record]:
    """Time every trial of the backends whose verification did not fail; the others get a
    skipped record with the reason; trials in `done` (a resumed run's) are left out.
    Returns the new records, each already in records.jsonl."""
    writer = RecordWriter(comparison.run_dir)
    with (compile_cache(comparison.spec.protocol) as cache_env,
          zygote.fork_servers(comparison.run_dir / launcher.LOG_FILE, comparison.startup_timeout_s,
                              lambda why: _fork_servers_off(comparison.run_dir, listener, why)) as servers):
        ctx = launcher.Context(
            run_id=comparison.run_id,
            run_dir=comparison.run_dir,
            environment=environment,
            write=writer.append,
            annotate=lambda trial: {"verification": verification[trial.implementation]},
            launch=comparison.launch,
            env=cache_env,
            startup_timeout_s=comparison.startup_timeout_s,
            fork_servers=servers,
        )
        return _execute(comparison, ctx, writer, verification, listener, done)


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
             done: set[str] | frozenset[str]) -> list[Record]:
    if listener is not None:
        ctx.listener = listener
    records: list[Record] = []
    everything = plan(comparison)
    positions = {t.id: i for i, t in enumerate(everything)}
    trials = [t for t in everything if t.id not in done]
    for trial in trials:
        if verification[trial.implementation]["status"] == "failed":
            record = (launcher.skipped_record(trial, ctx, "verification failed: " + "; ".join(
                verification[trial.implementation]["failed"])))
            writer.append(record)
            ctx.listener.trial_finished(trial, record)
            records.append(record)
    runnable = [t for t in trials if verification[t.implementation]["status"] != "failed"]
    targets = {e.name: e.target for e in comparison.entries}
    started = time.monotonic()
    records += launcher.run_groups(group_trials(runnable, targets, positions), ctx)
    budget = Budget(comparison.spec.protocol.time_budget_s or 0.0)
    if done:  # a resumed run: what it timed before counts against its budget too
        earlier = [r for r in read_records(comparison.run_dir) if r["trial_id"] in done]
        budget.charge(seconds_timing(earlier), len(earlier))
    budget.charge(time.monotonic() - started, len(runnable))
    timed = [t for t in everything if verification[t.implementation]["status"] != "failed"]
    return records + _extra_rounds(comparison, ctx, timed, budget, listener)


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


def measure_allreduce(entries: Sequence[BackendEntry], device_counts: Sequence[int], platform: str,
                      sizes: Sequence[int], options: Mapping[str, Mapping[str, Any]], log_dir: Path,
                      environment: dict[str, Any], write=None, timeout_s: float = 600,
                      devices: Mapping[str, Mapping[str, Any]] | None = None,
                      launchers: Mapping[str, str] | None = None, launch: Launch | None = None,
                      startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S) -> list[AllReduceRecord]:
    """Each backend's own all-reduce on each device count and buffer size; one record each,
    with the platform the backend found (`devices`, from probe_devices)."""
    records = []
    for entry in entries:
        how = (launchers or {}).get(entry.name, "subprocess")
        for count in device_counts:
            events = launcher.allreduce_events(entry.target, count, platform, list(sizes),
                                               dict(options.get(entry.name, {})), log_dir / launcher.LOG_FILE,
                                               timeout_s, how, launch, startup_timeout_s)
            for event in events:
                info = (devices or {}).get(entry.name) or {}
                record: AllReduceRecord = {
                    "kind": "allreduce", "backend": entry.name, "devices": count, "launcher": how,
                    "platform": "simulated CPU" if info.get("simulated") else info.get("platform"),
                    "nbytes": event["nbytes"], "status": event["status"], "reason": event.get("reason"),
                    "timing": event.get("timing"), "environment": environment}
                if write is not None:
                    write(record)
                records.append(record)
    return records


def breakdown_allreduce(comparison: Comparison, environment: dict[str, Any]) -> list[AllReduceRecord]:
    """--breakdown: the all-reduce at each model's gradient size (and a sweep), multi-device."""
    counts = [n for n in comparison.spec.devices if n > 1]
    if not counts:
        return []
    gradient_bytes = [4 * model.params for model in comparison.spec.models]
    gpu = any(not info["simulated"] for info in comparison.devices.values())
    return measure_allreduce(comparison.entries, counts, comparison.spec.platform, sizes_for(gradient_bytes, gpu),
                             comparison.spec.options, comparison.run_dir, environment,
                             write=RecordWriter(comparison.run_dir, ALLREDUCE_FILE).append,
                             devices=comparison.devices, launchers=comparison.launchers, launch=comparison.launch,
                             startup_timeout_s=comparison.startup_timeout_s)


def plan(comparison: Comparison) -> list:
    """Every trial of the comparison, in order."""
    return plan_trials(comparison.spec, [e.name for e in comparison.entries], comparison.breakdown,
                       comparison.launchers, comparison.lineups)


def trial_count(comparison: Comparison, done: set[str] | frozenset[str] = frozenset()) -> int:
    return len([t for t in plan(comparison) if t.id not in done])



class Observer(launcher.Listener, Protocol):
    """What a run tells whoever watches it (the CLI draws progress and messages from it)."""

    def phase(self, text: str) -> AbstractContextManager[Any]:
        """A stretch of work without per-trial progress (all-reduce timing)."""

    def verifying(self, text: str) -> AbstractContextManager[VerificationProgress]:
        """Verification, which `text` names, runs while this is entered; what it yields hears
        of each reference run."""

    def verified(self, outcome: Mapping[str, Mapping[str, Any]]) -> None:
        """Each backend's verification outcome, before timing starts."""

    def note(self, text: str) -> None:
        """A one-line message for the user."""

    def round_added(self, trials: int, text: str) -> None:
        """An adaptive round of `trials` more trials starts; `text` says why."""


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
    started = time.monotonic()
    done = finished_trials(comparison.run_dir) if resumed else set()
    if resumed and not no_verify and started_without_verify(comparison.run_dir):
        observer.note("the run started with --no-verify: its rest runs without verification too")
        no_verify = True
    environment = start_run(comparison, no_verify)
    outcome = _verification_outcome(comparison, environment, observer, no_verify)
    drift.record(comparison.run_dir, "before")
    records = execute(comparison, environment, outcome, observer, done)
    drift.record(comparison.run_dir, "after")
    allreduce: list[AllReduceRecord] = []
    if comparison.breakdown and resumed and (comparison.run_dir / ALLREDUCE_FILE).exists():
        allreduce = read_records(comparison.run_dir, ALLREDUCE_FILE)  # measured before the interruption
    elif comparison.breakdown:
        with observer.phase("timing each backend's all-reduce at the gradient sizes…"):
            allreduce = breakdown_allreduce(comparison, environment)
    new = len(records)
    if resumed:
        records = read_records(comparison.run_dir)
    failed = [name for name, result in outcome.items() if result["status"] == "failed"]
    return _outcome(records, allreduce, failed, time.monotonic() - started, new)


def recorded(comparison: Comparison) -> Outcome:
    """A complete run's outcome from what it recorded (a --resume with nothing left to run)."""
    run_dir = comparison.run_dir
    allreduce = read_records(run_dir, ALLREDUCE_FILE) if (run_dir / ALLREDUCE_FILE).exists() else []
    return _outcome(read_records(run_dir), allreduce, _failed_verification(run_dir), 0.0, 0)


def _outcome(records: list[Record], allreduce: list[AllReduceRecord], failed_verification: list[str],
             seconds: float, new: int) -> Outcome:
    # A resumed run's retried trials: their latest record counts, not the failure it replaced.
    failed = sum(map(_failed, latest_per_trial(records))) + sum(r["status"] == "failed" for r in allreduce)
    # A program that failed verification and is not timed (the data-parallel one on 1 device,
    # where the plain one is timed) still fails the run.
    timed = {implementation(r["trial"]["backend"], r["trial"]["variant"], r["trial"]["program"]) for r in records}
    untimed_failures = [name for name in failed_verification if name not in timed]
    return Outcome(records, allreduce, failed + len(untimed_failures), seconds, new)


def _failed_verification(run_dir: Path) -> list[str]:
    """The programs verify.json says failed (none without one: a --no-verify run)."""
    try:
        saved = json.loads((run_dir / VERIFY_FILE).read_text(encoding="utf-8"))
        return [str(name) for name in saved.get("failed_backends", [])]
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def _failed(record: Record) -> bool:
    """A trial that failed, or that ran although its program failed verification. "unsupported"
    is a capability the backend lacks (e.g. jax-auto's compute-only twin), not a failure."""
    verification = record.get("verification")
    return (record["status"] not in ("ok", "skipped", "unsupported")
            or (verification is not None and verification.get("status") == "failed"))


def started_without_verify(run_dir: Path) -> bool:
    """Whether a run was started with --no-verify: run.json says so, or (a run from before it
    did) its records were timed unverified for that reason."""
    saved = read_run(run_dir)
    if "no_verify" in saved:
        return saved["no_verify"] is True
    if not (run_dir / RECORDS_FILE).exists():
        return False
    return any(r.get("verification") == unverified("--no-verify") for r in iter_records(run_dir / RECORDS_FILE))


def _verification_outcome(comparison: Comparison, environment: dict[str, Any], observer: Observer,
                          no_verify: bool) -> dict[str, dict[str, Any]]:
    if comparison.launch.multi_node and not no_verify:
        observer.note("verify is not run across nodes; run `xbench verify --launcher spmd` on one node")
        return {name: unverified("multi-node run: run xbench verify on one node")
                for name in comparison.implementations}
    if no_verify:
        return {name: unverified("--no-verify") for name in comparison.implementations}
    with observer.verifying("verifying identical work and all-reduce (skip with --no-verify)") as progress:
        verification = verify_backends(comparison, environment, progress)
    outcome = {name: verification.outcome(name) for name in comparison.implementations}
    observer.verified(outcome)
    return outcome
