"""Which model a jax backend builds, by `work.model.family` and the trial's variant, and the
readback that every family shares.

As written, every family is a Flax NNX module (`nnx_mlp`, `nnx_transformer`, `nnx_cnn`,
`nnx_lstm`): what JAX users write today. The `jnp` variant keeps the earlier programs (`mlp`
through flax.linen's functional apply, `transformer`, `cnn` and `lstm` in plain jax.numpy),
so that a report shows what Flax NNX costs or saves. Either way `build` gives the step
programs (`steps`) the same things: the parameters as a pytree of numpy arrays, the loss
`loss_fn(params, x, y, rng)` they differentiate, and how to read any tree shaped like the
parameters (weights, gradients, device-stacked copies) in the core's canonical order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from xbench.contract import Trial, Work
from xbench_backends.jax import cnn, lstm, mlp, nnx_cnn, nnx_lstm, nnx_mlp, nnx_transformer, transformer
from xbench_backends.jax.layers import FLOAT64, in_precision
from xbench_backends.recompute import RECOMPUTING
from xbench_backends.recompute import refusal as remat_refusal

JNP_MODELS: dict[str, ModuleType] = {"mlp": mlp, "transformer": transformer, "cnn": cnn, "lstm": lstm}
NNX_MODELS: dict[str, ModuleType] = {"mlp": nnx_mlp, "transformer": nnx_transformer, "cnn": nnx_cnn,
                                     "lstm": nnx_lstm}
FAMILIES: tuple[str, ...] = tuple(NNX_MODELS)
JNP = "jnp"  # the variant that runs the plain jax.numpy models


@dataclass(frozen=True)
class JaxModel:
    """A trial's model as the step programs use it."""

    params: Any  # pytree of numpy arrays in the trial's precision (NNX: an nnx.State)
    loss_fn: Callable  # loss_fn(params, x, y, rng): this device's mean loss
    in_order: Callable[[Any], list]  # a tree shaped like `params` -> its leaves in canonical order
    notes: tuple[str, ...]
    nnx: Any = None  # nnx_common.NnxParts (NNX models only), for the nnx.jit program
    objective: Callable | None = None  # objective(output, targets) (NNX models only)


def build(trial: Trial, work: Work, device, batch_groups: int = 1) -> JaxModel:
    """The model of `trial`. `batch_groups`: how many devices' batches one call of the loss
    sees (`jax-auto` holds the global batch), so that batch statistics stay per device."""
    groups = batch_groups if work.model.kind.batch_statistics else 1
    if trial.variant == JNP:
        return _jnp_model(trial, work, device, groups)
    return _nnx_model(trial, work, device, groups)


def _jnp_model(trial: Trial, work: Work, device, groups: int) -> JaxModel:
    import jax

    module = JNP_MODELS[work.model.family]
    loss_fn = (module.loss_function(trial, work, batch_groups=groups) if work.model.kind.batch_statistics
               else module.loss_function(trial, work))
    found = getattr(module, "notes", None)
    notes = tuple(found(trial, work, device)) if found else ()
    return JaxModel(in_precision(module.initial_params(work), trial), loss_fn, jax.tree.leaves,
                    ("jnp: the model in plain jax.numpy over the core's arrays" +
                     (" (the MLP through flax.linen's apply)" if work.model.family == "mlp" else ""), *notes))


def _nnx_model(trial: Trial, work: Work, device, groups: int) -> JaxModel:
    from xbench_backends.jax.nnx_common import functional_loss, in_order, materialize

    module = NNX_MODELS[work.model.family]
    parts = materialize(module.constructor(trial, work, trial.variant), module.paths(work.model.shape),
                        in_precision(list(work.arrays), trial), float64=trial.precision == FLOAT64)
    dropout = work.model.family == "mlp" and work.model.dropout > 0
    loss_fn = functional_loss(parts, module.objective, groups, dropout)
    return JaxModel(parts.params, loss_fn, lambda tree: in_order(tree, parts.paths),
                    tuple(module.notes(trial, work, device, trial.variant)), parts, module.objective)


def refusal(trial: Trial, work: Work, device) -> str | None:
    """Why a variant of the model cannot run this trial here, or None."""
    if trial.variant in nnx_transformer.FUSED_ATTENTION:
        if work.model.family != "transformer":
            return (f"the {trial.variant} variant runs attention through cuDNN; the "
                    f"{work.model.family} family has no attention")
        return nnx_transformer.cudnn_refusal(trial, work, device)
    if trial.variant in RECOMPUTING:
        return remat_refusal(work.model.family, trial.variant)
    return None


def canonical_arrays(leaves: list, replica: int) -> list[np.ndarray]:
    """The parameters (or gradients) of one replica, from device-stacked leaves (a leading
    device axis) in canonical order."""
    return [replica_array(leaf, replica) for leaf in leaves]


def replica_array(leaf, replica: int) -> np.ndarray:
    """Row `replica` of a device-stacked array, bit for bit: read from the device buffer that
    holds it. (Indexing a sharded jax array runs an XLA program, which on CPU turned a -0.0
    of the core's weights into +0.0 and so changed the weights hash.)"""
    for shard in getattr(leaf, "addressable_shards", ()):
        rows = shard.index[0] if shard.index else slice(None)
        start, stop, _ = rows.indices(leaf.shape[0])
        if start <= replica < stop:
            return np.asarray(shard.data)[replica - start]
    return np.asarray(leaf)[replica]
