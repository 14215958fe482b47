"""`jax:fsdp`: the `jax` backend's sharded data-parallel program, the FSDP pattern of Flax
NNX's sharding guide and MaxText: one `jax.jit` over a 1-D mesh (axis "d") with
`NamedSharding`s, the batch split on "d" as in the other programs, and every parameter and
both of Adam's moments split on "d" too (each along its largest dimension the device count
divides, `xbench_backends.sharding`; what none divides stays whole on every device).

In the step, each parameter is constrained to be whole (`with_sharding_constraint` to P()):
XLA all-gathers it where the forward needs it, and the transpose of that constraint, with the
gradient's own sharding constrained to the parameter's, makes the gradient's reduction a
reduce-scatter: each device receives the mean gradient of its own share and updates only that
share of the parameters and moments. The model, loss, optimizer and data are `jax`'s
(`families`, `steps`); the loss is the global batch's mean, so the gradient is the mean over
the devices' shares. Dropout (the MLP's) draws one mask over the global batch per step, as
`jax-auto` does (verify runs without dropout).

On 1 device the mesh has one device and nothing is divided: the program's own 1-device run.
`fsdp-remat` is this program over the model built with each block under nnx.remat
(`nnx_transformer`): the backward pass recomputes each block's activations from its input;
the parameters are gathered as in `fsdp` (whether a gathered parameter is kept for the
backward pass or gathered again is XLA's choice in either).
One process drives every device (the subprocess launcher); under spmd it is refused.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from xbench.contract import PreparedInfo, Trial, Unsupported, Work, hash_weights
from xbench_backends import sharding
from xbench_backends.jax.families import JaxModel
from xbench_backends.jax.steps import (
    AXIS,
    check_shards,
    dropout_rng,
    initial_state,
    kernel_settings,
    optimizer,
    train_steps,
)

# A classic sharding slip, planted by tests (verify must fail it): each device's gradient of
# its share summed over the devices instead of averaged, N times the step's gradient.
SUM_SHARD_GRADIENTS = False


def prepare(trial: Trial, work: Work, model: JaxModel, devices: list, precision: dict[str, Any],
            notes: tuple[str, ...]):
    """The prepared `jax:fsdp` trial, a `pmap.JaxPrepared` (imported here: pmap imports this
    module) whose state is the sharded one, without a device axis."""
    import jax

    from xbench_backends.jax.pmap import JaxPrepared

    n = len(devices)
    shapes = [tuple(p.shape) for p in work.parameters]
    why = sharding.refusal(shapes, n) or (None if trial.all_reduce else sharding.NO_TWIN)
    if jax.process_count() > 1:  # verification reads whole arrays and every device's copy from this process
        why = why or (f"jax:{trial.variant} runs with one process driving every device (--launcher subprocess); "
                      "its readback of gathered weights and gradients is not written for one process per device")
    if why:
        raise Unsupported(why)
    mesh = jax.sharding.Mesh(np.array(devices), (AXIS,))
    tx = optimizer(trial.learning_rate)
    state = initial_state(model.params, tx, trial.seed)
    state_sharding = (_divided(mesh, state[0]), _divided(mesh, state[1]), _named(mesh), _named(mesh))
    state = jax.device_put(state, state_sharding)
    batch = _named(mesh, None, AXIS)
    xs, ys = (jax.device_put(_regroup(a), batch) for a in _in_precision(work, trial, n))

    loss_and_grads = _loss_and_grads(model, mesh, state_sharding[0], work.x.shape[0] // trial.global_batch)
    shardings = dict(in_shardings=(state_sharding, batch, batch))
    step = jax.jit(train_steps(tx, loss_and_grads, trial.protocol.steps_per_call), donate_argnums=0,
                   out_shardings=(state_sharding, _named(mesh)), **shardings)
    grads = jax.jit(loss_and_grads, out_shardings=(_named(mesh), state_sharding[0]), **shardings)
    divided, tensors, fraction = sharding.divided_share(shapes, n)
    info = PreparedInfo(
        params=sum(int(np.prod(a.shape)) for a in jax.tree.leaves(state[0])),
        weights_hash=hash_weights([np.asarray(a) for a in model.in_order(state[0])]),
        precision=precision,
        # Back-to-back collective steps can deadlock on simulated CPU devices: wait for each.
        sync_every_call=devices[0].platform == "cpu",
        notes=(f"fsdp: jax.jit with NamedShardings over {n} device(s); parameters and Adam's moments split "
               f"on 'd' ({divided} of {tensors} tensors, {fraction:.1%} of the parameters, each along its largest "
               f"dimension {n} divides; the rest whole), gathered whole before use (with_sharding_constraint: an "
               "all-gather, in the parameters' float32), gradients reduce-scattered into the parameters' sharding "
               "by XLA; a functional step (Flax NNX model merged inside)", *notes,
               *(("dropout: one mask over the global batch per step and layer",)
                 if work.model.family == "mlp" else ())),
        settings=kernel_settings(),
    )
    shard_program = functools.cache(lambda shards: _shard_program(model, mesh, state_sharding, batch, n, shards,
                                                                  work.x.shape[0] // trial.global_batch))
    return JaxPrepared(info, step, grads, state, xs, ys, trial.protocol.steps_per_call, model.in_order,
                       stacked=False, global_batch=trial.global_batch, shard_program=shard_program,
                       gather_replicas=functools.partial(_replicas, mesh, devices, model.in_order))


def _loss_and_grads(model: JaxModel, mesh, param_sharding, batches: int):
    """(state, xs, ys) -> (the global batch's mean loss, its gradient in the parameters'
    sharding): each parameter gathered whole for the forward, the gradient reduce-scattered."""
    import jax
    from jax import lax

    whole, rows = _named(mesh), _named(mesh, AXIS)
    devices = mesh.devices.size

    def loss_and_grads(state, xs, ys):
        params, _, step, key = state
        x, y = (lax.with_sharding_constraint(lax.dynamic_index_in_dim(a, step % batches, keepdims=False), rows)
                for a in (xs, ys))
        rng = jax.random.fold_in(jax.random.wrap_key_data(key), step)

        def loss(params):
            gathered = jax.tree.map(lambda p: lax.with_sharding_constraint(p, whole), params)
            return model.loss_fn(gathered, x, y, rng)

        value, grads = jax.value_and_grad(loss)(params)
        if SUM_SHARD_GRADIENTS:
            grads = jax.tree.map(lambda g: g * devices, grads)
        return value, jax.tree.map(lax.with_sharding_constraint, grads, param_sharding)

    return loss_and_grads


def _shard_program(model: JaxModel, mesh, state_sharding, batch, devices: int, shards: int, batches: int):
    """`(state, xs, ys) -> losses`: the current batch cut into `shards` groups of consecutive
    rows, the groups on "d" (device i holds group i, the rows its step computes), the loss of
    each with the parameters gathered whole; no gradient, no reduction. On one device every
    group there, each its own forward pass."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    whole = _named(mesh)
    grouped = _named(mesh, AXIS) if devices > 1 else whole

    def losses(state, xs, ys):
        params, _, step, key = state
        gathered = jax.tree.map(lambda p: lax.with_sharding_constraint(p, whole), params)
        x, y = (lax.dynamic_index_in_dim(a, step % batches, keepdims=False) for a in (xs, ys))
        x, y = (lax.with_sharding_constraint(a.reshape(shards, a.shape[0] // shards, *a.shape[1:]), grouped)
                for a in (x, y))

        def one(i, xi, yi):
            return model.loss_fn(gathered, xi, yi, dropout_rng(key, step, shards, lambda: i))

        return jax.vmap(one)(jnp.arange(shards), x, y)

    program = jax.jit(losses, in_shardings=(state_sharding, batch, batch), out_shardings=grouped)

    def checked(state, xs, ys):
        check_shards(xs.shape[1], devices, shards)
        return program(state, xs, ys)

    return checked


def _replicas(mesh, devices: list, in_order, state) -> list[list[np.ndarray]]:
    """Each device's view of the full weights: the shards all-gathered onto every device (a
    compiled identity into P()), then read from each device's own buffer, in canonical order."""
    import jax

    whole = jax.jit(lambda params: params, out_shardings=_named(mesh))(state[0])
    leaves = in_order(whole)
    return [[next(np.asarray(s.data) for s in leaf.addressable_shards if s.device == device) for leaf in leaves]
            for device in devices]


def _divided(mesh, tree):
    """A NamedSharding per leaf: split on "d" along `sharding.shard_dim`, whole where none."""
    import jax

    n = mesh.devices.size

    def spec(leaf):
        shape = np.shape(leaf)
        dim = sharding.shard_dim(shape, n) if n > 1 else None
        return _named(mesh, *(AXIS if d == dim else None for d in range(len(shape)))) if dim is not None \
            else _named(mesh)

    return jax.tree.map(spec, tree)


def _in_precision(work: Work, trial: Trial, devices: int):
    from xbench_backends.jax.layers import in_precision

    return in_precision(work.shards(trial.global_batch, devices), trial)


def _regroup(a: np.ndarray) -> np.ndarray:
    """The core's [devices, batches, per_device, ...] as [batches, global batch, ...]: device r
    holds the rows it holds in the other programs."""
    n, batches, per, *sample = a.shape
    return np.ascontiguousarray(np.swapaxes(a, 0, 1).reshape(batches, n * per, *sample))


def _named(mesh, *axes):
    import jax

    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))
