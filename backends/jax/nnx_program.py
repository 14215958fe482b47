"""The jax program as Flax NNX users write it for one device: the model an `nnx.Module`,
`nnx.Optimizer(model, optax.adam(...), wrt=nnx.Param)`, and an `@nnx.jit` train step that
takes the model and the optimizer themselves (NNX walks their object graph in Python on
every call, the cost Flax's performance guide names) and updates them in place.

The batch is picked inside the step from the optimizer's step counter (batch k mod batches,
as every xbench program), the data resident on the device. Model and optimizer state are
donated, as a functional step donates its state. Dropout draws from the stream the model
holds (`nnx.Dropout(rngs=...)`), advanced by NNX at each call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xbench.contract import PreparedInfo, Trial, Work
from xbench_backends.extra_work import ExtraWork
from xbench_backends.jax.layers import float64_scope, in_precision
from xbench_backends.jax.steps import optimizer


@dataclass
class NnxPrepared:
    info: PreparedInfo
    model: Any  # the nnx.Module on the device
    optimizer: Any  # nnx.Optimizer
    step: Any  # nnx.jit: (model, optimizer, xs, ys) -> loss
    loss_and_grads: Any  # nnx.jit: (model, optimizer, xs, ys) -> (loss, gradients as an nnx.State)
    paths: tuple
    xs: Any
    ys: Any
    float64: bool = False
    extra: ExtraWork = field(default_factory=ExtraWork)  # the extra_work option's calls
    objective: Any = None  # objective(output, targets): the family's loss (`shard_losses`)
    shard_programs: dict = field(default_factory=dict)  # shards -> jitted slice losses, built on first use


def build(trial: Trial, work: Work, device, parts, objective):
    """The model (from `parts`, an `nnx_common.NnxParts`), its optimizer, the data on
    `device`, and the two nnx.jit programs: (model, optimizer, step, loss_and_grads, xs, ys)."""
    import jax
    from flax import nnx

    model = parts.merged(jax.device_put(parts.params, device), jax.device_put(parts.rest, device))
    opt = nnx.Optimizer(model, optimizer(trial.learning_rate), wrt=nnx.Param)
    # Every piece of state committed to the device, as the step's outputs will be: the
    # optimizer's counters start uncommitted, and the second call would compile again.
    nnx.update((model, opt), jax.device_put(nnx.state((model, opt)), device))
    xs, ys = (jax.device_put(a[0], device) for a in in_precision(work.shards(trial.global_batch, 1), trial))
    batches = xs.shape[0]

    def loss_and_grads(model, opt, xs, ys):
        index = opt.step[...] % batches
        x, y = xs[index], ys[index]
        return nnx.value_and_grad(lambda m: objective(m(x), y))(model)

    @nnx.jit(donate_argnums=(0, 1))
    def step(model, opt, xs, ys):
        loss, grads = loss_and_grads(model, opt, xs, ys)
        opt.update(model, grads)
        return loss

    return model, opt, step, nnx.jit(loss_and_grads), xs, ys


def run(prepared: NnxPrepared, steps: int) -> None:
    import jax

    # Locals, not attribute lookups, inside the loop: it is the user's loop being timed.
    step, model, opt, xs, ys = prepared.step, prepared.model, prepared.optimizer, prepared.xs, prepared.ys
    loss = None
    with float64_scope(prepared.float64):
        for _ in range(steps + prepared.extra.owed(steps)):  # + the extra_work option's calls
            loss = step(model, opt, xs, ys)
        jax.block_until_ready(loss)  # the step's one executable wrote the model's new state too


def gradients(prepared: NnxPrepared) -> tuple[float, list[np.ndarray]]:
    from xbench_backends.jax.nnx_common import in_order

    with float64_scope(prepared.float64):
        loss, grads = prepared.loss_and_grads(prepared.model, prepared.optimizer, prepared.xs, prepared.ys)
        return float(loss), [np.asarray(g) for g in in_order(grads, prepared.paths)]


def train(prepared: NnxPrepared, steps: int) -> list[float]:
    with float64_scope(prepared.float64):
        return [float(prepared.step(prepared.model, prepared.optimizer, prepared.xs, prepared.ys))
                for _ in range(steps)]


def shard_losses(prepared: NnxPrepared, shards: int) -> list[float]:
    """The loss of each of `shards` consecutive slices of the current step's batch (the one
    `loss_and_grads` picks: the optimizer's step mod the batches), each its own forward pass of
    the module in training mode. Flax's functional pattern under `jax.jit`: the module split
    (`nnx.split`) and merged inside, so what a call would update (BatchNorm's running averages,
    the dropout stream's count) changes only that traced copy, never the module."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from xbench_backends.jax.steps import check_shards

    check_shards(prepared.xs.shape[1], 1, shards)
    graphdef, state = nnx.split(prepared.model)
    batches, objective = prepared.xs.shape[0], prepared.objective
    if shards not in prepared.shard_programs:
        def losses(state, xs, ys, step):
            model = nnx.merge(graphdef, state)
            index = step % batches
            x, y = xs[index], ys[index]
            size = x.shape[0] // shards
            return jnp.stack([objective(model(x[i * size:(i + 1) * size]), y[i * size:(i + 1) * size])
                              for i in range(shards)])

        prepared.shard_programs[shards] = jax.jit(losses)
    with float64_scope(prepared.float64):
        values = prepared.shard_programs[shards](state, prepared.xs, prepared.ys, prepared.optimizer.step[...])
        return [float(v) for v in np.asarray(values)]


def weights(prepared: NnxPrepared) -> list[np.ndarray]:
    from flax import nnx

    from xbench_backends.jax.nnx_common import in_order

    return [np.asarray(w) for w in in_order(nnx.state(prepared.model, nnx.Param), prepared.paths)]
