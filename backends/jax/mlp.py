"""The MLP of the jax backends: a Flax module built from the core's numpy weights (kernel
[in, out] and bias per layer, the core's layout as is) and its loss. Its params
[(kernel, bias), ...] flatten to the core's canonical order (`families.canonical_arrays`).
How a step runs (pmap, shard_map, jit, the optimizer) is in `steps`, `pmap` and `shardmap`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from xbench.contract import Trial, Work


def initial_params(work: Work) -> list[tuple[np.ndarray, np.ndarray]]:
    """The params [(kernel, bias), ...] in layer order: the flattest tree, as a minimal loop
    holds it."""
    return [(kernel, bias) for kernel, bias in work.weights]


def flax_params(params) -> dict[str, Any]:
    """The Flax MLP's parameter dict from [(kernel, bias), ...]; built while tracing, so it
    costs nothing per step."""
    return {f"Dense_{i}": {"kernel": kernel, "bias": bias} for i, (kernel, bias) in enumerate(params)}


@functools.lru_cache(maxsize=None)
def mlp_class():
    import flax.linen as nn

    class MLP(nn.Module):
        widths: tuple[int, ...]
        outputs: int
        dropout: float
        dtype: Any = None  # compute dtype; parameters stay float32 (mixed precision)

        @nn.compact
        def __call__(self, x, train: bool):
            for width in self.widths:
                x = nn.relu(nn.Dense(width, dtype=self.dtype)(x))
                x = nn.Dropout(self.dropout, deterministic=not train)(x)
            return nn.Dense(self.outputs, dtype=self.dtype)(x)

    return MLP


def loss_function(trial: Trial, work: Work):
    """The `jax` backend's loss: mean squared error in float32 (float64 in fp64) of the Flax
    MLP, dropout on; `loss_fn(params, x, y, rng)`, differentiated with respect to `params`."""
    import jax.numpy as jnp

    from xbench_backends.jax.layers import compute_dtype, statistics_dtype

    dtype = compute_dtype(trial)
    loss_dtype = statistics_dtype(dtype)  # float32, float64 in fp64
    model = mlp_class()(widths=work.model.widths, outputs=work.model.outputs, dropout=work.model.dropout,
                        dtype=dtype)

    def loss_fn(params, x, y, rng):
        pred = model.apply({"params": flax_params(params)}, x, train=True, rngs={"dropout": rng}).astype(loss_dtype)
        return jnp.mean((pred - y) ** 2)

    return loss_fn

