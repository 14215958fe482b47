"""The MLP of the jax backends as Flax NNX writes it: `nnx.Linear` layers with ReLU and
`nnx.Dropout` between them, from the core's arrays (kernel [in, out] and bias per layer: the
core's layout as is); mean squared error in float32 (float64 in fp64)."""

from __future__ import annotations

from xbench.contract import Trial, Work
from xbench.contract import mlp as core_mlp
from xbench_backends.jax.layers import compute_dtype, mean_squared_error, parameter_dtype


def constructor(trial: Trial, work: Work, variant: str):
    from flax import nnx

    sizes, rate = core_mlp.layer_sizes(work.model.shape), work.model.dropout
    dtype, param_dtype = compute_dtype(trial), parameter_dtype(trial)

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.layers = nnx.List([nnx.Linear(a, b, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
                                    for a, b in zip(sizes[:-1], sizes[1:])])
            self.dropout = nnx.Dropout(rate, rngs=rngs)

        def __call__(self, x, rngs=None):
            for layer in self.layers[:-1]:
                x = self.dropout(nnx.relu(layer(x)), rngs=rngs)
            return self.layers[-1](x)

    # The nnx.jit program's Dropout draws from this stream; the functional programs pass keys.
    return lambda: MLP(nnx.Rngs(params=0, dropout=trial.seed))


def paths(dims) -> list[tuple]:
    count = len(core_mlp.layer_sizes(dims)) - 1
    return [("layers", i, name) for i in range(count) for name in ("kernel", "bias")]


def objective(pred, y):
    return mean_squared_error(pred, y)


def notes(trial: Trial, work: Work, device, variant: str) -> tuple[str, ...]:
    return (f"MLP: nnx.Linear layers, ReLU, nnx.Dropout({work.model.dropout:g})",)
