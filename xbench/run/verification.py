"""Run verification through worker processes and gather the checks (see xbench.results.checks)."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from xbench.contract import MEMORY_SHARE_VARIABLE, Trial, backend_of_implementation
from xbench.experiment import Spec
from xbench.results.checks import (
    Check,
    Key,
    compared_in_float64,
    distrust_float64,
    failed_backends,
    is_precision_reference,
    is_referee,
    lost_comparisons,
    precision_checks,
    precision_floors,
    referee_checks,
    rounding_floors,
    run_checks,
    verification_precision,
)
from xbench.results.fit import out_of_memory
from xbench.results.full_size import (
    FULL_SIZE,
    FULL_SIZE_REPLICATE,
    NOT_PROBED,
    full_size_checks,
    is_full_size,
    shard_checks,
    unreported_shares,
)
from xbench.results.records import Record
from xbench.run import launcher, zygote
from xbench.run.cluster import Launch
from xbench.run.memory_check import memory_checks
from xbench.run.plan import Lineup
from xbench.run.registry import BackendEntry
from xbench.run.verify_memory import (
    memory_parallel,
    memory_peaks,
    memory_share_environment,
    out_of_memory_beside_others,
)
from xbench.run.verify_plan import (
    borrowed_floors,
    is_low_precision,
    lent_probes,
    probe_borrowers,
    verification_groups,
    verification_trials,
)
from xbench.wire import Reference, load_reference

MISSING = "missing"  # the status of a planned trial that left no record


class Progress(launcher.Listener, Protocol):
    """Whoever watches a verification: told the reference runs it plans, then each run's
    start and end, from several threads at once (runs go side by side)."""

    def planned(self, trials: Sequence[Trial]) -> None:
        """Verification is about to run these trials."""

    def again(self, trials: Sequence[Trial]) -> None:
        """These trials ran out of memory beside others: each runs again, alone."""


@dataclass(frozen=True)
class Verification:
    # Backends are named with their variant and program here ("torch+compile", "jax plain"):
    # each is verified, and blamed, on its own.
    checks: tuple[Check, ...]
    # trial id -> why it produced no verified result: it failed, crashed (a killed worker),
    # timed out or left no record, or the results it was to be compared with did (see `verdict`)
    problems: dict[str, str]
    problem_backends: frozenset[str]  # the owners of `problems`
    unverifiable: dict[str, str]  # backend -> which capability it lacks, or that nothing compared it
    owners: dict[str, str] = field(default_factory=dict)  # trial id of a problem -> its backend
    floors: dict[tuple[str, str], float] = field(default_factory=dict)  # (implementation, model) -> rounding floor
    no_floor: dict[tuple[str, str], str] = field(default_factory=dict)  # (implementation, model) -> why none
    # (backend, model, precision) -> (initial, ten steps) floors of its as-written program in a
    # low precision against float64 (see xbench.results.checks.LOW_PRECISION_FACTOR)
    precision_floors: dict[tuple[str, str, str], tuple[float, float]] = field(default_factory=dict)
    # Programs whose N-device runs did not report their devices' slice losses: their shares of
    # the batch went unchecked (`xbench.results.full_size`)
    shares_unchecked: tuple[str, ...] = ()
    # trial id -> what decided which kernels its run used (`PreparedInfo.settings`): a
    # verification worker may compile differently from a timed one (`CompilesQuickly`)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    # implementation -> the as-written program whose float64 run and floor stand for its own
    # (a variant of the same formula, `verify_plan.borrowed_floors`)
    floor_of: dict[str, str] = field(default_factory=dict)
    # trial id of a full-size probe not run -> why (`unfit_probes`: it would not fit)
    not_probed: dict[str, str] = field(default_factory=dict)
    # implementation -> the as-written program whose full-size probe stands for its own (a
    # variant of the same formula, not sharded: `verify_plan.lent_probes`)
    probe_of: dict[str, str] = field(default_factory=dict)
    # trial id -> the largest of its run's framework peaks over its devices (bytes; GPUs only),
    # and each worker's share of a GPU's memory where several shared one (`memory_share_environment`)
    memory_peaks: dict[str, int] = field(default_factory=dict)
    memory_share: float | None = None

    @property
    def failed(self) -> set[str]:
        """Backends a failed check or a failed verification trial implicates."""
        return failed_backends(self.checks) | set(self.problem_backends)

    def outcome(self, backend: str) -> dict[str, Any]:
        """The verification summary stored in each of the backend's (implementation's)
        records: "passed" only where checks ran and none failed; "failed" where a check failed
        or a result it needed is missing (`problems`); "unverifiable" where it could not run
        or nothing compared its results."""
        mine = [c for c in self.checks if backend in c.backends]
        if backend not in self.failed and (backend in self.unverifiable or not mine):
            why = self.unverifiable.get(backend, "no verification check compared its results")
            return {"status": "unverifiable", "reason": why, "checks": len(mine), "failed": []}
        return {
            "status": "failed" if backend in self.failed else "passed",
            "checks": len(mine),
            "failed": [f"{c.check} ({c.subject}): rel {c.norm_rel:.2e} > {c.tolerance:.1e}"
                       + (f" (floor {c.floor:.1e})" if c.floor is not None else "")
                       for c in mine if not c.passed]
                      + [f"{tid}: {why}" for tid, why in self.problems.items() if self.owners.get(tid) == backend],
        }


def verify(spec: Spec, entries: Sequence[BackendEntry], devices: Sequence[int], work_dir: Path,
           environment: dict[str, Any], progress: Progress | None = None,
           log_dir: Path | None = None, launch: Launch | None = None,
           launchers: Mapping[str, str] | None = None, parallel: int = 1,
           lineups: Mapping[str, Lineup] | None = None,
           startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S, spread: tuple[str, ...] = (),
           device_info: Mapping[str, Mapping[str, Any]] | None = None,
           fork_servers: zygote.ForkServers | None = None) -> Verification:
    """Run every backend's reference steps on 1 and each of `devices` devices, then check.

    Arrays go to `work_dir` (tens of MB for large models: use a temporary directory);
    worker output goes to `log_dir`/workers.log (default `work_dir`). Up to `parallel` worker
    processes run at once (nothing here is timed), several runs each (`verification_groups`),
    forked from a server per backend that imported its framework once (`xbench.run.zygote`;
    `fork_servers`, a run's own, or servers for this verification alone),
    each job's devices starting at its own one of the GPUs `spread`
    (`launcher.spread_environment`); `progress` hears of each run. A full-size
    probe whose estimated memory does not fit its backend's devices (`device_info`, see
    `unfit_probes`) is not run; a run that ran out of memory beside other workers runs again
    alone after them (`out_of_memory_beside_others`)."""
    names = [e.name for e in entries]
    trials = verification_trials(spec, names, devices, launchers, lineups)
    unfit = unfit_probes(trials, lineups or {}, device_info or {}, environment)
    lent = lent_probes(trials, probe_borrowers(names, lineups), unfit)
    by_id = {t.id: t for t in trials}
    probe_of = {by_id[own].implementation: by_id[base].implementation for own, base in lent.items()}
    trials = [t for t in trials if t.id not in lent]
    to_run = [t for t in trials if t.id not in unfit]
    gpus, widest = max(1, len(spread)), max((t.devices for t in to_run), default=1)
    checks = memory_checks(to_run, lineups or {}, device_info or {}, environment)
    held = memory_parallel(checks, gpus, widest)
    # Where memory sets how many run at once, each worker is held to its share of it.
    capped, parallel = held is not None and held < parallel, min(parallel, held or parallel)
    records: list[Record] = []
    run_dir = log_dir or work_dir
    groups = verification_groups(to_run, {e.name: e.target for e in entries}, parallel)
    share = memory_share_environment(checks, min(parallel, len(groups)), gpus, widest) if capped else {}
    with (contextlib.nullcontext(fork_servers) if fork_servers is not None
          else zygote.fork_servers(Path(run_dir) / launcher.LOG_FILE, startup_timeout_s)) as servers:
        ctx = launcher.Context(run_id="verify", run_dir=run_dir, environment=environment,
                               write=records.append, arrays_dir=Path(work_dir),
                               shard_counts=tuple(sorted({n for n in devices if n > 1})),
                               launch=launch or Launch(), startup_timeout_s=startup_timeout_s, spread_gpus=spread,
                               fork_servers=servers, env=share)
        records += [launcher.skipped_record(t, ctx, unfit[t.id]) for t in trials if t.id in unfit]
        if progress is not None:
            progress.planned(to_run)
            ctx.listener = progress
        launcher.start_fork_servers(groups, ctx)
        launcher.run_groups(groups, ctx, parallel)
        alone = out_of_memory_beside_others(groups, records, parallel)
        if alone and progress is not None:
            progress.again([group.trials[0] for group in alone])
        # Alone, a run has its devices' memory to itself; its new records replace the failed ones
        # (`_sorted_records`).
        launcher.run_groups(alone, replace(ctx, env=without(ctx.env, MEMORY_SHARE_VARIABLE)), 1)
    return replace(verdict(spec, names, trials, records, probe_of), not_probed=unfit,
                   memory_peaks=memory_peaks(records),
                   memory_share=float(share[MEMORY_SHARE_VARIABLE]) if share else None)


def without(env: Mapping[str, str], name: str) -> dict[str, str]:
    return {key: value for key, value in env.items() if key != name}


def unfit_probes(trials: Sequence[Trial], lineups: Mapping[str, Lineup], devices: Mapping[str, Mapping[str, Any]],
                 environment: Mapping[str, Any]) -> dict[str, str]:
    """Trial id -> why, for each full-size probe whose estimated memory per device passes its
    backend's device memory (`memory_check.device_memory_bytes`: the GPUs', or
    XBENCH_DEVICE_MEMORY_GIB): its worker would build the full model's weights only to run out
    of memory (on the host first, for a simulated device), and timing skips the model there
    too. The probe is the full model at a few samples per device: what does not fit at that
    batch fits at none."""
    probes = [t for t in trials if is_full_size({"replicate": t.replicate})]
    checks = memory_checks(probes, lineups, devices, environment)
    return {t.id: f"{NOT_PROBED}: {check.reason}" for t in probes
            if (check := checks.get(t.config_id)) is not None and not check.fits}


def verdict(spec: Spec, names: Sequence[str], trials: Sequence[Trial], records: Sequence[Record],
            probe_of: Mapping[str, str] | None = None) -> Verification:
    """The checks over the records of the planned verification `trials`, and each program's
    standing. The outcome is computed from what ran: a planned trial without an ok record
    (failed, crashed, killed, timed out, or no record at all) is a problem of its program; so
    is a result whose checks lost what they compare it with, and a program that nothing
    compared is never "passed". A program whose full-size probe another's stands for
    (`probe_of`, `verify_plan.lent_probes`) shares that probe's failures (`_lent_failures`)."""
    runs = _sorted_records(records, trials)
    reference = next((n for n in names if n not in runs.unverifiable), names[0])
    per_device = {m.name for m in spec.models if m.kind.batch_statistics}
    float64 = {m.name for m in spec.models if verification_precision(m) == "fp64"}
    floors, rejected = rounding_floors(runs.refs, runs.referees)
    float64_checks = referee_checks({key: runs.referees[key] for key in floors}, reference)
    borrowed = borrowed_floors(trials)
    held, compared = _with_borrowed(floors, compared_in_float64(float64_checks), borrowed)
    checks = run_checks(runs.refs, reference_backend=reference, per_device_statistics=per_device,
                        float64=float64, floors=held, compared=compared)
    # A low-precision program shares its backend's model code: where the backend's own program
    # failed a check, the float64 run it would be measured against is no yardstick.
    failing = failed_backends(checks + float64_checks)
    exact, no_exact = _float64_runs(runs, floors, rejected, float64, per_device, failing)
    low_floors, low_rejected = precision_floors(runs.precision_refs, exact)
    low_checks, unchecked = precision_checks(runs.programs, exact, low_floors,
                                             {**runs.no_precision_ref, **low_rejected}, no_exact, float64, per_device)
    checks += float64_checks + low_checks + _size_and_share_checks(runs, reference, per_device)
    problems, owners = dict(runs.problems), dict(runs.owners)
    for low_key, why in unchecked.items():
        problems[runs.trial_ids[low_key]], owners[runs.trial_ids[low_key]] = why, low_key[0]
    untested, unpartnered = lost_comparisons(runs.expected, runs.refs, reference, per_device)
    for key, lost in untested.items():
        problems[runs.trial_ids[key]], owners[runs.trial_ids[key]] = runs.lost(lost), key[0]
    unverifiable = {**runs.too_large, **runs.unverifiable}
    checked = {name for c in checks for name in c.backends}
    for name in dict.fromkeys(key[0] for key in [*runs.refs, *runs.programs]):
        if name in checked or name in owners.values() or name in unverifiable:
            continue
        mine = [key for key in runs.refs if key[0] == name and key in unpartnered]
        if mine:  # only the results that would have been compared with it are missing
            tid = runs.trial_ids[mine[0]]
            problems[tid], owners[tid] = runs.lost([item for key in mine for item in unpartnered[key]]), name
        else:
            unverifiable[name] = "nothing to compare it with (one program on one device: no other result of its models)"
    no_floor = {key: why for key, why in {**runs.no_referee, **rejected}.items() if key[0] not in runs.unverifiable}
    _lent_failures(probe_of or {}, checks, problems, owners, unverifiable, runs.too_large,
                   {t.id for t in trials if t.replicate == FULL_SIZE_REPLICATE})
    return Verification(tuple(checks), problems, frozenset(owners.values()), unverifiable, owners, floors, no_floor,
                        low_floors, tuple(sorted(unreported_shares({**runs.refs, **runs.probes}))),
                        kernel_settings(records), {key[0]: base[0] for key, base in borrowed.items()},
                        probe_of=dict(probe_of or {}))


def _lent_failures(probe_of: Mapping[str, str], checks: Sequence[Check], problems: dict[str, str],
                   owners: dict[str, str], unverifiable: dict[str, str], too_large: Mapping[str, str],
                   probe_ids: Collection[str]) -> None:
    """A lent probe's failures are its borrowers' too (in place): each full-size check its
    program fails, each problem of its probe runs (crashed, out of memory), a model too large
    to probe. Without this a borrower would pass where the probe standing for it failed."""
    lenders: dict[str, list[str]] = {}
    for borrower, base in sorted(probe_of.items()):
        lenders.setdefault(base, []).append(borrower)
    full = [c for c in checks if c.check.startswith(FULL_SIZE) or " (full size):" in c.subject]
    for base in sorted(failed_backends(full) & lenders.keys()):
        why = "; ".join(f"{c.check} ({c.subject})" for c in full if base in c.backends and not c.passed)
        for borrower in lenders[base]:
            key = f"{borrower}: full size"
            problems[key], owners[key] = f"the full-size probe of {base}, which stands for it, failed: {why}", borrower
    for tid, owner in list(owners.items()):
        if tid in probe_ids and owner in lenders:
            for borrower in lenders[owner]:
                problems[f"{tid} (for {borrower})"], owners[f"{tid} (for {borrower})"] = problems[tid], borrower
    for base in lenders.keys() & too_large.keys():
        for borrower in lenders[base]:
            unverifiable.setdefault(borrower, too_large[base])


def _with_borrowed(floors: Mapping[tuple[str, str], float], compared: Collection[tuple[str, str]],
                   borrowed: Mapping[tuple[str, str], tuple[str, str]]
                   ) -> tuple[dict[tuple[str, str], float], set[tuple[str, str]]]:
    """The floors and float64-compared programs with each borrower (`borrowed_floors`) standing
    where its as-written program stands: its floor if it has one, compared if it was."""
    held = {**floors, **{key: floors[base] for key, base in borrowed.items() if base in floors}}
    return held, {*compared, *(key for key, base in borrowed.items() if base in compared)}


def kernel_settings(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    """Each verification run's kernel settings, by trial id (those that reported some)."""
    return {r["trial_id"]: dict(r["backend"]["settings"]) for r in records
            if "settings" in r.get("backend", {})}


def _size_and_share_checks(runs: _Runs, reference: str, per_device: Collection[str]) -> list[Check]:
    """The full-size probes compared, and each device's share at both sizes
    (`xbench.results.full_size`)."""
    trained = {**runs.refs, **{key[:3]: ref for key, ref in runs.programs.items()}}
    return (full_size_checks(runs.probes, runs.probe_precisions, reference, per_device)
            + shard_checks(trained, runs.precisions, "")
            + shard_checks(runs.probes, runs.probe_precisions, " (full size)"))


def _float64_runs(runs: _Runs, floors: Mapping[tuple[str, str], float], rejected: Mapping[tuple[str, str], str],
                  float64: Collection[str], per_device: Collection[str], failing: Collection[str] = ()
                  ) -> tuple[dict[tuple[str, int, str], Reference], dict[tuple[str, int, str], str]]:
    """For each low-precision program's backend: its trusted float64 run of the as-written
    data-parallel program, (backend, devices, model) -> run (on 1 device, or each device count
    of a family verified in float64 that normalises per device), and -> why there is none."""
    found: dict[tuple[str, int, str], Reference] = {}
    why_not: dict[tuple[str, int, str], str] = {}
    for name, devices, model, _ in runs.programs:
        backend = backend_of_implementation(name)
        key = (backend, devices if model in per_device else 1, model)
        if key in found or key in why_not:
            continue
        if backend in failing:
            why_not[key] = f"{backend}, whose model it shares, failed its own checks"
            continue
        if model in float64:  # verified in float64: the run itself
            run = runs.refs.get(key)
            untrusted = distrust_float64(run) if run is not None else None
            why = (f"{backend}'s float64 run {runs.status(key)}" if run is None
                   else f"{backend}'s float64 run is not trusted: {untrusted}" if untrusted else None)
        elif key[1] != 1:
            run, why = None, f"{backend} has no float64 run of {model} on d{key[1]} ({model} normalises per device)"
        else:
            run = runs.referees.get((backend, model))
            if run is None:
                why = f"{backend}'s float64 run {runs.status((backend, model))}"
            elif (backend, model) in rejected:
                why = f"{backend}'s float64 run is not trusted: {rejected[(backend, model)]}"
            elif (backend, model) not in floors:
                why = f"{backend}'s fp32 run, where its float64 run must start, {runs.status(key)}"
            else:
                why = None
        if why:
            why_not[key] = why
        elif run is not None:  # always so without a why
            found[key] = run
    return found, why_not


@dataclass
class _Runs:
    """The verification records sorted: fp32 (or the family's precision) references, float64
    referees, low-precision programs and their backends' reference runs, and what failed or
    could not run."""

    refs: dict = field(default_factory=dict)  # (implementation, devices, model) -> Reference
    referees: dict = field(default_factory=dict)  # (implementation, model) -> its float64 Reference
    no_referee: dict = field(default_factory=dict)  # (implementation, model) -> why its float64 run failed
    programs: dict = field(default_factory=dict)  # (implementation, devices, model, precision) -> Reference
    precision_refs: dict = field(default_factory=dict)  # (backend, model, precision) -> its as-written run there
    no_precision_ref: dict = field(default_factory=dict)  # (backend, model, precision) -> why it has none
    problems: dict = field(default_factory=dict)  # trial id -> why it produced no reference
    owners: dict = field(default_factory=dict)  # trial id of a problem -> its implementation
    unverifiable: dict = field(default_factory=dict)  # implementation -> the capability it lacks
    expected: set = field(default_factory=set)  # keys of `refs` whose trials ran or should have
    trial_ids: dict = field(default_factory=dict)  # a key of refs, referees or programs -> its trial id
    statuses: dict = field(default_factory=dict)  # trial id -> "status: reason" of one without a result
    probes: dict = field(default_factory=dict)  # (implementation, devices, model) -> its full-size probe
    probe_precisions: dict = field(default_factory=dict)  # the same key -> the probe's precision
    precisions: dict = field(default_factory=dict)  # (implementation, devices, model) of a trained run -> its precision
    too_large: dict = field(default_factory=dict)  # implementation -> why a model was too large to probe

    def status(self, key: tuple) -> str:
        """What became of the trial of `key`, for a message."""
        tid = self.trial_ids.get(key)
        return "was not planned" if tid is None else f"{tid} has no result ({self.statuses.get(tid, 'none')})"

    def lost(self, items: Sequence[tuple[str, Key]]) -> str:
        """Why a result is not verified: the results its checks needed are missing."""
        by_key: dict[Key, list[str]] = {}
        for check, key in items:
            by_key.setdefault(key, []).append(check)
        return "not verified: " + "; ".join(
            f"{key[0]} d{key[1]} has no result ({self.trial_ids.get(key)} {self.statuses.get(self.trial_ids.get(key))})"
            f", so {' and '.join(repr(c) for c in dict.fromkeys(checks))} did not run"
            for key, checks in by_key.items())


def _sorted_records(records: Sequence[Record], planned: Sequence[Trial] = ()) -> _Runs:
    """The records of the `planned` trials (default: those of `records`) by role; a planned
    trial without a record counts as one that produced nothing ("missing")."""
    runs, ran = _Runs(), set()
    unsupported: dict[str, str] = {}  # implementation -> why it ran none of its trials
    by_id = {record["trial_id"]: record for record in records}
    for trial in planned or [Trial.from_dict(record["trial"]) for record in records]:
        record = by_id.get(trial.id) or {"status": MISSING, "reason": "its worker ended without reporting it"}
        name, status, model = trial.implementation, record["status"], trial.model.name
        reason = f"{status}: {record['reason']}"
        stored = {"precision": trial.precision, "replicate": trial.replicate}
        if status != "ok":
            runs.statuses[trial.id] = reason
        if is_full_size(stored):
            _sort_probe(runs, trial, record, reason)
            continue
        if is_referee(stored):
            runs.trial_ids[(name, model)] = trial.id
            if status == "ok":
                runs.referees[(name, model)] = load_reference(Path(record["arrays"]))
            elif status in ("crashed", "timeout", MISSING):  # a killed worker is a failure, not a missing floor
                runs.problems[trial.id], runs.owners[trial.id] = reason, name
            elif status != "skipped":
                runs.no_referee[(name, model)] = reason
        elif is_precision_reference(stored):
            precision_key = (trial.backend, model, trial.precision)
            runs.trial_ids[precision_key] = trial.id
            if status == "ok":
                runs.precision_refs[precision_key] = load_reference(Path(record["arrays"]))
            else:  # the programs it serves are not verified (`precision_checks`), whoever owns them
                runs.no_precision_ref[precision_key] = f"its {trial.precision} run {trial.id} has no result ({reason})"
        else:
            low = is_low_precision(trial)
            key = (name, trial.devices, model, trial.precision) if low else (name, trial.devices, model)
            runs.trial_ids[key] = trial.id
            runs.precisions[key[:3]] = trial.precision
            if status not in ("skipped", "unsupported") and not low:
                runs.expected.add(key)
            if status == "ok":
                (runs.programs if low else runs.refs)[key] = load_reference(Path(record["arrays"]))
            elif status == "unsupported":
                unsupported.setdefault(name, record["reason"] or "unsupported")
            elif status != "skipped":  # skipped: devices this machine lacks (their timing is skipped too)
                runs.problems[trial.id], runs.owners[trial.id] = reason, name
            if status != "unsupported":
                ran.add(name)
    # A variant that runs for some models only (cuDNN attention, channels-last) is verified on
    # those; it is unverifiable only where it runs for none.
    runs.unverifiable.update({name: why for name, why in unsupported.items() if name not in ran})
    return runs


def _sort_probe(runs: _Runs, trial: Trial, record: Mapping[str, Any], reason: str) -> None:
    """A full-size probe's result, or why it has none: too large to run here (out of memory,
    which timing would hit too) leaves its program unverifiable; any other failure fails it."""
    key = (trial.implementation, trial.devices, trial.model.name)
    runs.probe_precisions[key] = trial.precision
    if record["status"] == "ok":
        runs.probes[key] = load_reference(Path(record["arrays"]))
    elif str(record.get("reason") or "").startswith(NOT_PROBED):
        runs.too_large.setdefault(trial.implementation, f"{trial.model.name} on {trial.devices} device(s): "
                                  f"{record['reason']}")
    elif record["status"] in ("skipped", "unsupported"):
        return
    elif out_of_memory(reason):
        runs.too_large.setdefault(trial.implementation, f"{trial.model.name} is too large to verify on "
                                  f"{trial.devices} device(s) here: {reason}")
    else:
        runs.problems[trial.id], runs.owners[trial.id] = f"full-size probe {reason}", trial.implementation


def checks_as_dicts(checks: Sequence[Check]) -> list[dict[str, Any]]:
    return [{**asdict(c), "passed": c.passed} for c in checks]
