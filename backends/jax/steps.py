"""How a step of the jax backends runs, shared by `jax` (pmap, and the plain jit program),
`jax-shardmap` and `jax-auto`: the training state, Adam, the fused multi-step program, the
dropout stream, losses read back, and the settings that decide which kernels run. The model
itself (what `loss_fn` computes) comes from the family's module (`families`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from xbench.contract import (
    ADAM,
    ALL_GATHER,
    AS_WRITTEN,
    COMPILE_CACHE_VARIABLE,
    REDUCE_SCATTER,
    Trial,
    Unsupported,
    Variant,
)

AXIS = "d"
# The spec's precision, spelled as jax_default_matmul_precision values. "fp64": float64
# operands, which XLA multiplies in float64 whatever this says; "highest" rules out any
# reduced-precision shortcut besides.
MATMUL_PRECISION = {"fp32": "float32", "tf32": "tensorfloat32", "bf16": "bfloat16", "fp64": "highest"}


@dataclass
class JaxAllReduce:
    reduce: Any
    buffer: Any
    sync_every_call: bool


@dataclass
class JaxCollective:
    """An all-gather or reduce-scatter: `op(buffer)` makes a new output each call."""

    op: Any
    buffer: Any
    sync_every_call: bool


def collective_shape(collective: str, nbytes: int, devices: int) -> tuple[int, int]:
    """Each device's input elements (its share for an all-gather, the whole buffer for a
    reduce-scatter) and the share, for nccl-tests' size `nbytes`; Unsupported for a collective
    jax's lax has none of here."""
    share = nbytes // 4 // devices
    if collective == ALL_GATHER:
        return share, share
    if collective == REDUCE_SCATTER:
        return share * devices, share
    raise Unsupported(f"no collective {collective!r} in jax's program (allgather, reducescatter)")


def run_collective(prepared: JaxCollective, iterations: int) -> None:
    """`iterations` out-of-place collectives of one buffer; returns after the last finished."""
    out = None
    for _ in range(iterations):
        out = prepared.op(prepared.buffer)
        if prepared.sync_every_call:
            out.block_until_ready()
    if out is not None:
        out.block_until_ready()


def check_variant(trial: Trial, variants: tuple[Variant, ...]) -> None:
    known = [AS_WRITTEN, *(v.name for v in variants)]
    if trial.variant not in known:
        raise ValueError(f"unknown variant {trial.variant!r} of {trial.backend}; known: {', '.join(known)}")


def step_losses(loss, steps_per_call: int) -> list[float]:
    """Each step's global loss from one call's output: [..., steps_per_call], the leading axes
    (devices, when there are any) holding equal shards' means, so their mean is global."""
    per_step = np.asarray(loss, np.float64).reshape(-1, steps_per_call).mean(axis=0)
    return [float(x) for x in per_step]


def initial_state(params, tx, seed: int):
    """(params, Adam state, step, dropout key data), with params the model's pytree
    (`families.JaxModel.params`: the NNX model's nnx.State of parameters; in the `jnp` variant
    the MLP's [(kernel, bias), ...] in layer order, the flattest tree, as a minimal loop holds
    it, and a flat list for the others). Every call flattens the state and builds it anew from
    the outputs, and nested dicts cost microseconds more per step than lists of tuples:
    measurable in a 0.1 ms step, and part of what NNX's state costs."""
    import jax

    return params, tx.init(params), np.int32(0), jax.random.key_data(jax.random.key(seed))


def optimizer(learning_rate: float):
    import optax

    return optax.adam(learning_rate, b1=ADAM.b1, b2=ADAM.b2, eps=ADAM.eps)


def programs(trial: Trial, loss_fn, tx, batches: int, reduce_gradients, devices: int, device_index):
    """Per-device functions (for pmap, or for jit on one device): `steps_per_call` fused
    training steps, and the loss and all-reduced gradients at the current state, both through
    the same `loss_and_grads`. `loss_fn(params, x, y, rng)` is the model's loss
    (`families.JaxModel.loss_fn`). `device_index()` is this device's index among `devices`, which
    picks its dropout stream (`dropout_rng`)."""
    import jax
    from jax import lax

    def loss_and_grads(state, xs, ys):
        params, _, step, key = state
        index = step % batches
        x = lax.dynamic_index_in_dim(xs, index, keepdims=False)
        y = lax.dynamic_index_in_dim(ys, index, keepdims=False)
        rng = dropout_rng(key, step, devices, device_index)
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, rng)
        return loss, reduce_gradients(grads)

    # This device's losses; no extra collective in the timed step.
    return train_steps(tx, loss_and_grads, trial.protocol.steps_per_call), loss_and_grads


def check_shards(global_batch: int, devices: int, shards: int) -> None:
    """`shard_losses`' refusals (the contract's `ReportsShardLosses`): `shards` must divide the
    global batch, and a program on N > 1 devices reports exactly its N devices' shares."""
    if shards < 1 or global_batch % shards:
        raise ValueError(f"{shards} shards do not divide the global batch of {global_batch}")
    if devices > 1 and shards != devices:
        raise ValueError(f"a program on {devices} devices reports {devices} shards (one per device), not {shards}")


def shard_loss_fn(loss_fn, batches: int, devices: int, device_index, shards: int):
    """A per-device function (for pmap, shard_map or jit on one device) `(state, xs, ys) ->
    losses`: the loss of the current step's batch as `loss_and_grads` picks it (batch step mod
    `batches`), with no gradient and no collective. On `devices` > 1: this device's own batch,
    one value (its share, as the step computes it: the same dropout stream too). On one device:
    that batch cut into `shards` consecutive slices, each its own forward pass (so batch
    statistics come from the slice), slice i drawing the dropout stream device i of `shards`
    would; `shards` values."""
    import jax.numpy as jnp
    from jax import lax

    def losses(state, xs, ys):
        params, _, step, key = state
        index = step % batches
        x = lax.dynamic_index_in_dim(xs, index, keepdims=False)
        y = lax.dynamic_index_in_dim(ys, index, keepdims=False)
        if devices > 1:
            return loss_fn(params, x, y, dropout_rng(key, step, devices, device_index))[None]
        size = x.shape[0] // shards
        return jnp.stack([loss_fn(params, x[i * size:(i + 1) * size], y[i * size:(i + 1) * size],
                                  dropout_rng(key, step, shards, lambda i=i: i))
                          for i in range(shards)])

    return losses


def dropout_rng(key_data, step, devices: int, device_index):
    """The dropout key of one (step, device): a single fold of the run's key, as a minimal
    loop folds in its step (each fold is a threefry kernel on a GPU: at 0.1 ms per step, one
    more is a measurable cost the user's loop does not pay). `device_index()` is called only
    with several devices."""
    import jax

    key = jax.random.wrap_key_data(key_data)
    return jax.random.fold_in(key, step if devices == 1 else step * devices + device_index())


def train_steps(tx, loss_and_grads, steps_per_call: int):
    """`steps_per_call` Adam steps fused with lax.scan; returns each step's loss, steps on the
    last axis (so that a per-device leading axis stays first for pmap and shard_map)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def one_step(state, xs, ys):
        params, opt_state, step, key = state
        loss, grads = loss_and_grads(state, xs, ys)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
        return (params, opt_state, step + 1, key), loss

    def train_steps(state, xs, ys):
        if steps_per_call == 1:  # no loop at all: the step a user jits
            state, loss = one_step(state, xs, ys)
            return state, loss[..., None]
        state, losses = lax.scan(lambda s, _: one_step(s, xs, ys), state, None, length=steps_per_call)
        return state, jnp.moveaxis(losses, 0, -1)

    return train_steps


def use_compile_cache() -> bool:
    """Point JAX's persistent compilation cache at the run's directory when xbench gives one
    (contract: "Replicates"), caching every program however fast it compiled; call before
    anything compiles."""
    path = os.environ.get(COMPILE_CACHE_VARIABLE)
    if not path:
        return False
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return True


# XLA's CPU scheduler that overlaps independent ops (on by default) oversubscribes a small host
# when simulated devices each run their step on it: on 2 cores, 2 devices' steps of the large
# MLP flip within a process between ~10,500 and ~6,600 samples/s. Off, they hold ~10,500, and
# one device is unchanged (docs/statistics.md, "Bimodal processes"). CPU compilation only.
CPU_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"


def steady_cpu_scheduler() -> None:
    """Turn XLA's concurrency-optimized CPU scheduler off for this process, unless XLA_FLAGS
    already sets it (the user's choice wins); call before jax's CPU client starts. Recorded
    with the other flags (`kernel_settings`)."""
    default_xla_flag(CPU_SCHEDULER_FLAG, "false")


# XLA's GPU autotuning times candidate kernels for every matmul and convolution while it
# compiles, and that is most of jax's first call on a GPU: the large seed MLP compiled in
# 14.5-19.5 s on an H200 at levels 1-4, in 3 s at level 0 (XLA's default kernels). The level
# chooses among kernels for the same operations, so a verification run may skip the search.
GPU_AUTOTUNE_FLAG = "--xla_gpu_autotune_level"


def quick_gpu_compilation() -> None:
    """Turn XLA's GPU kernel autotuning off for this process, unless XLA_FLAGS already sets
    its level (the user's choice wins); call before jax's GPU client starts, in verification
    jobs only (`CompilesQuickly`). Recorded with the other flags (`kernel_settings`)."""
    default_xla_flag(GPU_AUTOTUNE_FLAG, "0")


def default_xla_flag(flag: str, value: str) -> None:
    """Add `flag=value` to XLA_FLAGS unless XLA_FLAGS already sets `flag`, to any value."""
    flags = os.environ.get("XLA_FLAGS", "")
    if not any(token.split("=", 1)[0] == flag for token in flags.split()):
        os.environ["XLA_FLAGS"] = f"{flags} {flag}={value}".strip()


def kernel_settings() -> dict[str, Any]:
    """What decides which kernels run, as this process sees it: XLA's flags (autotuning
    level among them; unset means XLA's default, autotuning on) and the compilation cache."""
    import jax

    return {"XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "compile_cache": jax.config.jax_compilation_cache_dir or None,
            "jax_default_matmul_precision": jax.config.jax_default_matmul_precision}
