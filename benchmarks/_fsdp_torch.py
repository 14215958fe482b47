"""fsdp_loops.py's minimal torch FSDP loop, as torchtitan writes it: expert_loops.py's
nanoGPT-style GPT-2 (`_expert_torch.torch_gpt_class`, the core's weights loaded), each block
`torch.compile`d and then `fully_shard`ed, the root sharded last (FSDP2's defaults:
reshard_after_forward, implicit prefetching), bf16 through MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32) with float32 master weights, fused Adam over the shards. One process per
device (NCCL on GPUs, gloo on CPUs), each on its own rows of the global batch."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta

from _expert_config import Loop, LoopContext
from _expert_torch import steps_loop, torch_adam, torch_gpt2_built, torch_settings

TIMEOUT_S = 300.0  # a lost rank fails the job instead of hanging it


def init_rank(rank: int, world: int, port: int, gpu: bool):
    """Join the job; returns this rank's device."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if gpu:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # the ranks share the host's cores
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S))
    return device


def slowest(elapsed: float) -> float:
    """The largest of the ranks' values, so that every rank decides alike."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([elapsed], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def torch_fsdp_gpt2(ctx: LoopContext, rank: int, world: int, compiled: bool) -> tuple[Loop, Callable]:
    """This rank's loop; returns it and a reader of the peak bytes of every rank's device."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model, count = torch_gpt2_built(ctx, compiled)
    mesh = init_device_mesh(ctx.device.type, (world,))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if ctx.precision == "bf16" else MixedPrecisionPolicy())
    for i, block in enumerate(model.h):
        unit = torch.compile(block) if compiled else block
        fully_shard(unit, mesh=mesh, mp_policy=policy)
        model.h[i] = unit
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.train()
    run, fused, last_loss = fsdp_training_loop(ctx, model, rank, world)
    notes = (f"FSDP2 fully_shard per block ({len(model.h)}) and at the root over {world} rank(s), {policy}",
             "torch.compile per block, before fully_shard" if compiled else "eager",
             f"torch.optim.Adam(fused={fused}); no autocast (the policy casts)")
    return Loop(run, count, notes, torch_settings(), last_loss), lambda: peak_bytes(ctx.device)


def fsdp_training_loop(ctx: LoopContext, model, rank: int, world: int) -> tuple[Callable, bool, Callable]:
    """forward (loss inside), backward, fused Adam, zero_grad(set_to_none=True), on this rank's
    rows of the core's batches, resident on the device."""
    import torch

    optimizer, fused = torch_adam(model.parameters(), ctx.learning_rate)
    xs, ys = (torch.from_numpy(a[rank]).to(ctx.device).long() for a in ctx.work.shards(ctx.batch, world))
    run, last_loss = steps_loop(model, optimizer, xs, ys, ctx.device)
    return run, fused, last_loss


def peak_bytes(device) -> list[int] | None:
    """Every rank's peak bytes allocated by torch (gathered); None on CPUs."""
    import torch
    import torch.distributed as dist

    if device.type != "cuda":
        return None
    mine = torch.tensor([torch.cuda.max_memory_allocated(device)], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [int(t.item()) for t in every]
