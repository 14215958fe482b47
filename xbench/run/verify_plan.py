"""The trials `xbench verify` runs: every program on 1..N devices in strict precision, their
float64 referees, and the low-precision reference runs (see `xbench.results.checks`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from math import ceil

from xbench.contract import AS_WRITTEN, DATA_PARALLEL, TimingProtocol, Trial, Variant
from xbench.experiment import Spec
from xbench.models.model_spec import ModelSpec
from xbench.results.checks import (
    PRECISION_REFERENCE_REPLICATES,
    REFEREE_PRECISION,
    REFEREE_REPLICATE,
    VERIFY_BATCHES,
    VERIFY_STEPS,
    is_referee,
    verification_model,
    verification_precision,
)
from xbench.results.full_size import FULL_SIZE_REPLICATE, full_size_model
from xbench.run.plan import Group, Lineup


def verification_trials(spec: Spec, backends: Sequence[str], devices: Sequence[int],
                        launchers: Mapping[str, str] | None = None,
                        lineups: Mapping[str, Lineup] | None = None) -> list[Trial]:
    """One trial per backend x variant x program x device count (1 always included; the plain
    program on 1 only) x model: dropout off, strict fp32 (a variant that runs only in lower
    precisions: the first it lists, `program_precision`), a global batch that every device
    count divides; one step per call, or two calls of `VERIFY_STEPS // 2` fused steps for a
    variant that fuses steps; each backend started by its launcher in `launchers` (default
    subprocess), with the variants and programs in `lineups` (default: as written,
    data-parallel). Then the float64 referees (`referee_trials`) and, for low-precision
    programs, their backends' reference runs in that precision (`precision_reference_trials`)."""
    counts = sorted(set(devices) | {1})
    protocol = TimingProtocol(warmup_steps=0, steps=VERIFY_STEPS, repeats=2, steps_per_call=1,
                        trial_timeout_s=spec.protocol.trial_timeout_s)
    models = [verification_model(m, counts) for m in spec.models]
    full = {reduced: full_size_model(m, counts) for m, reduced in zip(spec.models, models)}
    trials = []
    for backend in backends:
        lineup = (lineups or {}).get(backend, Lineup())
        for variant in lineup.variants:
            fused = replace(protocol, steps_per_call=VERIFY_STEPS // 2) if variant.steps_per_call else protocol
            trials += [
                Trial(backend=backend, model=model, devices=n, global_batch=model.batch_sizes[0], scaling="strong",
                      precision=program_precision(variant, model), platform=spec.platform,
                      learning_rate=spec.learning_rate, seed=spec.seed,
                      samples=model.batch_sizes[0] * VERIFY_BATCHES, protocol=fused,
                      options=dict(spec.options.get(backend, {})),
                      launcher=(launchers or {}).get(backend, "subprocess"), variant=variant.name, program=program)
                for n in counts for program in lineup.verified_programs(n, variant) for model in models
                if builds(variant, model)
            ]
    trials += _as_written_for_low_precision(trials, protocol)
    same = {(backend, v.name) for backend in backends
            for v in (lineups or {}).get(backend, Lineup()).variants if v.same_formula}
    return trials + referee_trials(trials, same) + precision_reference_trials(trials) + probe_trials(trials, full)


def probe_trials(trials: Sequence[Trial], full: Mapping[ModelSpec, ModelSpec | None]) -> list[Trial]:
    """For each program, device count and model that verify trains reduced: the full-size
    probe (`xbench.results.full_size`), the loss and gradients at the start and no step, in
    the precision the program is verified in (some are lent out instead: `lent_probes`)."""
    return [replace(t, model=model, global_batch=model.batch_sizes[0], samples=model.batch_sizes[0],
                    replicate=FULL_SIZE_REPLICATE, protocol=replace(t.protocol, steps=0, steps_per_call=1))
            for t in trials if t.replicate == 0 and (model := full.get(t.model)) is not None]


def probe_borrowers(backends: Sequence[str], lineups: Mapping[str, Lineup] | None) -> set[tuple[str, str]]:
    """(backend, variant) of the variants that may use their as-written program's full-size
    probe: the same formula (`Variant.same_formula`) with their program's parameter layout (not
    `sharded`). Such a variant runs that program's model code, so what only the full size
    shows (a block past the reduced depth, a weight of the wrong width) shows in that program's
    probe, and how it runs the code (compiled, captured in a graph, recomputed) was checked on
    the reduced instance. A sharded variant lays its parameters out by the size: it is probed."""
    return {(backend, v.name) for backend in backends for v in (lineups or {}).get(backend, Lineup()).variants
            if v.same_formula and not v.sharded}


def lent_probes(trials: Sequence[Trial], borrowers: Collection[tuple[str, str]],
                not_run: Collection[str] = ()) -> dict[str, str]:
    """Trial id of each full-size probe left out -> the id of the as-written program's probe
    that stands for it: the probes of variants in `borrowers` (`probe_borrowers`) whose
    as-written program's probe of the same device count, model and precision is planned and
    runs (its id not in `not_run`: it would not fit; the variant's own may, and then runs)."""
    probes = {_probe_key(t): t for t in trials if t.replicate == FULL_SIZE_REPLICATE and t.id not in not_run}
    lent = {}
    for probe in probes.values():
        base = probes.get(_probe_key(_as_written(probe)))
        if (probe.backend, probe.variant) in borrowers and probe.variant != AS_WRITTEN and base is not None:
            lent[probe.id] = base.id
    return lent


def _probe_key(trial: Trial) -> tuple[str, int, str, str]:
    """What tells a program's full-size probe from another's (trial ids leave the precision out)."""
    return trial.implementation, trial.devices, trial.model.name, trial.precision


def builds(variant: Variant, model: ModelSpec) -> bool:
    """Whether a variant builds a model's family (one that declares its `families` refuses
    the others, and verify plans no run only to hear that)."""
    return variant.families is None or model.family in variant.families


def program_precision(variant: Variant, model: ModelSpec) -> str:
    """The precision verify runs a variant's programs in: the model's `verification_precision`,
    unless the variant runs only in others (`Variant.precisions`): then the first of those
    that is a spec precision (see LOW_PRECISION_FACTOR)."""
    precision = verification_precision(model)
    listed = variant.precisions
    if not listed or precision in listed:
        return precision
    return next((p for p in listed if p in PRECISION_REFERENCE_REPLICATES), precision)


def is_low_precision(trial: Trial) -> bool:
    """Whether a planned verification trial is a program verified in a lower precision than
    its model's (checked against float64 by `precision_checks`)."""
    return trial.precision != verification_precision(trial.model) and trial.replicate == 0


def _as_written_for_low_precision(trials: Sequence[Trial], protocol: TimingProtocol) -> list[Trial]:
    """The as-written data-parallel trial on 1 device, in the model's verification precision,
    of each backend and model that has low-precision programs, where the lineup left it out:
    its float64 run (or, for a family verified in float64, itself) is their R_f64."""
    have = {(t.backend, t.model, t.launcher) for t in trials
            if (t.variant, t.program, t.devices, t.precision) == (AS_WRITTEN, DATA_PARALLEL, 1,
                                                                  verification_precision(t.model))}
    added: dict[tuple[str, ModelSpec, str], Trial] = {}
    for t in trials:
        if is_low_precision(t) and (t.backend, t.model, t.launcher) not in have:
            added.setdefault((t.backend, t.model, t.launcher), replace(
                t, devices=1, precision=verification_precision(t.model), variant=AS_WRITTEN, program=DATA_PARALLEL,
                protocol=protocol))
    return list(added.values())


def referee_trials(trials: Sequence[Trial], same_formula: Collection[tuple[str, str]] = ()) -> list[Trial]:
    """For each program and variant on 1 device, of each model verified in fp32: the same
    trial in float64, whose distance from the fp32 run is the program's rounding floor (see
    FLOOR_FACTOR). A program that cannot run float64 just has no floor. A variant in
    `same_formula` ((backend, variant): `Variant.same_formula`) gets none where its as-written
    program gets one: it borrows that one's floor (`borrowed_floors`)."""
    fp32 = [t for t in trials
            if t.devices == 1 and t.precision == "fp32" and verification_precision(t.model) == "fp32"]
    own = {_as_written(t).id for t in fp32 if t.variant == AS_WRITTEN}
    return [replace(t, precision=REFEREE_PRECISION, replicate=REFEREE_REPLICATE) for t in fp32
            if (t.backend, t.variant) not in same_formula or _as_written(t).id not in own]


def borrowed_floors(trials: Sequence[Trial]) -> dict[tuple[str, str], tuple[str, str]]:
    """(implementation, model) of each program planned in fp32 on 1 device without a float64
    referee of its own (`referee_trials`: a variant of the same formula) -> that of its
    as-written program, whose referee's floor and float64 checks stand for it. Dropping a
    variant's referee so loses one check: its float64 ten steps against its backend's at
    FLOAT64_TOLERANCES, i.e. a formula slip smaller than its fp32 ten-step tolerance; its fp32
    initial gradients are still held to the fixed tolerance, its ten steps to its as-written
    program's floor (FLOOR_FACTOR)."""
    refereed = {replace(t, precision="fp32", replicate=0).id for t in trials if is_referee(_stored(t))}
    return {(t.implementation, t.model.name): (_as_written(t).implementation, t.model.name) for t in trials
            if t.devices == 1 and t.replicate == 0 and t.precision == "fp32" and t.variant != AS_WRITTEN
            and verification_precision(t.model) == "fp32" and t.id not in refereed
            and _as_written(t).id in refereed}


def _as_written(trial: Trial) -> Trial:
    """The same trial of the backend's as-written program (same program, protocol aside)."""
    return replace(trial, variant=AS_WRITTEN)


def _stored(trial: Trial) -> dict[str, object]:
    return {"precision": trial.precision, "replicate": trial.replicate}


def precision_reference_trials(trials: Sequence[Trial]) -> list[Trial]:
    """For each backend, model and low precision that a program is verified in
    (`is_low_precision`): the backend's as-written data-parallel program on 1 device in that
    precision, whose distance from its float64 run is the precision's floor (see
    LOW_PRECISION_FACTOR). Its replicate number is the precision's own
    (`PRECISION_REFERENCE_REPLICATES`), so that its id collides with no other trial's."""
    found: dict[tuple[str, ModelSpec, str, str], Trial] = {}
    for t in trials:
        if is_low_precision(t):
            key = (t.backend, t.model, t.launcher, t.precision)
            found.setdefault(key, replace(t, devices=1, variant=AS_WRITTEN, program=DATA_PARALLEL,
                                          replicate=PRECISION_REFERENCE_REPLICATES[t.precision],
                                          protocol=replace(t.protocol, steps_per_call=1)))
    return list(found.values())


# Verification's worker processes: at least this many per worker it runs at once (see
# `verification_groups`), twice as many with 4 slots or more: there a worker's start costs
# less than the tail its last wave leaves. On one H200 (16 cores, 8 slots), GPT-2 small's
# and ResNet-50's 70 runs in 15 workers of about 5 took 349 s, with the runs' own seconds
# spread over 8 slots 179 s.
GROUPS_PER_SLOT = 2


def groups_per_slot(parallel: int) -> int:
    return GROUPS_PER_SLOT if parallel < 4 else 2 * GROUPS_PER_SLOT


def verification_groups(trials: Sequence[Trial], targets: Mapping[str, str], parallel: int) -> list[Group]:
    """The worker processes that run verification's `trials`, up to `parallel` at once; the
    longest (most trials) first, so that the short ones fill the slots the long ones leave.

    A worker's start (the framework's import, its device context) costs seconds, as much as
    one of verification's small runs, so here every trial of one backend, device count and
    launcher may share a worker, whatever its replicate number (fp32 run, float64 referee,
    low-precision reference, full-size probe), variant, program, model or precision: each
    backend sets every per-trial setting in `prepare` (precision flags, x64 mode scoped to the
    trial's calls, dtype policies, tuning flags; its tests show an fp32 run after a float64 one
    in the same process bit for bit unchanged), and the worker makes it forget each trial
    (`xbench.worker.main.run_trials`). Timing keeps one replicate per process, for the
    variation between processes it measures; nothing here is timed.

    Each such backend's trials are dealt in turn to as few workers as keep `groups_per_slot`
    workers per parallel slot: fewer workers would leave slots idle while the last, longest
    ones finish; dealt in turn, so that the costly kinds (compiled variants, probes) spread
    over them. A trial's position (`Group.positions`, which picks the GPU its job starts on,
    `launcher.spread_environment`) is its worker's index in this order, plus a multiple of the
    number of workers for later trials: the first workers start on the GPUs in turn."""
    by_process: dict[tuple, list[Trial]] = {}
    for trial in trials:
        by_process.setdefault((trial.backend, trial.devices, trial.launcher), []).append(trial)
    cap = max(1, ceil(len(trials) / (groups_per_slot(parallel) * max(1, parallel))))
    shares = [items[start::workers] for items in by_process.values()
              for workers in [ceil(len(items) / cap)] for start in range(workers)]
    shares.sort(key=len, reverse=True)  # stable: plan order among equals
    return [Group(share[0].backend, targets[share[0].backend], share[0].devices, tuple(share), share[0].launcher,
                  tuple(index + turn * len(shares) for turn in range(len(share))))
            for index, share in enumerate(shares)]
