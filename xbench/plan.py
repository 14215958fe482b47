"""From a spec to the list of trials, grouped by the worker process that will run them."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from xbench.contract import Trial
from xbench.spec import Spec


@dataclass(frozen=True)
class Group:
    """Trials one worker process runs in turn: one backend, one device count, one replicate."""

    backend: str
    target: str  # the backend's entry-point value, imported by the worker
    devices: int
    trials: tuple[Trial, ...]
    launcher: str = "subprocess"
    positions: tuple[int, ...] = ()  # each trial's place in the whole plan


def plan_trials(spec: Spec, backends: Sequence[str], breakdown: bool = False,
                launchers: Mapping[str, str] | None = None) -> list[Trial]:
    """Every backend x device count x model x batch size x replicate, in the order they will
    run; with `breakdown`, each multi-device trial is followed by its compute-only twin.
    `launchers` maps a backend to the launcher that starts it (default subprocess).

    Replicates run in rounds: round r times replicate r of every configuration. Within a
    round the worker processes (backend x device count) come in a shuffled order, and each
    runs its configurations in a shuffled order, both drawn from `protocol.order_seed`, so
    that slow drift of the machine spreads over all configurations instead of landing on one.
    """
    rng = random.Random(spec.protocol.order_seed)
    rounds = []
    for replicate in range(spec.protocol.replicates or 1):
        groups = [_configurations(spec, backend, devices, breakdown, launchers, replicate)
                  for backend in backends for devices in spec.devices]
        rng.shuffle(groups)
        for configurations in groups:
            rng.shuffle(configurations)
        rounds += [trial for configurations in groups for unit in configurations for trial in unit]
    return rounds


def _configurations(spec: Spec, backend: str, devices: int, breakdown: bool, launchers: Mapping[str, str] | None,
                    replicate: int) -> list[list[Trial]]:
    """One worker process's configurations, each a unit of its trial and (with `breakdown`)
    its compute-only twin right after it, so that both share the process."""
    units = []
    for model in spec.models:
        for batch in model.batch_sizes:
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
                samples=spec.data.samples,
                protocol=spec.protocol,
                options=dict(spec.options.get(backend, {})),
                launcher=(launchers or {}).get(backend, "subprocess"),
                replicate=replicate,
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
