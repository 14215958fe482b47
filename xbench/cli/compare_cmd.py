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
    P2pOption,
    Platform,
    Precision,
    Scaling,
    SingleDeviceOption,
    StartupTimeoutOption,
    VariantsOption,
    backend_options,
    integers,
    names,
    p2p_value,
    startup_timeout_s,
    value,
)
from xbench.cli.running import check_resume_alone, print_plan, run_comparison, run_dir_option
from xbench.contract import TimingProtocol
from xbench.contract.timing import DEFAULT_DEVICE_RUN_VARIATION
from xbench.errors import XbenchError
from xbench.experiment import load_spec
from xbench.run.cluster import resolve_launch
from xbench.run.compare import prepare
from xbench.run.resume import resume as resumed_run

PROTOCOL = TimingProtocol()  # the defaults the help shows (configs/quick.toml spells out the same)


def compare(
    backends: Annotated[Optional[list[str]], typer.Option(
        metavar="NAME...", help="Backends to compare, e.g. --backends tf jax (default: every installed one; "
                                "`xbench backends` lists them).")] = None,
    config: Annotated[Optional[Path], typer.Option(
        metavar="TOML", help="Experiment spec (default: the quick CPU-friendly spec, configs/quick.toml).")] = None,
    model: Annotated[Optional[list[str]], typer.Option(
        metavar="NAME...", help="Models to run: names from the config or presets (`xbench models` lists them: "
                                "medium, gpt2-small, resnet50, ...; default: the spec's, medium and large).")] = None,
    global_batch: Annotated[Optional[list[str]], typer.Option(
        metavar="INT...", help="Global batches (all devices together, split across them: strong scaling), e.g. "
                               "32 256 (default: the spec's per model, 32 256).")] = None,
    per_device_batch: Annotated[Optional[list[str]], typer.Option(
        metavar="INT...", help="Per-device batches instead (the global batch grows with the devices: weak "
                               "scaling), e.g. 64.")] = None,
    batch_sizes: Annotated[Optional[list[str]], typer.Option(hidden=True)] = None,  # before --global-batch
    devices: Annotated[Optional[list[str]], typer.Option(
        metavar="INT...", help="Device counts, e.g. 1 2 (default: 1 2).")] = None,
    out: Annotated[Optional[str], typer.Option(
        metavar="RUN_DIR", help="Run directory for records (default results/<timestamp>); a new or empty "
                                "directory.")] = None,
    scaling: Annotated[Optional[Scaling], typer.Option(
        help="The spec's batches are global (strong: split across the devices; default) or per device (weak); "
             "--global-batch and --per-device-batch say it themselves.")] = None,
    precision: Annotated[Optional[Precision], typer.Option(
        help="Matmul precision, set explicitly in every backend (default fp32).")] = None,
    platform: Annotated[Optional[Platform], typer.Option(
        help="auto: GPUs when present, else simulated CPU devices (default auto).")] = None,
    p2p: P2pOption = None,
    repeats: Annotated[Optional[int], typer.Option(
        metavar="INT", help=f"Timed windows per replicate at most (default {PROTOCOL.repeats}; fewer once "
                            "--target-ci is met or --window-budget is spent).")] = None,
    steps: Annotated[Optional[int], typer.Option(
        metavar="INT", help=f"Training steps per timed window (default {PROTOCOL.steps}).")] = None,
    warmup_steps: Annotated[Optional[int], typer.Option(
        metavar="INT", help=f"Untimed steps after the first call (default {PROTOCOL.warmup_steps}).")] = None,
    steps_per_call: Annotated[Optional[int], typer.Option(
        metavar="INT", help=f"Steps fused into one compiled call (default {PROTOCOL.steps_per_call}).")] = None,
    trial_timeout: Annotated[Optional[float], typer.Option(
        metavar="SECONDS", help=f"Seconds before a replicate is stopped (default "
                                f"{PROTOCOL.trial_timeout_s:g}).")] = None,
    min_window: Annotated[Optional[float], typer.Option(
        metavar="SECONDS", help=f"Seconds a timed window lasts at least (default {PROTOCOL.min_window_s:g}; 0: "
                                "exactly --steps).")] = None,
    replicates: Annotated[Optional[int], typer.Option(
        metavar="INT", help="Fresh worker processes per configuration before adaptive ones, at least 2 (default: "
                            "3 on GPUs, 2 on CPUs).")] = None,
    target_ci: Annotated[Optional[float], typer.Option(
        metavar="FRACTION", help="Stop a replicate's windows once their 95% interval is within this fraction of "
                                 f"the mean (default {PROTOCOL.target_ci:g}; 0: run every window).")] = None,
    window_budget: Annotated[Optional[float], typer.Option(
        metavar="SECONDS", help=f"Seconds of timed windows per replicate at most (default "
                                f"{PROTOCOL.window_budget_s:g}).")] = None,
    interval_target: Annotated[Optional[float], typer.Option(
        metavar="FRACTION", help="Add replicates, round by round, to configurations whose 95% interval is wider "
                                 "than this fraction of the mean (default 0.05 on GPUs, 0.10 on CPUs; 0: the "
                                 "planned replicates only).")] = None,
    time_budget: Annotated[Optional[float], typer.Option(
        metavar="SECONDS", help="Seconds of timing after which no further round of replicates starts (default: "
                                "120 on CPUs, 150 on GPUs, or $XBENCH_TIME_BUDGET_S; the planned replicates "
                                "always run; with the platform's default, the rounds get at least as long as "
                                "the planned replicates took, so a slower machine still gets them).")] = None,
    max_replicates: Annotated[Optional[int], typer.Option(
        metavar="INT", help=f"Replicates per configuration at most, adaptive ones included (default "
                            f"{PROTOCOL.max_replicates}).")] = None,
    run_variation: Annotated[Optional[float], typer.Option(
        metavar="FRACTION", help="Relative sd of a configuration's mean between runs on this machine (from "
                                 "benchmarks/repeatability.py); widens host-bound rows' intervals, and every row's "
                                 "on simulated CPU devices, to cover a rerun (default 0.10 on GPUs, 0.03 on "
                                 "CPUs).")] = None,
    device_run_variation: Annotated[Optional[float], typer.Option(
        metavar="FRACTION", help="The same for the rows whose step is the device's (not host-bound, on a GPU) "
                                 f"(default {DEFAULT_DEVICE_RUN_VARIATION:g}).")] = None,
    compile_cache: Annotated[Optional[CompileCache], typer.Option(
        help="run: the replicates of this run share compiled programs; off: each compiles afresh (default "
             "off).")] = None,
    order_seed: Annotated[Optional[int], typer.Option(
        metavar="INT", help="Seed of the shuffled order of configurations and replicates (default: random, "
                            "recorded).")] = None,
    seed: Annotated[Optional[int], typer.Option(metavar="INT", help="Seed for weights and data (default 0).")] = None,
    samples: Annotated[Optional[int], typer.Option(
        metavar="INT", help="Rows of synthetic data, at least one global batch (default 4096).")] = None,
    option: Annotated[Optional[list[str]], typer.Option(
        metavar="BACKEND.KEY=VALUE", help="A backend option, e.g. tf.cross_device_ops=nccl (repeatable).")] = None,
    variants: VariantsOption = None,
    single_device: SingleDeviceOption = None,
    no_verify: Annotated[bool, typer.Option(
        "--no-verify", help="Skip the identical-work check before timing (records say so).")] = False,
    breakdown: Annotated[bool, typer.Option(
        "--breakdown", help="Also time each multi-device step without its all-reduce: compute vs exposed "
                            "communication.")] = False,
    wide: Annotated[bool, typer.Option(
        "--wide", help="Print every column (step ms, 1st call, efficiency, MFU) and the full notes; the default "
                       "table fits 80-120 columns.")] = False,
    launcher: LauncherOption = None,
    nproc_per_node: NprocOption = None,
    nnodes: NnodesOption = None,
    node_rank: NodeRankOption = None,
    coordinator: CoordinatorOption = None,
    startup_timeout: StartupTimeoutOption = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the plan and its estimated wall time (verification and timing apart), then exit: "
                          "no worker starts, nothing is written; a bad spec gets the run's own error.")] = False,
    resume: Annotated[Optional[Path], typer.Option(
        metavar="RUN_DIR", help="Finish an interrupted run in this directory: its own spec, the replicates not "
                                "yet recorded (and failed ones) only.")] = None,
) -> int:
    """Time each backend on 1..N devices on the same weights and data; print tables and a bottom line."""
    startup = startup_timeout_s(startup_timeout)
    if resume is not None:
        check_resume_alone(locals())
        return run_comparison(resumed_run(resume, startup), no_verify, resumed=True, wide=wide)
    launch = resolve_launch(value(launcher) or "auto", nproc_per_node, nnodes, node_rank, coordinator)
    if devices is None and launch.nproc_per_node is not None:
        devices = [str(n) for n in spmd_device_counts(launch.nproc_per_node, launch.nnodes)]
    overrides = {
        "backends": names(backends), "models": names(model),
        **batch_overrides(global_batch, per_device_batch, batch_sizes, value(scaling)),
        "devices": integers(devices, "--devices"), "precision": value(precision), "platform": value(platform),
        "repeats": repeats, "steps": steps, "warmup_steps": warmup_steps, "steps_per_call": steps_per_call,
        "trial_timeout_s": trial_timeout, "min_window_s": min_window, "replicates": replicates,
        "target_ci": target_ci, "window_budget_s": window_budget, "compile_cache": value(compile_cache),
        "interval_target": interval_target, "time_budget_s": time_budget, "max_replicates": max_replicates,
        "run_variation": run_variation, "device_run_variation": device_run_variation,
        "order_seed": order_seed, "seed": seed, "samples": samples, "options": backend_options(option),
        "variants": names(variants), "single_device": value(single_device), "p2p": p2p_value(p2p),
    }
    spec = load_spec(config, overrides)
    if dry_run:
        return print_plan(spec, launch, breakdown, no_verify)
    err = status_console()
    with err.status("finding devices for each backend…"):
        comparison = prepare(spec, run_dir_option(out), strict_devices=devices is not None, breakdown=breakdown,
                             launch=launch, startup_timeout_s=startup)
    return run_comparison(comparison, no_verify, wide=wide)


def batch_overrides(global_batch: list[str] | None, per_device_batch: list[str] | None,
                    old_batch_sizes: list[str] | None, scaling: str | None) -> dict[str, object]:
    """--global-batch (strong scaling) or --per-device-batch (weak) as the spec's batch_sizes and
    scaling; --batch-sizes, the old name, keeps its meaning: global unless --scaling weak."""
    given = [flag for flag, v in (("--global-batch", global_batch), ("--per-device-batch", per_device_batch),
                                  ("--batch-sizes", old_batch_sizes)) if v]
    if len(given) > 1:
        raise XbenchError(f"give one of {' and '.join(given)}: --global-batch for batches split across the "
                          "devices, --per-device-batch for batches each device gets")
    if global_batch and scaling == "weak":
        raise XbenchError("--global-batch means strong scaling; for --scaling weak give --per-device-batch")
    if per_device_batch and scaling == "strong":
        raise XbenchError("--per-device-batch means weak scaling; for --scaling strong give --global-batch")
    if global_batch:
        return {"batch_sizes": integers(global_batch, "--global-batch"), "scaling": "strong"}
    if per_device_batch:
        return {"batch_sizes": integers(per_device_batch, "--per-device-batch"), "scaling": "weak"}
    return {"batch_sizes": integers(old_batch_sizes, "--batch-sizes"), "scaling": scaling}


def spmd_device_counts(nproc_per_node: int, nnodes: int) -> list[int]:
    """--nproc-per-node N without --devices: 1 and N devices on one node, all of them on many."""
    total = nproc_per_node * nnodes
    return sorted({1, total}) if nnodes == 1 else [total]
