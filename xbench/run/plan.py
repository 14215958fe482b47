"""From a spec to the list of trials, grouped by the worker process that will run them."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from xbench.contract import AS_WRITTEN, DATA_PARALLEL, Trial, Variant
from xbench.contract.timing import TimingProtocol
from xbench.contract.work import data_samples
from xbench.experiment import Spec

AS_WRITTEN_VARIANT = Variant(AS_WRITTEN, "the program as the framework's docs teach it")


@dataclass(frozen=True)
class Lineup:
    """What a backend times: its variants (as written first) and its 1-device programs."""

    variants: tuple[Variant, ...] = (AS_WRITTEN_VARIANT,)
    single_device: tuple[str, ...] = (DATA_PARALLEL,)  # the programs timed on 1 device

    def programs(self, devices: int, variant: Variant | None = None) -> tuple[str, ...]:
        """The programs timed on `devices` devices (of `variant`: those it is a variant of)."""
        return _of(variant, self.single_device if devices == 1 else (DATA_PARALLEL,))

    def verified_programs(self, devices: int, variant: Variant | None = None) -> tuple[str, ...]:
        """The programs verified: on 1 device the data-parallel one always (the reference for
        N devices = 1 device), and the plain one when it is timed; of `variant`, those it is a
        variant of."""
        return _of(variant, tuple(dict.fromkeys((DATA_PARALLEL, *self.programs(devices)))))


def _of(variant: Variant | None, programs: tuple[str, ...]) -> tuple[str, ...]:
    """The `programs` that `variant` applies to (`Variant.programs`; every one without a variant)."""
    if variant is None or variant.programs is None:
        return programs
    return tuple(p for p in programs if p in variant.programs)


def variant_protocol(protocol: TimingProtocol, variant: Variant) -> TimingProtocol:
    """A variant's timing protocol: its fused steps per call (windows a whole number of calls)
    and at least its own warm-up."""
    per_call = variant.steps_per_call or protocol.steps_per_call
    steps = -(-protocol.steps // per_call) * per_call
    warmup = max(protocol.warmup_steps, variant.warmup_steps or 0)
    return replace(protocol, steps_per_call=per_call, steps=steps, warmup_steps=warmup)


@dataclass(frozen=True)
class Group:
    """Trials one worker process runs in turn: one backend, device count and launcher; of one
    replicate when timed (`group_trials`), of several in verification
    (`verify_plan.verification_groups`)."""

    backend: str
    target: str  # the backend's entry-point value, imported by the worker
    devices: int
    trials: tuple[Trial, ...]
    launcher: str = "subprocess"
    positions: tuple[int, ...] = ()  # each trial's place in the whole plan


def plan_trials(spec: Spec, backends: Sequence[str], breakdown: bool = False,
                launchers: Mapping[str, str] | None = None,
                lineups: Mapping[str, Lineup] | None = None) -> list[Trial]:
    """Every backend x device count x model x batch size x variant x program x replicate, in
    the order they will run; with `breakdown`, each multi-device trial is followed by its
    compute-only twin. `launchers` maps a backend to the launcher that starts it (default
    subprocess), `lineups` to its variants and programs (default: as written, data-parallel).

    Replicates run in rounds: round r times replicate r of every configuration. Within a
    round the worker processes (backend x device count) come in a shuffled order, and each
    runs its configurations in a shuffled order, both drawn from `protocol.order_seed`, so
    that slow drift of the machine spreads over all configurations instead of landing on one.
    """
    rng = random.Random(spec.protocol.order_seed)
    rounds = []
    for replicate in range(spec.protocol.replicates or 1):
        groups = [_configurations(spec, backend, devices, breakdown, launchers, replicate,
                                  (lineups or {}).get(backend, Lineup()))
                  for backend in backends for devices in spec.devices]
        rng.shuffle(groups)
        for configurations in groups:
            rng.shuffle(configurations)
        rounds += [trial for configurations in groups for unit in configurations for trial in unit]
    return rounds


def _configurations(spec: Spec, backend: str, devices: int, breakdown: bool, launchers: Mapping[str, str] | None,
                    replicate: int, lineup: Lineup) -> list[list[Trial]]:
    """One worker process's configurations, each a unit of its trial and (with `breakdown`)
    its compute-only twin right after it, so that both share the process."""
    units = []
    cases = [(model, batch, variant, program) for model in spec.models for batch in model.batch_sizes
             for variant in lineup.variants for program in lineup.programs(devices, variant)]
    for model, batch, variant, program in cases:
        trial = Trial(
            backend=backend,
            model=model,
            devices=devices,
            global_batch=spec.global_batch(batch, devices),
            scaling=spec.scaling,
            precision=spec.precision,
            platform=spec.platform,
            learning_rate=spec.learning_rate,
            seed=spec.seed,
            samples=data_samples(model, spec.data.samples, spec.global_batch(batch, devices)),
            protocol=variant_protocol(spec.protocol, variant),
            options=dict(spec.options.get(backend, {})),
            launcher=(launchers or {}).get(backend, "subprocess"),
            replicate=replicate,
            variant=variant.name,
            program=program,
        )
        twin = [replace(trial, all_reduce=False)] if breakdown and devices > 1 else []
        units.append([trial, *twin])
    return units


def group_trials(trials: Sequence[Trial], targets: dict[str, str],
                 positions: Mapping[str, int] | None = None) -> list[Group]:
    """Consecutive trials of one backend, device count, launcher and replicate share a worker
    process. `positions` gives each trial's place in the whole plan by id (default: in
    `trials`)."""
    groups: list[Group] = []
    for index, trial in enumerate(trials):
        position = (positions or {}).get(trial.id, index)
        last = groups[-1] if groups else None
        if last and _process_key(last.trials[-1]) == _process_key(trial):
            groups[-1] = replace(last, trials=(*last.trials, trial), positions=(*last.positions, position))
        else:
            groups.append(Group(trial.backend, targets[trial.backend], trial.devices, (trial,), trial.launcher,
                                (position,)))
    return groups


def _process_key(trial: Trial) -> tuple:
    return trial.backend, trial.devices, trial.launcher, trial.replicate
