"""The ResNet v1.5 of the tf backend (`xbench.models.cnn`), a Keras 3 functional model in NHWC.
Layouts: the core's convolution kernels are HWIO, Keras Conv2D's layout; BatchNorm's scale
and bias are Keras's gamma and beta; the head's kernel is [in, out]: every array loads as it
is. Only the trainable variables are parameters: BatchNorm's moving mean and variance are
Keras state (non-trainable), neither counted nor read back.

Set on purpose against Keras's defaults: explicit symmetric padding (ZeroPadding2D, then a
"valid" convolution or pool; Keras's "same" pads the extra pixel at the end for a stride of
2), BatchNormalization epsilon 1e-5 (Keras: 1e-3) and momentum 0.9 (Keras: 0.99; 0.9 is
torch's 0.1 in Keras's convention). BatchNorm runs in training mode on each replica's own
batch (MirroredStrategy does not synchronise it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from xbench.contract import Work
from xbench.contract import cnn as core_cnn

# The core's fixed choices, as module names that tests patch to prove verify fails.
BATCH_NORM_EPSILON = core_cnn.BATCH_NORM_EPSILON
BATCH_NORM_MOMENTUM = core_cnn.BATCH_NORM_MOMENTUM
STEM_PADDING = "symmetric"  # the core's; "same" (TF's, asymmetric at stride 2) is a deliberate error for tests
KERAS_MOMENTUM = 1.0 - BATCH_NORM_MOMENTUM  # Keras keeps this much of the old running value


def build_model(work: Work, jit_compile: bool = False) -> tuple[Any, dict[str, Any]]:
    """The Keras model (images [batch, H, W, C] -> logits [batch, classes]) and its trainable
    variables by canonical name; weights are loaded by the caller."""
    import keras

    from xbench_backends.tf.models import input_dtype

    dims = work.model.shape
    images = keras.Input(shape=(dims["image"], dims["image"], dims["channels"]), dtype=input_dtype(), name="images")
    named: dict[str, Any] = {}
    convs = core_cnn.convolutions(dims)
    stem = next(convs)
    h = _conv_bn(images, stem, named, relu=True, padding=STEM_PADDING)
    # Zero padding equals -inf padding here: the pool's inputs are post-ReLU, so >= 0, and
    # every window holds at least one real pixel.
    h = keras.layers.ZeroPadding2D(1, name="stem.pool.pad")(h)
    h = keras.layers.MaxPooling2D(3, strides=2, padding="valid", name="stem.pool")(h)
    for tag, block in _blocks(convs):
        main = [c for c in block if ".down." not in c.name]
        down = [c for c in block if ".down." in c.name]
        out = h
        for i, conv in enumerate(main):
            out = _conv_bn(out, conv, named, relu=i < len(main) - 1)
        shortcut = _conv_bn(h, down[0], named, relu=False) if down else h
        h = keras.layers.ReLU(name=f"{tag}.relu")(keras.layers.Add(name=f"{tag}.add")([out, shortcut]))
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    head = keras.layers.Dense(dims["classes"], name="head")
    logits = head(h)
    named.update({"head.kernel": head.kernel, "head.bias": head.bias})
    return keras.Model(images, logits, name="resnet"), named


def per_example_loss(model, x, y):
    """Each image's softmax cross-entropy from float32 logits (float64 in fp64), BatchNorm in
    training mode."""
    import tensorflow as tf

    from xbench_backends.tf.models import loss_dtype

    logits = model(x, training=True)
    logits = tf.cast(logits, loss_dtype(logits))
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)


def notes(model, jit_compile: bool) -> tuple[str, ...]:
    return (f"BatchNorm: per-replica batch statistics (no cross-replica sync), epsilon {BATCH_NORM_EPSILON:g}, "
            f"Keras momentum {KERAS_MOMENTUM:g} (torch's {BATCH_NORM_MOMENTUM:g})",
            f"stem padding {STEM_PADDING}")


def to_framework(name: str, array):
    """Canonical -> Keras layout: the same for every ResNet parameter (HWIO, [in, out])."""
    return array


def to_canonical(name: str, array):
    return array


def _blocks(convs: Iterator[core_cnn.Conv]) -> Iterator[tuple[str, list[core_cnn.Conv]]]:
    """The core's convolutions after the stem, grouped by block ("s{stage}.b{block}")."""
    for tag, block in itertools.groupby(convs, key=lambda conv: ".".join(conv.name.split(".")[:2])):
        yield tag, list(block)


def _conv_bn(h, conv: core_cnn.Conv, named: dict[str, Any], relu: bool, padding: str = "symmetric"):
    """Convolution (no bias) with explicit symmetric padding, BatchNorm, optional ReLU."""
    import keras

    if padding == "symmetric" and conv.padding:
        h = keras.layers.ZeroPadding2D(conv.padding, name=f"{conv.name}.pad")(h)
    layer = keras.layers.Conv2D(conv.outputs, conv.kernel, strides=conv.stride, use_bias=False, name=conv.name,
                                padding="same" if padding == "same" else "valid")
    h = layer(h)
    bn = keras.layers.BatchNormalization(momentum=KERAS_MOMENTUM, epsilon=BATCH_NORM_EPSILON, name=conv.bn)
    h = bn(h)
    named.update({f"{conv.name}.kernel": layer.kernel, f"{conv.bn}.scale": bn.gamma, f"{conv.bn}.bias": bn.beta})
    return keras.layers.ReLU(name=f"{conv.bn}.relu")(h) if relu else h
