"""expert_loops.py's child: one framework, one model group, in a process of its own. Per
configuration it builds every program of the lineup from the core's work, warms each up, times
them interleaved and prints its records (lines starting with MARK) for the parent."""

from __future__ import annotations

import atexit
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from _expert_config import (
    DEFAULT_LEARNING_RATE,
    LEARNING_RATE,
    MARK,
    SEED,
    Config,
    LoopContext,
    Unavailable,
    default_samples,
)
from _expert_lineups import Entry, lineup
from _expert_torch import torch_settings
from _interleave import Runner, calibrate, describe, median_interval, paired_ratio, race, warm_up

# A rough first call (compilation) on a GPU, to decide whether a program still fits before the
# deadline: jax compiles GPT-2 small / ResNet-50 in 20-40 s, torch.compile in 40-55 s.
FIRST_CALL_ESTIMATE_S = {"transformer": 60.0, "cnn": 75.0, "mlp": 20.0}
EAGER_FIRST_CALL_ESTIMATE_S = 10.0


@dataclass
class Side:
    """The framework side of a child: its backend, set up on one device, and the means to
    snapshot and restore the settings that are global to the process."""

    framework: str
    backend: Any
    device: Any
    platform: str
    device_name: str
    version: str
    details: dict[str, Any]
    snapshot: Callable[[], Callable[[], None]]  # the global settings now -> what puts them back
    free_memory: Callable[[], None]  # after a program failed: what it held
    between_configurations: Callable[[], None]
    teardown: Callable[[], None] = lambda: None
    fresh_compiler: Callable[[], None] = lambda: None  # before a compiling program's first call
    pristine: Callable[[], None] = lambda: None  # the settings as the process started

    def __post_init__(self) -> None:
        self.pristine = self.snapshot()


def jax_side(platform: str) -> Side:
    from importlib import metadata

    from xbench_backends.jax.pmap import JaxPmapBackend

    backend = JaxPmapBackend()
    info = backend.setup(1, platform)
    import jax

    def snapshot() -> Callable[[], None]:
        value = jax.config.jax_default_matmul_precision
        return lambda: jax.config.update("jax_default_matmul_precision", value)

    device = backend.devices[0]
    details = {**info.details, "jax": jax.__version__}
    for package in ("jaxlib", "flax", "optax", "jax-cuda13-plugin", "jax-cuda12-plugin"):
        try:
            details[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    def between_configurations() -> None:
        jax.clear_caches()  # the previous configuration's compiled programs (never mid-configuration)
        gc.collect()

    return Side("jax", backend, device, device.platform, device.device_kind, jax.__version__, details, snapshot,
                free_memory=gc.collect, between_configurations=between_configurations)


def torch_side(platform: str) -> Side:
    import torch

    from xbench.run.environment import cpu_name
    from xbench_backends.torch.ddp import TorchDdpBackend

    backend = TorchDdpBackend()
    info = backend.setup(1, platform)
    device = backend.device
    gpu = device.type == "cuda"

    def snapshot() -> Callable[[], None]:
        flags = torch_settings()

        def restore() -> None:
            torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
            torch.backends.cudnn.allow_tf32 = flags["cudnn_allow_tf32"]
            torch.backends.cuda.matmul.allow_tf32 = flags["cuda_matmul_allow_tf32"]
            torch.set_float32_matmul_precision(flags["float32_matmul_precision"])

        return restore

    def free_memory() -> None:
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()

    caches = tempfile.mkdtemp(prefix="expert-loops-inductor-")
    atexit.register(shutil.rmtree, caches, ignore_errors=True)

    def fresh_compiler() -> None:
        """A private, empty inductor cache for each compiled program's first call (set when it
        runs, not when it is built), so that none reuses the kernels another compiled and its
        first call is what a fresh process pays (but for importing the compiler)."""
        from torch._inductor.utils import clear_caches

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(dir=caches)
        clear_caches()  # inductor's in-memory caches; compiled programs keep what they loaded

    details = dict(info.details)
    try:
        import triton

        details["triton"] = triton.__version__
    except ImportError:
        pass
    return Side("torch", backend, device, "gpu" if gpu else "cpu",
                torch.cuda.get_device_name(device) if gpu else cpu_name(), torch.__version__, details, snapshot,
                free_memory, free_memory, backend.teardown, fresh_compiler)


def emit(record: dict[str, Any]) -> None:
    print(MARK + json.dumps(record), flush=True)


def progress(text: str) -> None:
    emit({"kind": "progress", "text": text})


def child(payload: dict[str, Any]) -> int:
    from xbench.contract import DeviceUnavailable

    options = payload["options"]
    try:
        side = (jax_side if payload["framework"] == "jax" else torch_side)(options["platform"])
    except DeviceUnavailable as err:
        print(f"{payload['framework']}: {err}", file=sys.stderr)
        return 1
    emit({"kind": "header", "framework": side.framework, "version": side.version, "platform": side.platform,
          "device": side.device_name, "details": side.details})
    for raw in payload["configs"]:
        config = Config(**raw)
        try:
            time_configuration(side, config, payload["group"], options)
        except Exception as err:  # a configuration that cannot even be set up must not stop the next
            emit({"kind": "error", "framework": side.framework, "config": asdict(config), "label": config.label,
                  "error": describe(err)})
        side.between_configurations()
    side.teardown()
    return 0


def time_configuration(side: Side, config: Config, group: str, options: dict[str, Any]) -> None:
    """Build every program of the configuration, warm each up, race them, emit the result."""
    from xbench.contract.work import build_work, data_samples
    from xbench.results.peaks import peak_for

    started = time.monotonic()
    model = config.model()
    samples = data_samples(model, options.get("samples") or default_samples(model.family, config.batch), config.batch)
    work = build_work(model, samples, SEED)
    learning_rate = LEARNING_RATE.get(model.family, DEFAULT_LEARNING_RATE)
    context = LoopContext(work, config.batch, config.precision, learning_rate, side.device, side.platform)
    where = f"{side.framework} {config.label} {config.precision}"
    entries = lineup(side.framework, model.family, side.platform, options)
    records = {e.name: {"name": e.name, "kind": e.kind, "status": "skipped", "reason": e.skip} for e in entries}

    runners = build_programs(side, entries, records, config, context, samples, options)
    alive = warm_up_all(side, model.family, warm_up_order(entries, runners), records, options, where)
    alive = [runner for runner in alive if calibrated(runner, records, options)]
    if alive:
        progress(f"{where}: timing {len(alive)} programs, {options['rounds']} rounds of ~{options['window_s']:g} s")
        race(alive, options["rounds"])
    reference = next((e.name for e in entries if e.kind == "minimal" and any(r.name == e.name for r in alive)), None)
    peak = peak_for(side.device_name, config.precision)
    units_per_step = config.batch * model.units_per_sample
    for runner in alive:
        records[runner.name].update(figures(runner, runners.get(reference), units_per_step,
                                           model.training_flops_per_sample * config.batch, peak))
        if runner.last_loss is not None and runner.error is None:  # a sanity figure, read after the windows
            records[runner.name]["last_loss"] = runner.last_loss()
    emit({"kind": "result", "framework": side.framework, "group": group, "config": asdict(config),
          "label": config.label, "precision": config.precision, "family": model.family, "unit": model.unit,
          "units_per_step": units_per_step, "flops_per_sample": model.training_flops_per_sample,
          "params_core": work.params, "samples": samples, "learning_rate": learning_rate,
          "device": side.device_name, "platform": side.platform,
          "peak": None if peak is None else asdict(peak), "reference": reference, "rounds": options["rounds"],
          "window_s": options["window_s"], "programs": [records[e.name] for e in entries],
          "wall_s": time.monotonic() - started})


def build_programs(side: Side, entries: list[Entry], records: dict[str, dict], config: Config,
                   context: LoopContext, samples: int, options: dict[str, Any]) -> dict[str, Runner]:
    """Every program that is not skipped, built before any runs: xbench's torch prepare
    resets torch.compile's caches, which would throw away a program compiled before it. A
    program that cannot be built is recorded (unsupported, unknown, error) and left out."""
    runners: dict[str, Runner] = {}
    for entry in (e for e in entries if not e.skip):
        side.pristine()  # each program starts from the process's own settings, as in a process of its own
        try:
            runner, facts = (build_xbench(side, entry, config, context.work, context.learning_rate, samples, options)
                             if entry.kind == "xbench" else build_minimal(side, entry, context, options))
        except Exception as err:
            records[entry.name].update(status=failure_status(entry, err), reason=describe(err))
            side.free_memory()
            continue
        runners[entry.name] = runner
        records[entry.name].update(status="built", reason=None, **facts)
    return runners


def warm_up_order(entries: list[Entry], runners: dict[str, Runner]) -> list[Runner]:
    """The reference candidate (the first minimal loop built) first, so that a deadline never
    leaves the others without it; then xbench's programs; then the other minimal loops."""
    minimal = [e.name for e in entries if e.kind == "minimal" and e.name in runners]
    xbench = [e.name for e in entries if e.kind == "xbench" and e.name in runners]
    return [runners[name] for name in (*minimal[:1], *xbench, *minimal[1:])]


def calibrated(runner: Runner, records: dict[str, dict], options: dict[str, Any]) -> bool:
    try:
        calibrate(runner, options["window_s"])
        return True
    except Exception as err:
        records[runner.name].update(status="error", reason=describe(err))
        return False


def failure_status(entry: Entry, err: Exception) -> str:
    """"unsupported" (it cannot run here), "unknown" (the backend has no such variant, yet),
    or "error"."""
    from xbench.contract import Unsupported

    if isinstance(err, (Unsupported, Unavailable)):
        return "unsupported"
    if entry.kind == "xbench" and isinstance(err, ValueError) and "variant" in str(err):
        return "unknown"
    return "error"


def build_xbench(side: Side, entry: Entry, config: Config, work, learning_rate: float, samples: int,
                 options: dict[str, Any]) -> tuple[Runner, dict[str, Any]]:
    """xbench's program through its backend, as the core prepares it (protocol of the variant)."""
    from xbench.contract import Trial, variants_of
    from xbench.contract.timing import TimingProtocol
    from xbench.run.plan import AS_WRITTEN_VARIANT, variant_protocol

    spec = entry.spec
    variant = variants_of(side.backend).get(spec.variant, AS_WRITTEN_VARIANT)
    protocol = variant_protocol(TimingProtocol(warmup_steps=options["warmup"]), variant)
    trial = Trial(backend=side.backend.name, model=work.model, devices=1, global_batch=config.batch,
                  scaling="strong", precision=config.precision, platform=options["platform"],
                  learning_rate=learning_rate, seed=SEED, samples=samples, protocol=protocol,
                  program=spec.program, variant=spec.variant)
    prepared = side.backend.prepare(trial, work)
    runner = Runner(entry.name, lambda steps: side.backend.run(prepared, steps), protocol.steps_per_call,
                    protocol.warmup_steps, side.snapshot())
    info = prepared.info
    return runner, {"params": info.params, "weights_match": info.weights_hash == work.weights_hash,
                    "precision_readback": info.precision, "settings": info.settings, "notes": list(info.notes),
                    "compiles": spec.compiles}


def build_minimal(side: Side, entry: Entry, context: LoopContext,
                  options: dict[str, Any]) -> tuple[Runner, dict[str, Any]]:
    loop = entry.spec.build(context)
    runner = Runner(entry.name, loop.run, 1, options["warmup"], side.snapshot(), loop.last_loss)
    return runner, {"params": loop.params, "precision_readback": loop.settings, "notes": list(loop.notes),
                    "compiles": entry.spec.compiles}


def warm_up_all(side: Side, family: str, runners: list[Runner], records: dict[str, dict], options: dict[str, Any],
                where: str) -> list[Runner]:
    """Each runner's first call and warm-up, in order (the reference first); those that fail
    are recorded and dropped, those that would not fit before the deadline skipped."""
    alive = []
    for n, runner in enumerate(runners):
        record = records[runner.name]
        if (reason := past_deadline(family, record.get("compiles", True), len(runners) + 1, options)) is not None:
            record.update(status="skipped", reason=reason)
            continue
        progress(f"{where}: first call of {runner.name} ({n + 1}/{len(runners)})")
        try:
            if record.get("compiles", True):
                side.fresh_compiler()
            warm_up(runner)
        except Exception as err:
            record.update(status="error", reason=describe(err))
            side.free_memory()
            continue
        record["first_call_s"] = runner.first_call_s
        progress(f"{where}: {runner.name}: first call {runner.first_call_s:.1f} s")
        alive.append(runner)
    return alive


def past_deadline(family: str, compiles: bool, programs: int, options: dict[str, Any]) -> str | None:
    """Why a program must be skipped to finish before the deadline, or None."""
    deadline = options.get("deadline")
    if deadline is None:
        return None
    first_call = FIRST_CALL_ESTIMATE_S.get(family, 60.0) if compiles else EAGER_FIRST_CALL_ESTIMATE_S
    timing = programs * (options["rounds"] + 2) * options["window_s"]
    left = deadline - time.time()
    if left >= first_call + timing + 10:
        return None
    return f"past the deadline: {left:.0f} s left, its first call and the timing need about {first_call + timing:.0f} s"


def figures(runner: Runner, reference: Runner | None, units_per_step: int, flops_per_step: int, peak) -> dict[str, Any]:
    """A timed runner's figures: ms/step, throughput, MFU, and its ratio to the reference."""
    per_step = runner.per_step_s
    if not per_step:
        return {"status": "error", "reason": runner.error or "no window timed"}
    ms = statistics.median(per_step) * 1e3
    mfu = None if peak is None else flops_per_step / (ms / 1e3) / peak.flops
    mfu_interval = None
    if peak is not None:
        low, high, _ = median_interval([flops_per_step / s / peak.flops for s in per_step])
        mfu_interval = [low, high]
    ratio = None if reference is None or reference.error else paired_ratio(reference.per_step_s, per_step)
    return {"status": "error" if runner.error else "timed", "reason": runner.error,
            "steps_per_call": runner.steps_per_call, "steps_per_window": runner.steps_per_window,
            "per_step_s": per_step, "ms": ms, "throughput": units_per_step / (ms / 1e3), "mfu": mfu,
            "mfu_interval": mfu_interval, "ratio": ratio}
