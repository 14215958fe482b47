"""Which model a jax backend builds, by `work.model.family`, and the readback that every
family shares.

Each family module (`mlp`, `transformer`, `cnn`, `lstm`) gives `initial_params(work)` (the
params pytree, built from the core's numpy arrays), `loss_function(trial, work)` (the loss
`loss_fn(params, x, y, rng)` the step programs differentiate) and, except the MLP, `notes`.
Every params pytree flattens (`jax.tree.leaves`) to the core's canonical order and layout,
so readback needs no family knowledge: the MLP keeps its tuned [(kernel, bias), ...], the
others a flat list.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from xbench.contract import Trial, Work
from xbench_backends.jax import cnn, lstm, mlp, transformer

MODELS: dict[str, ModuleType] = {"mlp": mlp, "transformer": transformer, "cnn": cnn, "lstm": lstm}
FAMILIES: tuple[str, ...] = tuple(MODELS)


def model(work: Work) -> ModuleType:
    return MODELS[work.model.family]


def initial_params(work: Work):
    return model(work).initial_params(work)


def loss_function(trial: Trial, work: Work, batch_groups: int = 1):
    """The family's loss. `batch_groups`: how many devices' batches one call of the loss
    sees (`jax-auto` holds the global batch), so that batch statistics stay per device."""
    if work.model.kind.batch_statistics:
        return model(work).loss_function(trial, work, batch_groups=batch_groups)
    return model(work).loss_function(trial, work)


def notes(trial: Trial, work: Work, device) -> tuple[str, ...]:
    found = getattr(model(work), "notes", None)
    return tuple(found(trial, work, device)) if found else ()


def canonical_arrays(params, replica: int) -> list[np.ndarray]:
    """The parameters (or gradients) of one replica, from device-stacked leaves (a leading
    device axis), in canonical order and layout."""
    import jax

    return [replica_array(leaf, replica) for leaf in jax.tree.leaves(params)]


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
