"""The ResNet (v1.5) of the jax backends as Flax NNX writes it, NHWC: `nnx.Conv` (no bias,
explicit symmetric padding) each followed by `nnx.BatchNorm` in training mode, 3x3 stride-2
max pool (`nnx.max_pool`, padded with -inf), residual blocks, global average pool and an
`nnx.Linear` head; softmax cross-entropy in float32 (float64 in fp64).

Layout: the core's, as is: `nnx.Conv` kernels are HWIO [kh, kw, in, out]; BatchNorm's scale
and bias; the head kernel [features, classes]. BatchNorm: epsilon 1e-5, momentum 0.9 (Flax's
convention for torch's 0.1), statistics of the batch each device holds; the nnx.jit program
keeps the running averages as NNX does, the functional programs drop them (nothing reads
them, and they change neither loss nor gradients).
"""

from __future__ import annotations

from xbench.contract import Trial, Work
from xbench.contract import cnn as core_cnn
from xbench_backends.jax.cnn import network
from xbench_backends.jax.layers import compute_dtype, parameter_dtype, softmax_cross_entropy, statistics_dtype

# The core's fixed choices, as module names that tests patch to prove verify fails.
BATCH_NORM_EPSILON = core_cnn.BATCH_NORM_EPSILON
BATCH_NORM_MOMENTUM = core_cnn.BATCH_NORM_MOMENTUM
EXPLICIT_PADDING = True  # False: "SAME" (pads the end only at stride 2), for the wrong-build test


def constructor(trial: Trial, work: Work, variant: str):
    import jax.numpy as jnp
    from flax import nnx

    dims = work.model.shape
    dtype, param_dtype = compute_dtype(trial), parameter_dtype(trial)
    layer = dict(dtype=dtype, param_dtype=param_dtype)
    stem, blocks = network(dims)

    class ConvBN(nnx.Module):
        def __init__(self, conv: core_cnn.Conv, rngs: nnx.Rngs):
            p = conv.padding
            padding = ((p, p), (p, p)) if EXPLICIT_PADDING else "SAME"
            self.conv = nnx.Conv(conv.inputs, conv.outputs, (conv.kernel, conv.kernel), strides=conv.stride,
                                 padding=padding, use_bias=False, rngs=rngs, **layer)
            self.bn = nnx.BatchNorm(conv.outputs, use_running_average=False, momentum=1 - BATCH_NORM_MOMENTUM,
                                    epsilon=BATCH_NORM_EPSILON, rngs=rngs, **layer)

        def __call__(self, x):
            return self.bn(self.conv(x))

    class Bottleneck(nnx.Module):  # or the basic block: its main path has two convolutions
        def __init__(self, block, rngs: nnx.Rngs):
            self.main = nnx.List([ConvBN(conv, rngs) for conv, _ in block.main])
            self.down = ConvBN(block.shortcut[0], rngs) if block.shortcut else None

        def __call__(self, x):
            h = x
            for i, conv in enumerate(self.main):
                h = conv(h)
                h = nnx.relu(h) if i < len(self.main) - 1 else h
            return nnx.relu(h + (x if self.down is None else self.down(x)))

    class ResNet(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.stem = ConvBN(stem[0], rngs)
            self.blocks = nnx.List([Bottleneck(block, rngs) for block in blocks])
            self.head = nnx.Linear(core_cnn.final_features(dims), dims["classes"], rngs=rngs, **layer)

        def __call__(self, images, rngs=None):
            h = nnx.relu(self.stem(images.astype(dtype)))
            h = nnx.max_pool(h, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
            for block in self.blocks:
                h = block(h)
            features = jnp.mean(h.astype(statistics_dtype(dtype)), axis=(1, 2)).astype(dtype)
            return self.head(features)

    return lambda: ResNet(nnx.Rngs(0))


def paths(dims) -> list[tuple]:
    """Canonical order: per convolution kernel, BatchNorm scale, BatchNorm bias; then the head."""
    found = []
    stem, blocks = network(dims)
    found += _conv_bn(("stem",))
    for b, block in enumerate(blocks):
        for i, _ in enumerate(block.main):
            found += _conv_bn(("blocks", b, "main", i))
        if block.shortcut:
            found += _conv_bn(("blocks", b, "down"))
    return found + [("head", "kernel"), ("head", "bias")]


def _conv_bn(prefix: tuple) -> list[tuple]:
    return [(*prefix, "conv", "kernel"), (*prefix, "bn", "scale"), (*prefix, "bn", "bias")]


def objective(logits, labels):
    return softmax_cross_entropy(logits, labels)


def notes(trial: Trial, work: Work, device, variant: str) -> tuple[str, ...]:
    count = sum(1 for _ in core_cnn.convolutions(work.model.shape))
    padding = "explicit symmetric" if EXPLICIT_PADDING else "SAME"
    return (f"convolutions: {count} nnx.Conv NHWC/HWIO, XLA picks the kernels (cuDNN on GPU); {padding} padding",
            f"BatchNorm: nnx.BatchNorm in training mode, statistics of each device's own batch (one pass), epsilon "
            f"{BATCH_NORM_EPSILON}; running averages kept by the nnx.jit program, dropped by the functional ones "
            "(they change neither loss nor gradients)")
