"""The stacked LSTM of the jax backends as Flax NNX writes it: `nnx.RNN` over
`nnx.OptimizedLSTMCell` per layer (h and c start at zero), then an `nnx.Linear` head on the
top layer's last h; mean squared error in float32 (float64 in fp64).

Layout: the core's, as is. The optimized cell computes z = x W + h U + b with W its `dense_i`
kernel [in, 4 hidden] (no bias), U its `dense_h` kernel [hidden, 4 hidden] and b `dense_h`'s
bias, and splits z into gates i, f, g, o: the core's cell and order exactly.
"""

from __future__ import annotations

from xbench.contract import Trial, Work
from xbench_backends.jax.layers import compute_dtype, mean_squared_error, parameter_dtype


def constructor(trial: Trial, work: Work, variant: str):
    from flax import nnx

    dims = work.model.shape
    dtype, param_dtype = compute_dtype(trial), parameter_dtype(trial)
    hidden = dims["hidden"]

    class LSTM(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            sizes = [dims["inputs"]] + [hidden] * (dims["layers"] - 1)
            self.layers = nnx.List([
                nnx.RNN(nnx.OptimizedLSTMCell(size, hidden, dtype=dtype, param_dtype=param_dtype, rngs=rngs),
                        rngs=rngs) for size in sizes])
            self.head = nnx.Linear(hidden, dims["outputs"], dtype=dtype, param_dtype=param_dtype, rngs=rngs)

        def __call__(self, x, rngs=None):
            h = x.astype(dtype)
            for layer in self.layers:
                h = layer(h, initial_carry=zero_carry(h))  # [batch, time, hidden]
            return self.head(h[:, -1])

    def zero_carry(h):
        """(c, h) = 0, made from the input so that under shard_map it is typed per device like
        the scan's output carry (nnx.RNN's own zeros are not, and lax.scan refuses them)."""
        import jax.numpy as jnp

        zeros = jnp.broadcast_to(jnp.zeros_like(h[:, 0, :1], dtype=param_dtype), (h.shape[0], hidden))
        return zeros, zeros

    return lambda: LSTM(nnx.Rngs(0))


def paths(dims) -> list[tuple]:
    found = []
    for layer in range(dims["layers"]):
        cell = ("layers", layer, "cell")
        found += [(*cell, "dense_i", "kernel"), (*cell, "dense_h", "kernel"), (*cell, "dense_h", "bias")]
    return found + [("head", "kernel"), ("head", "bias")]


def objective(pred, y):
    return mean_squared_error(pred, y)


def notes(trial: Trial, work: Work, device, variant: str) -> tuple[str, ...]:
    return ("LSTM: nnx.RNN over nnx.OptimizedLSTMCell (gates i, f, g, o; one matmul per step for x and one for h); "
            "XLA kernels, no cuDNN LSTM",)
