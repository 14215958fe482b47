"""From a spec to the list of trials, grouped by the worker process that will run them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from xbench.contract import Trial
from xbench.spec import Spec


@dataclass(frozen=True)
class Group:
    """Trials one worker process runs in turn: one backend, one device count."""

    backend: str
    target: str  # the backend's entry-point value, imported by the worker
    devices: int
    trials: tuple[Trial, ...]
    launcher: str = "subprocess"
    positions: tuple[int, ...] = ()  # each trial's place in the whole plan


def plan_trials(spec: Spec, backends: Sequence[str], breakdown: bool = False,
                launchers: Mapping[str, str] | None = None) -> list[Trial]:
    """Every backend x device count x model x batch size, in the order they will run; with
    `breakdown`, each multi-device trial is followed by its compute-only twin. `launchers`
    maps a backend to the launcher that starts it (default subprocess)."""
    trials = []
    for backend in backends:
        for devices in spec.devices:
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
                    )
                    trials.append(trial)
                    if breakdown and devices > 1:
                        trials.append(replace(trial, all_reduce=False))
    return trials


def group_trials(trials: Sequence[Trial], targets: dict[str, str],
                 positions: Mapping[str, int] | None = None) -> list[Group]:
    """Consecutive trials of one backend, device count and launcher share worker processes.
    `positions` gives each trial's place in the whole plan by id (default: in `trials`)."""
    groups: list[Group] = []
    for index, trial in enumerate(trials):
        position = (positions or {}).get(trial.id, index)
        last = groups[-1] if groups else None
        if last and (last.backend, last.devices, last.launcher) == (trial.backend, trial.devices, trial.launcher):
            groups[-1] = replace(last, trials=(*last.trials, trial), positions=(*last.positions, position))
        else:
            groups.append(Group(trial.backend, targets[trial.backend], trial.devices, (trial,), trial.launcher,
                                (position,)))
    return groups
