"""The stacked LSTM of the tf backend (`xbench.models.lstm`), a Keras 3 functional model of
`keras.layers.LSTM` layers and a Dense head on the top layer's last hidden state. Layouts:
Keras's LSTM holds one kernel [in, 4 hidden], one recurrent kernel [hidden, 4 hidden] and one
bias [4 hidden], gates in the order i, f, c, o (c is the core's g): the core's layout, so
every array loads as it is (`GATE_ORDER` permutes the gate blocks where a layout differs;
here it is the identity). `unit_forget_bias` only changes Keras's own initialiser, which the
core's bias replaces.

cuDNN: Keras 3 takes its cuDNN kernel (`use_cudnn="auto"`) when the layer's arguments allow
it (tanh, sigmoid, a bias, no unrolling, no recurrent dropout: all true here) and a GPU is
visible; cuDNN ops do not compile with XLA, so the `xla` variant asks for the generic loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xbench.contract import Work

GATE_ORDER = (0, 1, 2, 3)  # Keras's gate blocks, in the core's order i, f, g, o


def build_model(work: Work, jit_compile: bool = False) -> tuple[Any, dict[str, Any]]:
    """The Keras model (x [batch, sequence, inputs] -> [batch, outputs]) and its trainable
    variables by canonical name; weights are loaded by the caller."""
    import keras

    from xbench_backends.tf.models import input_dtype

    dims = work.model.shape
    x = keras.Input(shape=(dims["sequence"], dims["inputs"]), dtype=input_dtype(), name="x")
    named: dict[str, Any] = {}
    h = x
    for layer_index in range(dims["layers"]):
        layer = keras.layers.LSTM(dims["hidden"], return_sequences=layer_index < dims["layers"] - 1,
                                  use_cudnn=False if jit_compile else "auto", name=f"lstm{layer_index}")
        h = layer(h)
        tag = f"lstm{layer_index}"
        named.update({f"{tag}.kernel": layer.cell.kernel, f"{tag}.recurrent": layer.cell.recurrent_kernel,
                      f"{tag}.bias": layer.cell.bias})
    head = keras.layers.Dense(dims["outputs"], name="head")
    out = head(h)
    named.update({"head.kernel": head.kernel, "head.bias": head.bias})
    return keras.Model(x, out, name="lstm"), named


def per_example_loss(model, x, y):
    """Each example's mean squared error over the outputs, in float32 (float64 in fp64)."""
    import tensorflow as tf

    from xbench_backends.tf.models import loss_dtype

    pred = model(x, training=True)
    pred = tf.cast(pred, loss_dtype(pred))  # bf16 under mixed precision
    return tf.reduce_mean(tf.square(pred - y), axis=-1)


def notes(model, jit_compile: bool) -> tuple[str, ...]:
    """Which LSTM kernel runs. Keras marks a layer `supports_jit = False` exactly when its
    cuDNN path is eligible (arguments and a visible GPU), and then takes it."""
    import keras

    layers = [layer for layer in model.layers if isinstance(layer, keras.layers.LSTM)]
    if jit_compile:
        kernel = "generic loop (use_cudnn=False: cuDNN ops do not compile with XLA)"
    elif all(layer.supports_jit is False for layer in layers):
        kernel = "cuDNN (keras use_cudnn=auto, eligible: arguments fit and a GPU is visible)"
    else:
        kernel = "generic loop (keras use_cudnn=auto, not eligible: no GPU visible)"
    return (f"LSTM kernel: {kernel}",)


def to_framework(name: str, array: np.ndarray) -> np.ndarray:
    """Canonical -> Keras layout: the gate blocks of an LSTM kernel, recurrent kernel or bias
    (last axis 4 x hidden) in Keras's order."""
    return _permute_gates(array, GATE_ORDER) if name.startswith("lstm") else array


def to_canonical(name: str, array: np.ndarray) -> np.ndarray:
    inverse = tuple(int(i) for i in np.argsort(GATE_ORDER))
    return _permute_gates(array, inverse) if name.startswith("lstm") else array


def _permute_gates(array: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    if order == (0, 1, 2, 3):
        return array
    blocks = np.split(np.asarray(array), 4, axis=-1)
    return np.concatenate([blocks[i] for i in order], axis=-1)
