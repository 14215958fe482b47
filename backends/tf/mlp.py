"""The MLP of the tf backend: a Keras 3 Sequential built from the core's numpy weights (kernel
[in, out] and bias per layer, which is Keras's Dense layout) and its per-example loss. How a
step runs (strategies, Adam, the global-batch scaling, XLA) is in `mirrored`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xbench.contract import Work


def build_model(work: Work):
    """The Keras MLP holding the work's initial weights; build it inside the scope (strategy
    or device) its variables belong to."""
    import keras

    from xbench_backends.tf.models import input_dtype

    layers: list[Any] = [keras.Input(shape=(work.model.inputs,), dtype=input_dtype())]
    for width in work.model.widths:
        layers += [keras.layers.Dense(width, activation="relu"), keras.layers.Dropout(work.model.dropout)]
    layers.append(keras.layers.Dense(work.model.outputs))
    model = keras.Sequential(layers)
    dtype = input_dtype()  # the variables' (float64 in fp64)
    model.set_weights([np.asarray(w, dtype=dtype) for w in work.flat_weights])
    return model


def per_example_loss(model, x, y):
    """Each example's mean squared error over the outputs, in float32 (float64 in fp64),
    dropout on."""
    import tensorflow as tf

    from xbench_backends.tf.models import loss_dtype

    pred = model(x, training=True)
    pred = tf.cast(pred, loss_dtype(pred))  # bf16 under mixed precision
    return tf.reduce_mean(tf.square(pred - y), axis=-1)
