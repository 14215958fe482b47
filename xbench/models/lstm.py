"""`lstm`: stacked LSTM layers over a sequence, then a dense head on the top layer's last
hidden state; mean squared error on standard-normal regression targets, as the seed's MLPs.

The cell (every backend computes exactly this; docs/model-families.md):
z = x W + h U + b, split into four gates in the order i, f, g, o;
c' = sigmoid(f) * c + sigmoid(i) * tanh(g); h' = sigmoid(o) * tanh(c'); h and c start at 0.
Canonical layout per layer l: lstm{l}.kernel [in, 4 hidden], lstm{l}.recurrent [hidden,
4 hidden], lstm{l}.bias [4 hidden] (one bias: a backend whose layer has two holds the second
at zero); then
head.kernel [hidden, outputs], head.bias [outputs].
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from xbench.models import Dim, Param, glorot_uniform, training_flops


class Lstm:
    name: ClassVar[str] = "lstm"
    unit: ClassVar[str] = "samples"
    loss: ClassVar[str] = "mean squared error of the head's outputs"
    batch_statistics: ClassVar[bool] = False
    verification_dims: ClassVar[Mapping[str, int]] = {"layers": 2, "sequence": 64}  # see the transformer's
    dims: ClassVar[Mapping[str, Dim]] = {
        "layers": Dim(1, 1_000, None, "stacked LSTM layers"),
        "hidden": Dim(1, 1_000_000, None, "units per layer"),
        "sequence": Dim(1, 1_000_000, None, "time steps per sample"),
        "inputs": Dim(1, 1_000_000, 50, "features per time step"),
        "outputs": Dim(1, 1_000_000, 3, "regression targets"),
    }
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "lstm-small": {"layers": 2, "hidden": 256, "sequence": 64, "inputs": 32, "outputs": 1,
                       "batch_sizes": (32, 128)},
        # The seed report's "LSTM 300K-500K parameters", on its 50 features and 3 targets: 340,963.
        "lstm-seed": {"layers": 2, "hidden": 160, "sequence": 32, "inputs": 50, "outputs": 3,
                      "batch_sizes": (32, 128)},
    }

    def check(self, dims: Mapping[str, Any]) -> None:
        return None

    def parameters(self, dims: Mapping[str, Any]) -> list[Param]:
        h = dims["hidden"]
        params = []
        for layer in range(dims["layers"]):
            fan_in = dims["inputs"] if layer == 0 else h
            params += [Param(f"lstm{layer}.kernel", (fan_in, 4 * h)), Param(f"lstm{layer}.recurrent", (h, 4 * h)),
                       Param(f"lstm{layer}.bias", (4 * h,))]
        return params + [Param("head.kernel", (h, dims["outputs"])), Param("head.bias", (dims["outputs"],))]

    def init(self, dims: Mapping[str, Any], rng: np.random.Generator) -> list[np.ndarray]:
        """The common LSTM defaults: Glorot-uniform kernels, orthogonal recurrent kernels (each
        gate's block), zero biases but 1 on the forget gate; the head Glorot-uniform."""
        h = dims["hidden"]
        arrays = []
        for param in self.parameters(dims):
            if param.name.endswith(".recurrent"):
                arrays.append(np.concatenate([_orthogonal(rng, h) for _ in range(4)], axis=1))
            elif param.name.startswith("lstm") and param.name.endswith(".bias"):
                bias = np.zeros(param.shape, np.float32)
                bias[h:2 * h] = 1.0
                arrays.append(bias)
            elif param.name.endswith(".bias"):
                arrays.append(np.zeros(param.shape, np.float32))
            else:
                fan_in, fan_out = param.shape
                arrays.append(glorot_uniform(rng, fan_in, fan_out, param.shape))
        return arrays

    def data(self, dims: Mapping[str, Any], samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        x = rng.standard_normal((samples, dims["sequence"], dims["inputs"]), dtype=np.float32)
        y = rng.standard_normal((samples, dims["outputs"]), dtype=np.float32)
        return x, y

    def flops_per_sample(self, dims: Mapping[str, Any]) -> int:
        """Each time step's two matmuls per layer and the head once; the first layer's input
        matmul needs no input gradient."""
        h, t = dims["hidden"], dims["sequence"]
        first_input = 2 * dims["inputs"] * 4 * h * t
        rest = [2 * h * 4 * h * t]  # layer 0's recurrent matmul
        for _ in range(1, dims["layers"]):
            rest += [2 * h * 4 * h * t, 2 * h * 4 * h * t]
        rest.append(2 * h * dims["outputs"])
        return training_flops([first_input, *rest])

    def largest_activation(self, dims: Mapping[str, Any]) -> tuple[int, str]:
        return dims["sequence"] * 4 * dims["hidden"], "gate activations over the sequence"

    def units_per_sample(self, dims: Mapping[str, Any]) -> int:
        return 1


def _orthogonal(rng: np.random.Generator, size: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((size, size)))
    return (q * np.sign(np.diag(r))).astype(np.float32)
