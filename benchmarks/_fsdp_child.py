"""fsdp_loops.py's children: one minimal FSDP loop on N devices, timed in windows of many steps
each ending in a device sync (the first call apart, then warm-up), its figures printed as one
record (a line starting with MARK) for the parent. jax: one process drives every device. torch:
this process starts one process per device; rank 0 reports."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

from _expert_child import emit, progress
from _expert_config import DEFAULT_LEARNING_RATE, LEARNING_RATE, SEED, LoopContext, default_samples
from _interleave import Runner, calibrate, describe, median_interval, race, warm_up


def child(payload: dict[str, Any]) -> int:
    """Run the payload's framework's minimal loop; 0 when it was timed."""
    try:
        if payload["framework"] == "jax":
            jax_child(payload)
        else:
            torch_child(payload)
    except Exception as err:
        emit({"kind": "error", "framework": payload["framework"], "error": describe(err)})
        return 1
    return 0


def context(payload: dict[str, Any], device, platform: str) -> tuple[LoopContext, Any]:
    """The core's work (initial weights, data) and the loop's context; and the model."""
    from xbench.contract.work import build_work, data_samples
    from xbench.models.model_spec import preset_model

    batch = payload["global_batch"]
    model = preset_model(payload["model"], batch_sizes=(batch,))
    samples = data_samples(model, default_samples(model.family, batch), batch)
    work = build_work(model, samples, SEED)
    learning_rate = LEARNING_RATE.get(model.family, DEFAULT_LEARNING_RATE)
    return LoopContext(work, batch, payload["precision"], learning_rate, device, platform), model


def jax_child(payload: dict[str, Any]) -> None:
    from _fsdp_jax import jax_fsdp_gpt2

    from xbench_backends.jax.pmap import JaxPmapBackend

    backend = JaxPmapBackend()  # its setup finds the devices (simulated ones on a CPU)
    backend.setup(payload["devices"], payload["platform"])
    devices = list(backend.devices)
    platform = "gpu" if devices[0].platform == "gpu" else "cpu"
    ctx, model = context(payload, devices[0], platform)
    attention = "cudnn" if platform == "gpu" and ctx.precision == "bf16" else None  # the expert's fastest
    progress(f"jax: building the sharded loop on {len(devices)} device(s), attention {attention or 'XLA'}")
    try:
        loop, peaks = jax_fsdp_gpt2(ctx, devices, attention)
        runner = time_loop("minimal jax fsdp", loop, payload)
    except Exception as err:
        if attention is None:
            raise
        # cuDNN's attention may not partition over a mesh in every jax: the loop an expert
        # falls back to is XLA's attention, and the record says so.
        progress(f"jax: cuDNN attention failed ({describe(err)[:300]}); again with XLA's")
        loop, peaks = jax_fsdp_gpt2(ctx, devices, None)
        runner = time_loop("minimal jax fsdp (XLA attention)", loop, payload)
    emit(result(payload, runner, loop, ctx, model, devices[0].device_kind, platform, peaks()))


def torch_child(payload: dict[str, Any]) -> None:
    """One process per device (spawned: CUDA cannot be forked), each joining the job."""
    import torch.multiprocessing as mp

    from xbench.run.cluster import free_port_block

    port = free_port_block(1)  # below the ephemeral range: free until the ranks, importing torch first, bind it
    mp.spawn(torch_rank, args=(payload, port), nprocs=payload["devices"], join=True)


def torch_rank(rank: int, payload: dict[str, Any], port: int) -> None:
    import torch
    import torch.distributed as dist
    from _fsdp_torch import init_rank, slowest, torch_fsdp_gpt2

    from xbench.run.environment import cpu_name

    world = payload["devices"]
    gpu = payload["platform"] == "gpu" or (payload["platform"] == "auto" and torch.cuda.is_available())
    device = init_rank(rank, world, port, gpu)
    try:
        ctx, model = context(payload, device, "gpu" if gpu else "cpu")
        say = progress if rank == 0 else (lambda text: None)
        say(f"torch: building the sharded loop on {world} rank(s)")
        loop, peaks = torch_fsdp_gpt2(ctx, rank, world, payload["compile"])
        runner = time_loop("minimal torch fsdp" + ("+compile" if payload["compile"] else ""), loop, payload, slowest,
                           say)
        memory = peaks()
        if rank == 0:
            name = torch.cuda.get_device_name(device) if gpu else cpu_name()
            emit(result(payload, runner, loop, ctx, model, name, ctx.platform, memory))
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()


def time_loop(name: str, loop, options: dict[str, Any], agree: Callable[[float], float] = lambda e: e,
              say: Callable[[str], None] = progress) -> Runner:
    """The first call, warm-up, windows calibrated to about window_s, then `rounds` windows."""
    runner = Runner(name, loop.run, 1, options["warmup"], last_loss=loop.last_loss)
    say(f"{name}: first call")
    warm_up(runner)
    say(f"{name}: first call {runner.first_call_s:.1f} s; calibrating windows")
    calibrate(runner, options["window_s"], agree=agree)
    say(f"{name}: {options['rounds']} windows of {runner.steps_per_window} steps")
    race([runner], options["rounds"])
    if runner.error is not None:
        raise RuntimeError(runner.error)
    return runner


def result(payload: dict[str, Any], runner: Runner, loop, ctx: LoopContext, model, device_name: str,
           platform: str, peaks: list[int] | None) -> dict[str, Any]:
    """The record: ms/step (median of the windows), tokens/s, MFU as xbench computes it (FLOPs
    per token x tokens/s over the devices' dense peak), peak memory of the fullest device."""
    from xbench.results.peaks import peak_for

    per_step = runner.per_step_s
    step_s = statistics.median(per_step)
    devices = payload["devices"]
    peak = peak_for(device_name, ctx.precision)
    flops_per_step = model.training_flops_per_sample * ctx.batch
    mfu = None if peak is None else flops_per_step / step_s / (devices * peak.flops)
    low, high, coverage = median_interval(per_step)
    return {"kind": "result", "framework": payload["framework"], "program": runner.name, "model": payload["model"],
            "global_batch": ctx.batch, "devices": devices, "precision": ctx.precision, "device": device_name,
            "platform": platform, "params": loop.params, "params_core": ctx.work.params,
            "first_call_s": runner.first_call_s, "steps_per_window": runner.steps_per_window,
            "per_step_s": per_step, "ms": step_s * 1e3, "ms_interval": [low * 1e3, high * 1e3, coverage],
            "tokens_per_s": ctx.batch * model.units_per_sample / step_s, "mfu": mfu,
            "memory_gib": None if peaks is None else max(peaks) / 2**30, "notes": list(loop.notes),
            "last_loss": runner.last_loss() if runner.last_loss else None}
