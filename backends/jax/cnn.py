"""The ResNet (v1.5) of the jax backends, in plain jax.numpy from the core's arrays
(`xbench.models.cnn`), NHWC.

Layout: the core's, used as is: convolution kernels HWIO, which `lax.conv_general_dilated`
takes with dimension numbers ('NHWC', 'HWIO', 'NHWC'); the head kernel [features, classes].
The params are a flat list in canonical order (per convolution: kernel, BatchNorm scale,
BatchNorm bias; then head kernel, head bias), so `jax.tree.leaves` reads them back in order.

Padding is explicit and symmetric, (p, p) on each spatial axis with p = kernel // 2 ("SAME"
would pad a stride-2 convolution only at the end), and the 3x3 stride-2 max pool pads 1 on
every side with -inf.

BatchNorm runs in training mode: biased statistics over (batch, height, width) of the batch
each device holds (`batch_groups` equal groups of the batch when one program holds every
device's rows, as `jax-auto` does), epsilon 1e-5, in float32 (float64 in "fp64"). Running averages are NOT
carried in the jax state: they never change the training loss or the gradients, and the
benchmark never evaluates; `notes` says so in the record.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xbench.contract import Trial, Work
from xbench.contract import cnn as core_cnn
from xbench_backends.jax.layers import compute_dtype, dense, softmax_cross_entropy, statistics_dtype

BATCH_NORM_EPSILON = core_cnn.BATCH_NORM_EPSILON  # 1e-5 (Keras's default 1e-3 differs)
EXPLICIT_PADDING = True  # False: "SAME" (pads the end only at stride 2), for the wrong-build test
PARAMS_PER_CONV = 3  # kernel, BatchNorm scale, BatchNorm bias


@dataclass(frozen=True)
class Block:
    """A residual block: its main-path convolutions and the projection shortcut (or None),
    each with the index of its kernel in the params (scale and bias follow it)."""

    main: tuple[tuple[core_cnn.Conv, int], ...]
    shortcut: tuple[core_cnn.Conv, int] | None


def initial_params(work: Work) -> list[np.ndarray]:
    """The core's arrays in canonical order, unchanged."""
    return list(work.arrays)


def network(dims) -> tuple[tuple[core_cnn.Conv, int], tuple[Block, ...]]:
    """The stem convolution and the blocks, from the core's list of convolutions."""
    indexed = [(conv, PARAMS_PER_CONV * i) for i, conv in enumerate(core_cnn.convolutions(dims))]
    blocks: dict[str, list[tuple[core_cnn.Conv, int]]] = {}
    for conv, index in indexed[1:]:
        blocks.setdefault(".".join(conv.name.split(".")[:2]), []).append((conv, index))
    built = []
    for members in blocks.values():
        main = tuple(m for m in members if ".down." not in m[0].name)
        shortcut = next((m for m in members if ".down." in m[0].name), None)
        built.append(Block(main, shortcut))
    return indexed[0], tuple(built)


def loss_function(trial: Trial, work: Work, batch_groups: int = 1):
    """`loss_fn(params, x, y, rng)`: softmax cross-entropy in float32 (float64 in fp64), the mean over this
    device's images; BatchNorm statistics per group of `batch_groups` equal groups of the
    batch; rng unused (no dropout)."""
    stem, blocks = network(work.model.shape)
    dtype = compute_dtype(trial)

    def loss_fn(params, x, y, rng):
        return softmax_cross_entropy(logits(params, x, stem, blocks, batch_groups, dtype), y)

    return loss_fn


def logits(params, images, stem, blocks, groups: int, dtype):
    """[batch, classes] logits of NHWC images."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    h = jax.nn.relu(conv_bn(params, images.astype(dtype), *stem, groups, dtype))
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                          ((0, 0), (1, 1), (1, 1), (0, 0)))
    for block in blocks:
        h = residual_block(params, h, block, groups, dtype)
    features = jnp.mean(h.astype(statistics_dtype(dtype)), axis=(1, 2)).astype(dtype)
    return dense(features, params[-2], params[-1], dtype)


def residual_block(params, x, block: Block, groups: int, dtype):
    """ReLU after each main-path BatchNorm but the last; ReLU after adding the shortcut."""
    import jax

    h = x
    for n, (conv, index) in enumerate(block.main):
        h = conv_bn(params, h, conv, index, groups, dtype)
        if n < len(block.main) - 1:
            h = jax.nn.relu(h)
    shortcut = x if block.shortcut is None else conv_bn(params, x, *block.shortcut, groups, dtype)
    return jax.nn.relu(h + shortcut)


def conv_bn(params, x, conv: core_cnn.Conv, index: int, groups: int, dtype):
    """Convolution (no bias), then BatchNorm with params[index + 1], params[index + 2]."""
    from jax import lax

    p = conv.padding
    padding = ((p, p), (p, p)) if EXPLICIT_PADDING else "SAME"
    y = lax.conv_general_dilated(x, params[index].astype(dtype), (conv.stride, conv.stride), padding,
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return batch_norm(y, params[index + 1], params[index + 2], groups, dtype)


def batch_norm(x, scale, bias, groups: int, dtype):
    """Training-mode BatchNorm of NHWC x: biased mean and variance over (batch, height,
    width) within each of `groups` equal groups of the batch, in float32 (float64 for
    float64 x; two passes)."""
    import jax.numpy as jnp
    from jax import lax

    batch = x.shape[0]
    g = x.astype(statistics_dtype(x.dtype)).reshape(groups, batch // groups, *x.shape[1:])
    mean = jnp.mean(g, axis=(1, 2, 3), keepdims=True)
    variance = jnp.mean(jnp.square(g - mean), axis=(1, 2, 3), keepdims=True)
    normed = ((g - mean) * lax.rsqrt(variance + BATCH_NORM_EPSILON)).reshape(x.shape)
    return (normed * scale + bias).astype(dtype)


def notes(trial: Trial, work: Work, device) -> tuple[str, ...]:
    padding = "explicit symmetric" if EXPLICIT_PADDING else "SAME"
    return ("convolutions: lax.conv_general_dilated NHWC/HWIO, XLA picks the kernels "
            f"(cuDNN on GPU); {padding} padding",
            f"BatchNorm: training mode, statistics of each device's own batch, epsilon {BATCH_NORM_EPSILON}; "
            "running averages not kept (they change neither loss nor gradients)")
