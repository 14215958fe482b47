"""`xbench compare`: time backends on identical work and print a table per model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from xbench.cli.consoles import status_console
from xbench.cli.options import (
    CompileCache,
    CoordinatorOption,
    LauncherOption,
    NnodesOption,
    NodeRankOption,
    NprocOption,
    Platform,
    Precision,
    Scaling,
    SingleDeviceOption,
    StartupTimeoutOption,
    VariantsOption,
    backend_options,
    integers,
    names,
    startup_timeout_s,
    value,
)
from xbench.cli.running import check_resume_alone, run_dir_option, run_plan
from xbench.experiment import load_spec
from xbench.run import compare as comparison
from xbench.run.cluster import resolve_launch


def compare(
    backends: Annotated[Optional[list[str]], typer.Option(help="Backends to compare, e.g. --backends tf jax.")] = None,
    config: Annotated[Optional[Path], typer.Option(
        help="Experiment spec (TOML); default: the quick CPU-friendly spec.")] = None,
    model: Annotated[Optional[list[str]], typer.Option(
        help="Models to run: names from the config or presets (`xbench models` lists them: medium, gpt2-small, "
             "resnet50, ...).")] = None,
    batch_sizes: Annotated[Optional[list[str]], typer.Option(
        help="Batch sizes for every selected model, e.g. 32,128 (global under strong scaling, per device "
             "under weak).")] = None,
    devices: Annotated[Optional[list[str]], typer.Option(help="Device counts, e.g. 1,2.")] = None,
    out: Annotated[Optional[str], typer.Option(
        help="Run directory for records (default results/<timestamp>); a new or empty directory.")] = None,
    scaling: Annotated[Optional[Scaling], typer.Option(
        help="strong: split the global batch; weak: fixed per-device batch.")] = None,
    precision: Annotated[Optional[Precision], typer.Option(
        help="Matmul precision, set explicitly in every backend.")] = None,
    platform: Annotated[Optional[Platform], typer.Option(
        help="auto: GPUs when present, else simulated CPU devices.")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Timed windows per trial.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps per timed window.")] = None,
    warmup_steps: Annotated[Optional[int], typer.Option(help="Untimed steps after the first call.")] = None,
    steps_per_call: Annotated[Optional[int], typer.Option(help="Steps fused into one compiled call.")] = None,
    trial_timeout: Annotated[Optional[float], typer.Option(help="Seconds before a trial is stopped.")] = None,
    min_window: Annotated[Optional[float], typer.Option(
        help="Seconds a timed window lasts at least (0: exactly --steps).")] = None,
    replicates: Annotated[Optional[int], typer.Option(
        help="Fresh worker processes per configuration, at least 2 (default: 3 on GPUs, 2 on CPUs).")] = None,
    target_ci: Annotated[Optional[float], typer.Option(
        help="Stop a replicate's windows once their 95% interval is within this fraction of the mean (0: run every "
             "window).")] = None,
    window_budget: Annotated[Optional[float], typer.Option(
        help="Seconds of timed windows per replicate at most.")] = None,
    interval_target: Annotated[Optional[float], typer.Option(
        help="Add replicates, round by round, to configurations whose 95% interval is wider than this fraction of "
             "the mean (default 0.05 on GPUs, 0.10 on CPUs; 0: the planned replicates only).")] = None,
    time_budget: Annotated[Optional[float], typer.Option(
        help="Seconds of timing after which no further round of replicates starts (default: 120 on CPUs, 150 on "
             "GPUs, or $XBENCH_TIME_BUDGET_S; the planned replicates always run).")] = None,
    max_replicates: Annotated[Optional[int], typer.Option(
        help="Replicates per configuration at most, adaptive ones included (default 12).")] = None,
    run_variation: Annotated[Optional[float], typer.Option(
        help="Relative sd of a configuration's mean between runs on this machine (from benchmarks/repeatability.py); "
             "widens host-bound rows' intervals, and every row's on simulated CPU devices, to cover a rerun (default "
             "0.10 on GPUs, 0.03 on CPUs).")] = None,
    compile_cache: Annotated[Optional[CompileCache], typer.Option(
        help="run: the replicates of this run share compiled programs; off: each compiles afresh.")] = None,
    order_seed: Annotated[Optional[int], typer.Option(
        help="Seed of the shuffled order of configurations and replicates (default: random, recorded).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed for weights and data.")] = None,
    samples: Annotated[Optional[int], typer.Option(help="Rows of synthetic data (at least one global batch).")] = None,
    option: Annotated[Optional[list[str]], typer.Option(
        help="Backend option BACKEND.KEY=VALUE, e.g. tf.cross_device_ops=nccl.")] = None,
    variants: VariantsOption = None,
    single_device: SingleDeviceOption = None,
    no_verify: Annotated[bool, typer.Option(
        "--no-verify", help="Skip the identical-work check before timing (records say so).")] = False,
    breakdown: Annotated[bool, typer.Option(
        "--breakdown", help="Also time each multi-device step without its all-reduce: compute vs exposed "
                            "communication.")] = False,
    launcher: LauncherOption = None,
    nproc_per_node: NprocOption = None,
    nnodes: NnodesOption = None,
    node_rank: NodeRankOption = None,
    coordinator: CoordinatorOption = None,
    startup_timeout: StartupTimeoutOption = None,
    resume: Annotated[Optional[Path], typer.Option(
        help="Finish an interrupted run in this directory: its spec, trials not yet recorded (and failed "
             "ones) only.")] = None,
) -> int:
    """Time each backend on 1..N devices on the same weights and data; print a table per model."""
    startup = startup_timeout_s(startup_timeout)
    if resume is not None:
        check_resume_alone(locals())
        return run_plan(comparison.resume(resume, startup), no_verify, resumed=True)
    launch = resolve_launch(value(launcher) or "auto", nproc_per_node, nnodes, node_rank, coordinator)
    if devices is None and launch.nproc_per_node is not None:
        devices = [str(n) for n in spmd_device_counts(launch.nproc_per_node, launch.nnodes)]
    overrides = {
        "backends": names(backends), "models": names(model),
        "batch_sizes": integers(batch_sizes, "--batch-sizes"), "devices": integers(devices, "--devices"),
        "scaling": value(scaling), "precision": value(precision), "platform": value(platform),
        "repeats": repeats, "steps": steps, "warmup_steps": warmup_steps, "steps_per_call": steps_per_call,
        "trial_timeout_s": trial_timeout, "min_window_s": min_window, "replicates": replicates,
        "target_ci": target_ci, "window_budget_s": window_budget, "compile_cache": value(compile_cache),
        "interval_target": interval_target, "time_budget_s": time_budget, "max_replicates": max_replicates,
        "run_variation": run_variation,
        "order_seed": order_seed, "seed": seed, "samples": samples, "options": backend_options(option),
        "variants": names(variants), "single_device": value(single_device),
    }
    spec = load_spec(config, overrides)
    err = status_console()
    with err.status("finding devices for each backend…"):
        plan = comparison.prepare(spec, run_dir_option(out), strict_devices=devices is not None, breakdown=breakdown,
                                  launch=launch, startup_timeout_s=startup)
    return run_plan(plan, no_verify)


def spmd_device_counts(nproc_per_node: int, nnodes: int) -> list[int]:
    """--nproc-per-node N without --devices: 1 and N devices on one node, all of them on many."""
    total = nproc_per_node * nnodes
    return sorted({1, total}) if nnodes == 1 else [total]
