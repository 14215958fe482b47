"""`xbench compare`: time backends on identical work and print a table per model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from xbench.cli.consoles import data_console, status_console
from xbench.cli.options import (
    CompileCache, CoordinatorOption, LauncherOption, NnodesOption, NodeRankOption, NprocOption, Platform, Precision,
    Scaling, SingleDeviceOption, StartupTimeoutOption, VariantsOption, backend_options, integers, names,
    startup_timeout_s, value,
)
from xbench.cluster import resolve_launch
from xbench.errors import Interrupted, XbenchError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from xbench import compare as comparison
from xbench.records import RECORDS_FILE, RUN_FILE, finished_trials, iter_records, last_line_torn
from xbench.render import busbw_by_size, devices_line, model_tables
from xbench.spec import load_spec
from xbench.summary import rows_from_records


def compare(
    backends: Annotated[Optional[list[str]], typer.Option(help="Backends to compare, e.g. --backends tf jax.")] = None,
    config: Annotated[Optional[Path], typer.Option(help="Experiment spec (TOML); default: the quick CPU-friendly spec.")] = None,
    model: Annotated[Optional[list[str]], typer.Option(help="Models to run: names from the config or presets (`xbench models` lists them: medium, gpt2-small, resnet50, ...).")] = None,
    batch_sizes: Annotated[Optional[list[str]], typer.Option(help="Batch sizes for every selected model, e.g. 32,128 (global under strong scaling, per device under weak).")] = None,
    devices: Annotated[Optional[list[str]], typer.Option(help="Device counts, e.g. 1,2.")] = None,
    out: Annotated[Optional[str], typer.Option(help="Run directory for records (default results/<timestamp>); a new or empty directory.")] = None,
    scaling: Annotated[Optional[Scaling], typer.Option(help="strong: split the global batch; weak: fixed per-device batch.")] = None,
    precision: Annotated[Optional[Precision], typer.Option(help="Matmul precision, set explicitly in every backend.")] = None,
    platform: Annotated[Optional[Platform], typer.Option(help="auto: GPUs when present, else simulated CPU devices.")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Timed windows per trial.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps per timed window.")] = None,
    warmup_steps: Annotated[Optional[int], typer.Option(help="Untimed steps after the first call.")] = None,
    steps_per_call: Annotated[Optional[int], typer.Option(help="Steps fused into one compiled call.")] = None,
    trial_timeout: Annotated[Optional[float], typer.Option(help="Seconds before a trial is stopped.")] = None,
    min_window: Annotated[Optional[float], typer.Option(help="Seconds a timed window lasts at least (0: exactly --steps).")] = None,
    replicates: Annotated[Optional[int], typer.Option(help="Fresh worker processes per configuration, at least 2 (default: 3 on GPUs, 2 on CPUs).")] = None,
    target_ci: Annotated[Optional[float], typer.Option(help="Stop a replicate's windows once their 95% interval is within this fraction of the mean (0: run every window).")] = None,
    window_budget: Annotated[Optional[float], typer.Option(help="Seconds of timed windows per replicate at most.")] = None,
    compile_cache: Annotated[Optional[CompileCache], typer.Option(help="run: the replicates of this run share compiled programs; off: each compiles afresh.")] = None,
    order_seed: Annotated[Optional[int], typer.Option(help="Seed of the shuffled order of configurations and replicates (default: random, recorded).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed for weights and data.")] = None,
    samples: Annotated[Optional[int], typer.Option(help="Rows of synthetic data (at least one global batch).")] = None,
    option: Annotated[Optional[list[str]], typer.Option(help="Backend option BACKEND.KEY=VALUE, e.g. tf.cross_device_ops=nccl.")] = None,
    variants: VariantsOption = None,
    single_device: SingleDeviceOption = None,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip the identical-work check before timing (records say so).")] = False,
    breakdown: Annotated[bool, typer.Option("--breakdown", help="Also time each multi-device step without its all-reduce: compute vs exposed communication.")] = False,
    launcher: LauncherOption = None,
    nproc_per_node: NprocOption = None,
    nnodes: NnodesOption = None,
    node_rank: NodeRankOption = None,
    coordinator: CoordinatorOption = None,
    startup_timeout: StartupTimeoutOption = None,
    resume: Annotated[Optional[Path], typer.Option(help="Finish an interrupted run in this directory: its spec, trials not yet recorded (and failed ones) only.")] = None,
) -> int:
    """Time each backend on 1..N devices on the same weights and data; print a table per model."""
    startup = startup_timeout_s(startup_timeout)
    if resume is not None:
        _check_resume_alone(locals())
        return _run(comparison.resume(resume, startup), no_verify, resumed=True)
    launch = resolve_launch(value(launcher) or "auto", nproc_per_node, nnodes, node_rank, coordinator)
    if devices is None and launch.nproc_per_node is not None:
        devices = [str(n) for n in spmd_device_counts(launch)]
    overrides = {
        "backends": names(backends), "models": names(model),
        "batch_sizes": integers(batch_sizes, "--batch-sizes"), "devices": integers(devices, "--devices"),
        "scaling": value(scaling), "precision": value(precision), "platform": value(platform),
        "repeats": repeats, "steps": steps, "warmup_steps": warmup_steps, "steps_per_call": steps_per_call,
        "trial_timeout_s": trial_timeout, "min_window_s": min_window, "replicates": replicates,
        "target_ci": target_ci, "window_budget_s": window_budget, "compile_cache": value(compile_cache),
        "order_seed": order_seed, "seed": seed, "samples": samples, "options": backend_options(option),
        "variants": names(variants), "single_device": value(single_device),
    }
    spec = load_spec(config, overrides)
    err = status_console()
    with err.status("finding devices for each backend…"):
        plan = comparison.prepare(spec, run_dir_option(out), strict_devices=devices is not None, breakdown=breakdown,
                                  launch=launch, startup_timeout_s=startup)
    return _run(plan, no_verify)


def spmd_device_counts(launch) -> list[int]:
    """--nproc-per-node N without --devices: 1 and N devices on one node, all of them on many."""
    total = launch.nproc_per_node * launch.nnodes
    return sorted({1, total}) if launch.nnodes == 1 else [total]


def _check_resume_alone(given: dict[str, Any]) -> None:
    """--resume takes the run's own spec; anything that would change it is an error."""
    allowed = {"resume", "no_verify", "startup_timeout", "startup"}
    # `is not`, not `in`: 0 == False, and --seed 0 is a change the run would ignore.
    changed = [name for name, v in given.items() if name not in allowed and v is not None and v is not False]
    if changed:
        flags = ", ".join("--" + name.replace("_", "-") for name in changed)
        raise XbenchError(f"--resume reruns the run's own spec; drop {flags}")


def run_dir_option(out: str | None) -> Path | None:
    """--out as a path; an empty one would mean the current directory, which is never meant."""
    if out is None:
        return None
    if not out.strip():
        raise XbenchError("--out is empty; name a new or empty directory, e.g. --out results/my-run")
    return Path(out)


def _run(plan, no_verify: bool, resumed: bool = False) -> int:
    """Print what runs where, call the orchestrator under a progress display, print the tables;
    the run directory is released however this ends."""
    try:
        return _run_locked(plan, no_verify, resumed)
    finally:
        plan.release()


def _run_locked(plan, no_verify: bool, resumed: bool) -> int:
    err = status_console()
    for name, info in plan.devices.items():
        err.print(devices_line(name, info, plan.launchers.get(name, "subprocess")))
    done = finished_trials(plan.run_dir) if resumed else set()
    protocol = plan.spec.protocol
    if resumed:
        torn = last_line_torn(plan.run_dir / RECORDS_FILE)
        if torn:
            err.print(f"{plan.run_dir / RECORDS_FILE}:{torn} was cut off mid-write (an interrupted append); "
                      "dropped, and its trial runs again")
        err.print(f"resuming {plan.run_dir}: {len(done)} trial(s) already recorded, "
                  f"{comparison.trial_count(plan, done)} to run")
    err.print(f"{protocol.replicates} replicate(s) per configuration (fresh worker processes), "
              f"in a shuffled order (order seed {protocol.order_seed})")
    try:
        with _Observer(err, comparison.trial_count(plan, done), protocol.repeats) as observer:
            outcome = comparison.run(plan, observer, no_verify=no_verify, resumed=resumed)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_message(plan.run_dir)) from None
    console = data_console()
    for table in model_tables(rows_from_records(outcome.records), busbw_by_size(outcome.allreduce)):
        console.print(table)
    if any(info["simulated"] for info in plan.devices.values()):
        err.print("note: simulated CPU devices share this machine's cores; these numbers test the "
                  "harness and the frameworks' CPU paths, not multi-GPU scaling.")
    err.print(f"{len(outcome.records)} trial replicate(s) in {outcome.seconds:.0f} s; "
              f"records: {plan.run_dir / RECORDS_FILE}")
    from xbench.cli.report_cmd import make_report

    err.print(f"report: {make_report(plan.run_dir, html=True)[0]}")
    if outcome.failures:
        err.print(f"[red]{outcome.failures} trial(s) or all-reduce measurement(s) failed or did not pass "
                  f"verification[/]; reasons in the tables, verify.json and {plan.run_dir / 'workers.log'}")
        return 1
    return 0


def _interrupted_message(run_dir: Path) -> str:
    records = run_dir / RECORDS_FILE
    kept = sum(1 for _ in iter_records(records)) if records.exists() else 0
    if kept:
        return (f"interrupted; {kept} finished trial record(s) kept in {records}; "
                f"`xbench compare --resume {run_dir}` runs the rest")
    if (run_dir / RUN_FILE).exists():
        return (f"interrupted before any trial finished; nothing was measured yet; "
                f"`xbench compare --resume {run_dir}` starts it again")
    return "interrupted before the run started; nothing was written"


def _report_verification(err: Console, outcome: dict[str, dict]) -> None:
    for backend, result in outcome.items():
        if result["status"] == "passed" and not result["checks"]:
            err.print(f"verify {backend}: nothing to compare (one backend on one device); timing it")
        elif result["status"] == "passed":
            err.print(f"verify {backend}: [green]passed[/] ({result['checks']} checks; details in verify.json)")
        elif result["status"] == "unverifiable":
            err.print(f"verify {backend}: [yellow]not verifiable[/] ({escape(result['reason'])}); timing it anyway")
        else:
            err.print(f"verify {backend}: [red]FAILED[/], its trials are skipped:")
            for line in result["failed"]:
                err.print(f"  {escape(line)}")


class _Observer:
    """A progress bar over timed windows, and the run's messages, on stderr."""

    def __init__(self, console: Console, trials: int, repeats: int) -> None:
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.trials = trials
        self.task = self.progress.add_task("starting", total=trials * repeats)
        self.repeats = repeats
        self.finished = 0
        self.current: str | None = None
        self.windows = 0

    def phase(self, text: str):
        self.progress.stop()  # rich shows one live display at a time
        return self.console.status(text)

    def verified(self, outcome: dict) -> None:
        _report_verification(self.progress.console, outcome)

    def note(self, text: str) -> None:
        self.progress.console.print(f"[yellow]{escape(text)}[/]")

    def __enter__(self) -> _Observer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def trial_started(self, trial) -> None:
        self.progress.start()  # after verification: one live display at a time
        self.current, self.windows = trial.id, 0
        self.progress.update(self.task, description=f"[{self.finished + 1}/{self.trials}] {trial.id}")

    def window_done(self, trial, done: int) -> None:
        self.progress.advance(self.task, done - self.windows)
        self.windows = done

    def trial_finished(self, trial, record) -> None:
        # Skipped trials never started; windows may stop before `repeats` (steady, or out of budget).
        counted = self.windows if self.current == trial.id else 0
        self.progress.advance(self.task, self.repeats - counted)
        self.current, self.windows = None, 0
        self.finished += 1
        if record["status"] != "ok":
            self.progress.console.print(f"{trial.id}: {record['status']}: {escape(str(record.get('reason')))}")
