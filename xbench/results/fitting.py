"""From run directories to fitted step models (`xbench.results.step_model`), stored fits, and held-out
validation: fit on some measured configurations, predict the others, report each error."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xbench.models.model_spec import ModelSpec
from xbench.results.allreduce import ok_results
from xbench.results.records import (
    ALLREDUCE_FILE,
    RECORDS_FILE,
    AllReduceRecord,
    Record,
    StoredModel,
    read_records,
    write_json,
)
from xbench.results.schema import FIT_FILE
from xbench.results.step_model import (
    Fit,
    FitError,
    FitKey,
    Layout,
    Observation,
    alpha_beta,
    fit,
    fit_problem,
    predict,
    predict_log,
)
from xbench.results.summary import rows_from_records
from xbench.wire import utc_now

FIT_SCHEMA = 1


@dataclass(frozen=True)
class Measured:
    """What fits are made of: the configurations of one or more runs, each backend's all-reduce
    benchmark (backend -> devices -> (alpha, beta)), and the machine they ran on."""

    observations: tuple[Observation, ...]
    comm: Mapping[str, Mapping[int, tuple[float, float]]]
    machine: str
    sources: tuple[str, ...]


def load_runs(run_dirs: Sequence[Path]) -> Measured:
    """Every measured configuration of the runs; a one-line error for a directory that is not a
    run or that measured nothing."""
    observations: list[Observation] = []
    comm: dict[str, dict[int, tuple[float, float]]] = {}
    machines = []
    for run_dir in map(Path, run_dirs):
        if not (run_dir / RECORDS_FILE).is_file():
            raise FitError(f"{run_dir} holds no {RECORDS_FILE}: not an xbench run directory")
        records = read_records(run_dir)
        observations += observations_of(records)
        machines.append(machine_of(records))
        if (run_dir / ALLREDUCE_FILE).is_file():
            for backend, fits in comm_benchmarks(read_records(run_dir, ALLREDUCE_FILE)).items():
                comm.setdefault(backend, {}).update(fits)
    if not observations:
        raise FitError(f"no measured configuration in {', '.join(map(str, run_dirs))}; run xbench sweep")
    if len(set(machines)) > 1:
        raise FitError(f"the runs come from different machines ({'; '.join(sorted(set(machines)))}); "
                       "fit each machine's runs on their own")
    return Measured(tuple(observations), comm, machines[0], tuple(str(d) for d in run_dirs))


def observations_of(records: Sequence[Record]) -> list[Observation]:
    """One observation per measured configuration; on one device the faster program (plain or
    data-parallel with one replica), which is what a user would run there."""
    models = {r["trial"]["model"]["name"]: r["trial"]["model"] for r in records}
    best: dict[tuple, Observation] = {}
    for row in rows_from_records(records):
        if row.throughput is None or row.params is None:
            continue
        family = models[row.model].get("family", "mlp")
        flops = row.flops_per_sample or _flops(models[row.model])
        if not flops:
            continue
        key = FitKey(row.backend, row.variant, row.launcher, row.precision, family)
        steps = tuple(row.global_batch / m for m in row.means)
        obs = Observation(key, row.model, row.params, float(flops), row.devices, row.per_device_batch,
                          row.all_reduce, steps)
        slot = (key, row.model, row.devices, row.global_batch, row.all_reduce)
        if slot not in best or obs.throughput > best[slot].throughput:
            best[slot] = obs
    return list(best.values())


def _flops(model: StoredModel) -> int | None:
    try:
        return ModelSpec.from_dict(model).training_flops_per_sample
    except (KeyError, TypeError, ValueError):
        return None


def comm_benchmarks(records: Sequence[AllReduceRecord]) -> dict[str, dict[int, tuple[float, float]]]:
    """alpha-beta per backend and device count from the all-reduce benchmark's sizes."""
    by: dict[tuple[str, int], list] = {}
    for result in ok_results(records):
        if result.devices > 1:
            by.setdefault((result.backend, result.devices), []).append(result)
    fits: dict[str, dict[int, tuple[float, float]]] = {}
    for (backend, devices), results in by.items():
        if len({r.nbytes for r in results}) >= 2:
            fits.setdefault(backend, {})[devices] = alpha_beta([r.nbytes for r in results],
                                                               [r.time.median for r in results])
    return fits


def machine_of(records: Sequence[Record]) -> str:
    """'2 x NVIDIA H200', or 'simulated CPU devices (<cpu>)': what the fits hold for."""
    for record in records:
        devices = record.get("devices")
        if record.get("status") != "ok" or not devices:
            continue
        names = devices.get("device_names") or []
        count = devices.get("available") or len(names)
        if devices.get("simulated") or devices.get("platform") == "cpu":
            cpu = (record.get("environment") or {}).get("cpu", "CPU")
            return f"simulated CPU devices ({cpu})"
        model = names[0].split(" ", 1)[-1] if names else devices.get("platform", "?")
        return f"{count} x {model}"
    gpus = next((r["environment"].get("gpus") for r in records if (r.get("environment") or {}).get("gpus")), None)
    return f"{len(gpus)} x {gpus[0]['name']}" if gpus else "unknown machine"


def same_kind(machine: str, other: str) -> bool:
    """Whether two machines' descriptions (`machine_of`) name the same kind of device, whatever
    their count: a 1-GPU fit holds for that GPU on a larger machine of it."""
    def kind(text: str) -> str:
        return text.split(" x ", 1)[1] if " x " in text and text.split(" x ", 1)[0].isdigit() else text
    return kind(machine) == kind(other)


def fit_all(measured: Measured, bootstrap: int | None = None) -> tuple[list[Fit], list[str]]:
    """One fit per key; the keys that cannot be fitted, each with why."""
    fits, skipped = [], []
    for key, obs in _by_key(measured.observations):
        try:
            extra = {} if bootstrap is None else {"bootstrap": bootstrap}
            fits.append(fit(obs, measured.comm.get(key.backend), **extra))
        except FitError as err:
            skipped.append(str(err))
    return fits, skipped


# ----------------------------------------------------------------------------- stored fits


def save_fits(path: Path, fits: Sequence[Fit], measured: Measured) -> Path:
    write_json(path, {"schema": FIT_SCHEMA, "created": utc_now(), "machine": measured.machine,
                      "sources": list(measured.sources), "fits": [fit_to_dict(f) for f in fits]})
    return path


def fit_to_dict(f: Fit) -> dict[str, Any]:
    return {
        "key": asdict(f.key),
        "devices": list(f.layout.devices),
        "flops_ref": f.layout.flops_ref,
        "benchmark": {str(p): list(v) for p, v in f.benchmark.items()},
        "theta": list(f.theta), "bootstrap": [list(b) for b in f.bootstrap],
        "residual_sd": f.residual_sd, "observations": f.observations,
        "params_range": list(f.params_range), "batch_range": list(f.batch_range),
        "size_law": list(f.size_law), "models": list(f.models),
    }


def fit_from_dict(raw: Mapping[str, Any]) -> Fit:
    layout = Layout(tuple(raw["devices"]), float(raw["flops_ref"]))
    return Fit(key=FitKey(**raw["key"]), layout=layout, theta=tuple(raw["theta"]),
               bootstrap=tuple(tuple(b) for b in raw["bootstrap"]), residual_sd=raw["residual_sd"],
               observations=raw["observations"], params_range=tuple(raw["params_range"]),
               batch_range=tuple(raw["batch_range"]), size_law=tuple(raw["size_law"]), models=tuple(raw["models"]),
               benchmark={int(p): tuple(v) for p, v in raw["benchmark"].items()})


@dataclass(frozen=True)
class StoredFits:
    path: Path
    machine: str
    created: str
    fits: tuple[Fit, ...]


def find_fits(places: Iterable[Path]) -> tuple[list[StoredFits], list[str]]:
    """fit.json files in the given files or directories (a directory: itself and one or two
    levels below, where `xbench sweep` puts them), newest first; and why each unreadable one
    found in a directory was left out (a file named directly must be readable)."""
    found, problems = [], []
    for place in map(Path, places):
        if place.is_file():
            found.append(read_fits(place))
            continue
        for path in sorted({*place.glob(FIT_FILE), *place.glob(f"*/{FIT_FILE}"), *place.glob(f"*/*/{FIT_FILE}")}):
            try:
                found.append(read_fits(path))
            except FitError as err:
                problems.append(str(err))
    return sorted(found, key=lambda s: s.created, reverse=True), problems


def read_fits(path: Path) -> StoredFits:
    try:
        raw = json.loads(Path(path).read_text())
        if raw.get("schema") != FIT_SCHEMA:
            raise FitError(f"{path}: fit schema {raw.get('schema')} is not {FIT_SCHEMA}; refit with xbench sweep")
        stored = StoredFits(Path(path), str(raw["machine"]), str(raw["created"]),
                            tuple(fit_from_dict(f) for f in raw["fits"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise FitError(f"{path} is not a readable fit ({type(err).__name__}: {err}); "
                       "delete it or refit with xbench sweep") from None
    for one in stored.fits:
        problem = fit_problem(one)
        if problem:
            raise FitError(f"{path}: the fit of {one.key.backend} {problem}; the file was edited or damaged: "
                           "delete it or refit with xbench sweep")
    return stored


# ----------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class HeldOut:
    """One configuration predicted by a fit that never saw it."""

    scheme: str  # "batch", "model size", "devices": what was held out; "rerun": another run
    key: FitKey
    model: str
    devices: int
    global_batch: int
    predicted: float  # samples/s
    measured: float
    interval: tuple[float, float] | None = None  # the prediction's 95 %, where it was asked for

    @property
    def error(self) -> float:
        """Signed relative error of the predicted throughput."""
        return self.predicted / self.measured - 1

    @property
    def inside(self) -> bool | None:
        """Whether the measured throughput lies in the predicted interval (None: no interval)."""
        return None if self.interval is None else self.interval[0] <= self.measured <= self.interval[1]


def validate(measured: Measured) -> tuple[list[HeldOut], list[str]]:
    """Interpolation, both ways: each per-device batch strictly inside a model's measured range
    held out in turn (all device counts at it), and each model strictly inside its family's
    measured sizes. Fits here skip the bootstrap: only central predictions are scored.
    Returns the held-out predictions and the holds that could not be fitted, with why."""
    found: list[HeldOut] = []
    problems: list[str] = []
    for key, obs in _by_key(measured.observations):
        comm = measured.comm.get(key.backend)
        for scheme, held in _holds(obs):
            train = [o for o in obs if o not in held]
            try:
                fitted = fit(train, comm, bootstrap=0)
            except FitError as err:
                problems.append(f"{scheme} {held[0].model}: {err}")
                continue
            targets = [o for o in held if o.all_reduce or o.devices == 1]
            predicted = np.exp(predict_log(fitted.theta, fitted.layout, targets))
            found += [HeldOut(scheme, key, o.model, o.devices, o.devices * o.local_batch,
                              o.devices * o.local_batch / float(t), o.throughput) for o, t in zip(targets, predicted)]
    return found, problems


def predict_rerun(fitted_on: Measured, rerun: Measured) -> list[HeldOut]:
    """Fits on one run predict every full step of another run of the same machine (a rerun of
    the same sweep: what a user sees when they measure what the fit promised)."""
    if not same_kind(fitted_on.machine, rerun.machine):
        raise FitError(f"the rerun ran on {rerun.machine}, the fit's runs on {fitted_on.machine}; "
                       "compare runs of one machine")
    fits = {f.key: f for f in fit_all(fitted_on, bootstrap=0)[0]}
    found = []
    for o in rerun.observations:
        f = fits.get(o.key)
        if f is None or not (o.all_reduce or o.devices == 1):
            continue
        (step,) = np.exp(predict_log(f.theta, f.layout, [o]))
        found.append(HeldOut("rerun", o.key, o.model, o.devices, o.devices * o.local_batch,
                             o.devices * o.local_batch / float(step), o.throughput))
    return found


def extrapolate_devices(measured: Measured, fit_devices: int) -> tuple[list[HeldOut], list[str]]:
    """What `xbench recommend` does for a machine larger than the sweep's, checked: fits on the
    device counts up to `fit_devices` (steps and the all-reduce benchmark alike) predict every
    full step measured on more devices, each with its 95 % interval. Returns the predictions and
    the keys that could not be fitted, with why."""
    targets = [o for o in measured.observations if o.devices > fit_devices and o.all_reduce]
    fits, problems = fit_all(fit_on_devices(measured, fit_devices))
    by_key = {f.key: f for f in fits}
    found = []
    for o in targets:
        if o.key in by_key:
            p = predict(by_key[o.key], o.params, o.flops, o.devices * o.local_batch, o.devices)
            found.append(HeldOut("devices", o.key, o.model, o.devices, p.global_batch, p.throughput, o.throughput,
                                 (p.throughput_low, p.throughput_high)))
    return found, problems


def fit_on_devices(measured: Measured, fit_devices: int) -> Measured:
    """The same runs with only the configurations and all-reduce benchmarks of up to `fit_devices`
    devices: what a sweep on the smaller machine would have measured."""
    comm = {b: {p: ab for p, ab in fits.items() if p <= fit_devices} for b, fits in measured.comm.items()}
    return Measured(tuple(o for o in measured.observations if o.devices <= fit_devices), comm,
                    measured.machine, measured.sources)


def _by_key(observations: Iterable[Observation]) -> list[tuple[FitKey, list[Observation]]]:
    """Each fit key's observations, the keys in the order of their labels."""
    groups: dict[FitKey, list[Observation]] = {}
    for o in observations:
        groups.setdefault(o.key, []).append(o)
    return sorted(groups.items(), key=lambda item: item[0].label)


def _holds(obs: Sequence[Observation]) -> list[tuple[str, list[Observation]]]:
    holds = []
    for model in sorted({o.model for o in obs}):
        batches = sorted({o.local_batch for o in obs if o.model == model})
        holds += [("batch", [o for o in obs if o.model == model and o.local_batch == b]) for b in batches[1:-1]]
    sizes = sorted({(o.flops, o.model) for o in obs})
    holds += [("model size", [o for o in obs if o.model == model]) for _, model in sizes[1:-1]]
    return holds


def error_summary(held: Sequence[HeldOut]) -> tuple[float, float]:
    """Median and 90th percentile of the absolute relative errors."""
    errors = np.abs([h.error for h in held])
    return float(np.median(errors)), float(np.percentile(errors, 90))

