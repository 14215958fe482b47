"""fsdp_loops.py's minimal jax FSDP loop, as the Flax NNX sharding guide and MaxText write it:
expert_loops.py's plain jax.numpy GPT-2 (`_expert_jax.jax_gpt2_model`), its parameters and
Adam's moments split over a 1-D mesh axis "data" with NamedShardings, the batch split on "data"
too, and one `jax.jit` step with in/out shardings and the state donated; XLA's partitioner
all-gathers the weights where they are used and reduce-scatters the gradients."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from _expert_config import Loop, LoopContext
from _expert_jax import jax_gpt2_model

AXIS = "data"


def spec_for(shape: tuple[int, ...], devices: int):
    """The leaf's PartitionSpec: its largest dimension the device count divides on "data",
    else whole (the rule of xbench's jax:fsdp, so that both shard the same tensors)."""
    from jax.sharding import PartitionSpec

    dims = [d for d in range(len(shape)) if shape[d] % devices == 0 and shape[d] >= devices]
    if devices == 1 or not dims:
        return PartitionSpec()
    dim = max(dims, key=lambda d: shape[d])
    return PartitionSpec(*(AXIS if d == dim else None for d in range(len(shape))))


def jax_fsdp_gpt2(ctx: LoopContext, devices: list, attention: str | None) -> tuple[Loop, Callable]:
    """The sharded loop on `devices`; returns it and a reader of the peak bytes per device."""
    import jax

    params, loss_fn, note = jax_gpt2_model(ctx, attention)
    run, count, last_loss = sharded_training_loop(ctx, devices, params, loss_fn)
    notes = (note, f"params and Adam's moments split on '{AXIS}' over {len(devices)} device(s) (largest dimension "
                   "the count divides), batch split on it, one jax.jit with in/out shardings, state donated")
    loop = Loop(run, count, notes, {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision},
                last_loss)
    return loop, functools.partial(peak_bytes, devices)


def sharded_training_loop(ctx: LoopContext, devices: list, params, loss_fn) -> tuple[Callable, int, Callable]:
    import jax
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from xbench.contract import ADAM

    mesh = Mesh(np.array(devices), (AXIS,))

    def shardings(tree):
        return jax.tree.map(lambda leaf: NamedSharding(mesh, spec_for(np.shape(leaf), len(devices))), tree)

    tx = optax.adam(ctx.learning_rate, b1=ADAM.b1, b2=ADAM.b2, eps=ADAM.eps)
    params = jax.device_put(params, shardings(params))
    opt_shardings = shardings(jax.eval_shape(tx.init, params))
    opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
    whole = NamedSharding(mesh, PartitionSpec())
    state = (params, opt_state, jax.device_put(np.int32(0), whole))
    state_shardings = (shardings(params), opt_shardings, whole)
    rows = NamedSharding(mesh, PartitionSpec(None, AXIS))  # [batches, global batch, ...]: each device its rows
    xs, ys = (jax.device_put(a[0], rows) for a in ctx.work.shards(ctx.batch, 1))
    batches = xs.shape[0]

    @functools.partial(jax.jit, donate_argnums=0, in_shardings=(state_shardings, rows, rows),
                       out_shardings=(state_shardings, whole))
    def train_step(state, xs, ys):
        params, opt_state, step = state
        i = step % batches
        loss, grads = jax.value_and_grad(lambda p: loss_fn(p, (), xs[i], ys[i])[0])(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, step + 1), loss

    holder: list[Any] = [state, None]
    # Back-to-back collective steps deadlock on simulated CPU devices: wait for each there.
    wait_each = devices[0].platform == "cpu"

    def run(steps: int) -> None:
        state = holder[0]
        for _ in range(steps):
            state, loss = train_step(state, xs, ys)
            if wait_each:
                jax.block_until_ready(loss)
        holder[0], holder[1] = state, loss
        jax.block_until_ready(state)

    count = sum(int(leaf.size) for leaf in jax.tree.leaves(params))
    return run, count, lambda: float(holder[1])


def peak_bytes(devices: list) -> list[int] | None:
    """Each device's peak bytes in use (jax's allocator); None where it keeps no count (CPU)."""
    stats = [d.memory_stats() for d in devices]
    if any(not s or "peak_bytes_in_use" not in s for s in stats):
        return None
    return [int(s["peak_bytes_in_use"]) for s in stats]
