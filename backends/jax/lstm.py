"""The stacked LSTM of the jax backends, in plain jax.numpy from the core's arrays
(`xbench.models.lstm`): `lax.scan` over time with exactly the core's cell,

    z = x W + h U + b, gates i, f, g, o in that order along z's last axis,
    c' = sigmoid(f) c + sigmoid(i) tanh(g),  h' = sigmoid(o) tanh(c'),  h = c = 0 at t = 0,

then the head on the top layer's last h.

Layout: the core's, used as is: per layer kernel W [in, 4 hidden], recurrent U [hidden,
4 hidden], one bias b [4 hidden]; head kernel [hidden, outputs], head bias. The params are a
flat list in that (canonical) order, so `jax.tree.leaves` reads them back in order. x W + b
is computed for every time step before the scan (the same sum, grouped differently: rounding
only). XLA has no cuDNN LSTM; the scan's matmuls are XLA's.
"""

from __future__ import annotations

import numpy as np

from xbench.contract import Trial, Work
from xbench_backends.jax.layers import compute_dtype, dense, mean_squared_error

GATE_ORDER = ("i", "f", "g", "o")  # the core's order of the four blocks of z
PARAMS_PER_LAYER = 3  # kernel, recurrent, bias


def initial_params(work: Work) -> list[np.ndarray]:
    """The core's arrays in canonical order, unchanged."""
    return list(work.arrays)


def loss_function(trial: Trial, work: Work):
    """`loss_fn(params, x, y, rng)`: mean squared error in float32 (float64 in fp64) over
    outputs and this device's batch; x [batch, time, features]; rng unused (no dropout)."""
    layers, dtype = work.model.shape["layers"], compute_dtype(trial)

    def loss_fn(params, x, y, rng):
        return mean_squared_error(predict(params, x, layers, dtype), y)

    return loss_fn


def predict(params, x, layers: int, dtype):
    import jax.numpy as jnp

    h = jnp.swapaxes(x, 0, 1).astype(dtype)  # [time, batch, features]: scan runs over axis 0
    for layer in range(layers):
        h = lstm_layer(h, *params[PARAMS_PER_LAYER * layer: PARAMS_PER_LAYER * (layer + 1)], dtype)
    return dense(h[-1], params[-2], params[-1], dtype)


def lstm_layer(xs, kernel, recurrent, bias, dtype):
    """Every time step's h of one layer, [time, batch, hidden], from xs [time, batch, in]."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    inputs = dense(xs, kernel, bias, dtype)  # x W + b for every step at once
    recurrent = recurrent.astype(dtype)
    # h = c = 0, shaped (and, under shard_map, typed as varying per device) like one step's
    # hidden state, so that the scan's carry keeps one type.
    zeros = jnp.zeros_like(inputs[0, :, : recurrent.shape[0]])

    def cell(carry, z_input):
        h, c = carry
        gates = dict(zip(GATE_ORDER, jnp.split(z_input + h @ recurrent, 4, axis=-1)))
        c = jax.nn.sigmoid(gates["f"]) * c + jax.nn.sigmoid(gates["i"]) * jnp.tanh(gates["g"])
        h = jax.nn.sigmoid(gates["o"]) * jnp.tanh(c)
        return (h, c), h

    _, hs = lax.scan(cell, (zeros, zeros), inputs)
    return hs


def notes(trial: Trial, work: Work, device) -> tuple[str, ...]:
    return ("LSTM: lax.scan over time of the core's cell (gates " + ", ".join(GATE_ORDER) +
            "); XLA kernels, no cuDNN LSTM",)
