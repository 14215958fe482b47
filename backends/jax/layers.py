"""Pieces the jax family builders share, in plain jax.numpy on the core's layouts (kernels
[in, out], convolutions HWIO, activations NHWC): no conversion is needed anywhere, so the
parameters a model reads are the core's arrays as they are.

Mixed precision ("bf16"): parameters stay float32 and are cast to the compute dtype where
they are used; normalisation statistics, softmax and the losses run in float32.

Float64 ("fp64", verify's precision for ill-conditioned families, `xbench.results.checks`): parameters,
float inputs, activations, statistics, losses, gradients and Adam state all float64. JAX
makes float64 arrays only in x64 mode, which is process-global configuration: the backends
enter it with `float64_scope` (a context, on this thread) around every call of an fp64
trial only, so fp32/tf32/bf16 trials before or after one in the same worker trace, compile
and run exactly as without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xbench.contract import Trial

FLOAT64 = "fp64"


def compute_dtype(trial: Trial) -> Any:
    import jax.numpy as jnp

    return {"bf16": jnp.bfloat16, FLOAT64: jnp.float64}.get(trial.precision, jnp.float32)


def compute_dtype_name(trial: Trial) -> str:
    return {"bf16": "bfloat16", FLOAT64: "float64"}.get(trial.precision, "float32")


def parameter_dtype(trial: Trial) -> Any:
    """The parameters' dtype: float32 (mixed precision keeps them so), float64 in "fp64"."""
    import jax.numpy as jnp

    return jnp.float64 if trial.precision == FLOAT64 else jnp.float32


def statistics_dtype(dtype) -> Any:
    """Where statistics, softmax and losses run: float32, or float64 for float64 compute
    (float32 for bfloat16 compute)."""
    import jax.numpy as jnp

    return jnp.promote_types(dtype, jnp.float32)


def float64_scope(float64: bool):
    """x64 mode for the calls of a float64 trial (preparing it, stepping it, reading it
    back), on this thread only; nothing for any other precision."""
    import contextlib

    if not float64:
        return contextlib.nullcontext()
    import jax

    return jax.enable_x64(True)


def in_precision(tree, trial: Trial):
    """Numpy arrays of the core (float32 parameters, float inputs and targets) as the trial
    holds them: float64 for "fp64" (exact), otherwise unchanged; integer arrays unchanged."""
    if trial.precision != FLOAT64:
        return tree
    import jax

    def convert(a):
        return a.astype(np.float64) if np.issubdtype(np.asarray(a).dtype, np.floating) else a

    return jax.tree.map(convert, tree)


def dense(x, kernel, bias, dtype):
    """x @ kernel + bias, kernel [in, out], in the compute dtype."""
    return x @ kernel.astype(dtype) + bias.astype(dtype)


def layer_norm(x, scale, bias, epsilon: float, dtype):
    """LayerNorm over the last axis with a scale and a bias; biased variance, statistics in
    float32, float64 for float64 (two passes: mean, then the mean squared deviation)."""
    import jax.numpy as jnp
    from jax import lax

    x = x.astype(statistics_dtype(x.dtype))
    mean = jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return ((x - mean) * lax.rsqrt(variance + epsilon) * scale + bias).astype(dtype)


def softmax_cross_entropy(logits, labels):
    """Mean over every leading position of -log softmax(logits)[label], in float32 (float64
    for float64 logits)."""
    import jax
    import jax.numpy as jnp

    logits = logits.astype(statistics_dtype(logits.dtype))
    picked = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def mean_squared_error(pred, y):
    """In float32 (float64 for float64 predictions)."""
    import jax.numpy as jnp

    return jnp.mean((pred.astype(statistics_dtype(pred.dtype)) - y) ** 2)
