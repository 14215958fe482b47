"""`xbench sweep`: measure what the step model needs on this machine, then fit it (fit.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from xbench.cli.consoles import data_console, status_console
from xbench.cli.options import P2pOption, Precision, integers, names, p2p_value, value
from xbench.cli.running import check_resume_alone, run_comparison, run_dir_option
from xbench.errors import SpecError, XbenchError, brief
from xbench.experiment import load_raw
from xbench.experiment.sweep import DEFAULT_BATCHES, DEFAULT_PARAMS, sweep_spec
from xbench.results.allreduce import sizes_for
from xbench.results.fitting import FIT_FILE, fit_all, load_runs, save_fits
from xbench.results.step_model import FitError
from xbench.run import compare
from xbench.run.comparison import planned_trials
from xbench.run.environment import nvidia_gpus
from xbench.run.resume import resume


def sweep(
    backends: Annotated[Optional[list[str]], typer.Option(
        metavar="NAME...", help="Backends to model, e.g. --backends jax torch (default: every installed one).")] = None,
    params: Annotated[Optional[list[str]], typer.Option(
        metavar="N...", help="MLP sizes in parameters (3 equal hidden layers), e.g. 1e5 1e6 1e7 (default: "
                             f"{_listed(DEFAULT_PARAMS['cpu'])} on a CPU, {_listed(DEFAULT_PARAMS['gpu'])} on "
                             "GPUs).")] = None,
    model: Annotated[Optional[list[str]], typer.Option(
        metavar="NAME...", help="Presets of any family to sweep instead of (or with --params, besides) the MLP "
                                "ladder, e.g. transformer-tiny.")] = None,
    config: Annotated[Optional[Path], typer.Option(
        metavar="TOML", help="A compare spec whose models (any family, with their batch sizes), protocol and data "
                             "tables the sweep adds.")] = None,
    per_device_batch: Annotated[Optional[list[str]], typer.Option(
        metavar="INT...", help="Per-device batches (3+ to validate the fit), e.g. 16 64 256 (default: "
                               f"{_listed(DEFAULT_BATCHES['cpu'])} on a CPU, {_listed(DEFAULT_BATCHES['gpu'])} on "
                               "GPUs).")] = None,
    batch_sizes: Annotated[Optional[list[str]], typer.Option(hidden=True)] = None,  # before --per-device-batch
    devices: Annotated[Optional[list[str]], typer.Option(
        metavar="INT...", help="Device counts, 1 and N (default 1 and every GPU; 1 alone with one GPU; 1 2 "
                               "simulated on a CPU).")] = None,
    precision: Annotated[Optional[Precision], typer.Option(
        help="Matmul precision, set explicitly in every backend (default fp32).")] = None,
    p2p: P2pOption = None,
    replicates: Annotated[Optional[int], typer.Option(
        metavar="INT", help="Fresh worker processes per configuration; the fit's intervals come from them "
                            "(default: 3 on GPUs, 2 on CPUs).")] = None,
    window_budget: Annotated[Optional[float], typer.Option(
        metavar="SECONDS", help="Seconds of timed windows per replicate at most; shorter: a faster, noisier sweep "
                                "(default 1).")] = None,
    time_budget: Annotated[Optional[float], typer.Option(
        metavar="SECONDS", help="Seconds of timing after which no further round of replicates starts for the "
                                "configurations whose intervals are still wide (default as in `xbench compare`; 0: "
                                "the planned replicates only).")] = None,
    out: Annotated[Optional[str], typer.Option(
        metavar="RUN_DIR", help="Run directory (default results/<timestamp>); the fit is written beside the "
                                "records as fit.json.")] = None,
    no_verify: Annotated[bool, typer.Option(
        "--no-verify", help="Skip the identical-work check before timing.")] = False,
    resume: Annotated[Optional[Path], typer.Option(
        metavar="RUN_DIR", help="Finish an interrupted sweep (its own spec), then fit it; a finished one is "
                                "refitted.")] = None,
) -> int:
    """Measure a grid of configurations and fit the step model `xbench recommend` answers from.

    Per backend: model sizes x per-device batches x 1 and N devices, compute-only twins and the
    all-reduce; the fit is written beside the records as fit.json."""
    if resume is not None:
        return _resume(resume, no_verify, given=locals())
    platform = "gpu" if nvidia_gpus() else "cpu"
    sizes = [_parameter_count(v) for v in names(params) or []]
    presets = names(model) or []
    raw = load_raw(config) if config is not None else None
    spec = sweep_spec(
        backends=names(backends) or [],
        params=sizes or ([] if presets or raw else list(DEFAULT_PARAMS[platform])),
        models=presets, batch_sizes=_per_device_batches(per_device_batch, batch_sizes, platform),
        devices=integers(devices, "--devices") or _default_devices(),
        precision=value(precision) or "fp32", replicates=replicates, window_budget_s=window_budget, config=raw,
        p2p=p2p_value(p2p), time_budget_s=time_budget)
    err = status_console()
    with err.status("finding devices for each backend…"):
        comparison = compare.prepare(spec, run_dir_option(out), strict_devices=devices is not None, breakdown=True)
    err.print(_announce(comparison, platform))
    code = run_comparison(comparison, no_verify, command="sweep")
    _fit_and_save(comparison.run_dir)
    return code


def _resume(run_dir: Path, no_verify: bool, given: dict) -> int:
    check_resume_alone(given)
    comparison = resume(run_dir)
    # A complete sweep says so and reports its records at once (nothing runs); then it is refitted.
    code = run_comparison(comparison, no_verify, resumed=True, command="sweep")  # releases the run directory
    _fit_and_save(run_dir)
    return code


def _default_devices() -> list[int]:
    """1 and every GPU; one GPU alone: just 1; no GPU: 1 and 2 simulated CPU devices."""
    gpus = len(nvidia_gpus())
    return [1] if gpus == 1 else [1, gpus or 2]


def _parameter_count(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SpecError(f"--params takes parameter counts such as 1e6 or 250000, not {brief(text)}") from None


def _announce(comparison, platform: str) -> str:
    trials = planned_trials(comparison)
    processes = len({(t.backend, t.devices, t.launcher, t.replicate) for t in trials})
    models = comparison.spec.models
    multi = [n for n in comparison.spec.devices if n > 1]
    sizes = len(sizes_for([4 * m.params for m in models], platform == "gpu")) if multi else 0
    collectives = f", the all-reduce at {sizes} sizes" if multi else " (one device: no all-reduce to fit)"
    # the wall time: the plan's estimate, printed next (one estimator for compare and sweep)
    return (f"sweep: {len(models)} model(s) x {len(models[0].batch_sizes)} per-device batches on "
            f"{'/'.join(map(str, comparison.spec.devices))} devices, {len(comparison.entries)} backend(s): "
            f"{len(trials)} trial replicate(s) in {processes} worker process(es){collectives}")


def _fit_and_save(run_dir: Path) -> None:
    err = status_console()
    try:
        measured = load_runs([run_dir])
    except FitError as problem:
        err.print(f"no fit: {problem}")
        return
    with err.status("fitting the step model (bootstrap over replicates)…"):
        fits, skipped = fit_all(measured)
    for reason in skipped:
        err.print(f"[yellow]not fitted[/]: {reason}")
    if not fits:
        return
    path = save_fits(run_dir / FIT_FILE, fits, measured)
    for f in fits:
        data_console().print(f"fit {f.key.label} {f.key.precision} {f.key.family}: {f.observations} configurations, "
                             f"residual {100 * f.residual_sd:.1f} % (log step time)")
    err.print(f"fit: {path}; next: xbench recommend --params N --global-batch B  (or --validate {run_dir})")


def _listed(values) -> str:
    """e.g. "3e4 1.6e7" for parameter counts, "16 16384" for batches: as a user would type them."""
    return " ".join(str(v) if isinstance(v, int) else f"{v:.3g}".replace("e+0", "e").replace("e+", "e")
                    for v in values)


def _per_device_batches(given: list[str] | None, old_name: list[str] | None, platform: str) -> list[int]:
    """--per-device-batch, or --batch-sizes (its old name), or this platform's ladder."""
    if given and old_name:
        raise XbenchError("--batch-sizes is the old name of --per-device-batch; give one of them")
    return (integers(given, "--per-device-batch") or integers(old_name, "--batch-sizes")
            or list(DEFAULT_BATCHES[platform]))
