"""What the Flax NNX models of the jax backends share: building a model from the core's
arrays, reading its parameters back in canonical order, and the functional loss that the
step programs (pmap, shard_map, jit) differentiate.

A family's NNX module (`nnx_mlp`, `nnx_transformer`, `nnx_cnn`, `nnx_lstm`) gives:
- `constructor(trial, work, variant)`: a function that builds the nnx.Module (layers as
  `nnx.Linear`, `nnx.LayerNorm`, `nnx.Conv`, ...) in the trial's compute dtype;
- `paths(dims)`: where each canonical array lives in `nnx.state(model, nnx.Param)`, in
  canonical order (the layouts match: Flax keeps kernels [in, out] and HWIO, as the core);
- `objective(output, targets)`: the loss of the model's output, in float32 (float64 in fp64);
- `notes(trial, work, device, variant)`.
A model is called as `model(x, rngs=None)` in training mode; only the MLP draws dropout
masks, from `rngs` when given (the functional programs pass one key per step and device),
else from the stream it holds (the nnx.jit program, as NNX users write it).

The model is never initialised by Flax: `nnx.eval_shape` gives its structure, the core's
arrays fill the parameters, and the non-parameter state (BatchNorm's running statistics, the
streams of random keys) comes from one small compiled call in which XLA drops the parameters'
own initialisation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Path = tuple[Any, ...]


@dataclass(frozen=True)
class NnxParts:
    """An NNX model split as `nnx.split(model, nnx.Param, ...)` gives it: `params` with numpy
    leaves (the core's arrays), `rest` the non-parameter state (on the default device)."""

    graphdef: Any
    params: Any  # nnx.State of the parameters
    rest: Any  # nnx.State of everything else (BatchStat, RngKey, RngCount, ...)
    paths: tuple[Path, ...]  # canonical order

    def merged(self, params=None, rest=None):
        """A model from this structure: fresh Variables (`copy`), so that a traced step may
        update its state (an RNG count, BatchNorm's averages) without touching `rest`."""
        from flax import nnx

        return nnx.merge(self.graphdef, self.params if params is None else params,
                         self.rest if rest is None else rest, copy=True)


def materialize(constructor: Callable[[], Any], paths: Sequence[Path], arrays: Sequence[np.ndarray],
                float64: bool = False) -> NnxParts:
    """The model `constructor` builds, with parameters `arrays` (canonical order) at `paths`;
    `float64`: its floating non-parameter state too (Flax keeps BatchNorm's running
    statistics in float32 whatever the parameters' dtype)."""
    import jax
    from flax import nnx

    if len(paths) != len(arrays):
        raise ValueError(f"{len(paths)} NNX parameters for {len(arrays)} canonical arrays")
    graphdef, abstract, _ = nnx.split(nnx.eval_shape(constructor), nnx.Param, ...)
    found, wanted = {path for path, _ in nnx.to_flat_state(abstract)}, {tuple(p) for p in paths}
    if found != wanted:
        raise ValueError(f"the NNX model's parameters and the canonical arrays differ: only in the model "
                         f"{sorted(map(str, found - wanted))}, only canonical {sorted(map(str, wanted - found))}")
    # Built inside jit: only the small non-parameter state leaves the call, so XLA never
    # computes the parameters' own random initialisation.
    rest = jax.jit(lambda: nnx.split(constructor(), nnx.Param, ...)[2])()
    if float64:
        floating = jax.numpy.floating
        rest = jax.tree.map(lambda a: a.astype("float64") if jax.numpy.issubdtype(a.dtype, floating) else a, rest)
    pure = nnx.to_pure_dict(abstract)
    for path, array in zip(paths, arrays):
        expected = _at(pure, path).shape
        if tuple(expected) != tuple(np.shape(array)):
            raise ValueError(f"NNX parameter {'.'.join(map(str, path))} has shape {tuple(expected)}, "
                             f"the canonical array {np.shape(array)}")
        _set(pure, path, array)
    nnx.replace_by_pure_dict(abstract, pure)
    return NnxParts(graphdef, abstract, rest, tuple(tuple(p) for p in paths))


def in_order(params, paths: Sequence[Path]) -> list[Any]:
    """The leaves of a parameter state (parameters, gradients, or their device-stacked
    copies) in canonical order."""
    from flax import nnx

    pure = nnx.to_pure_dict(params)
    return [_at(pure, path) for path in paths]


def functional_loss(parts: NnxParts, objective: Callable, groups: int = 1, dropout: bool = False):
    """`loss_fn(params, x, y, rng)` for the step programs: Flax's functional pattern, the model
    merged from `params` inside the traced step (`nnx.merge`), its state updates (BatchNorm's
    running averages) dropped, since nothing reads them. `groups` > 1: the batch holds that
    many devices' batches (`jax-auto`), each normalised with its own statistics (a `vmap`
    over the groups, the model merged inside it). `dropout`: masks from `rng`."""
    import jax
    from flax import nnx

    def forward(params, x, rng):
        rngs = nnx.Rngs(dropout=rng) if dropout else None
        return parts.merged(params)(x, rngs=rngs)

    def loss_fn(params, x, y, rng):
        if groups == 1:
            return objective(forward(params, x, rng), y)
        grouped = x.reshape(groups, x.shape[0] // groups, *x.shape[1:])
        out = jax.vmap(lambda xg: forward(params, xg, rng))(grouped)
        return objective(out.reshape(x.shape[0], *out.shape[2:]), y)

    return loss_fn


def _at(tree, path: Path):
    for key in path:
        tree = tree[key]
    return tree


def _set(tree, path: Path, value) -> None:
    _at(tree, path[:-1])[path[-1]] = value
