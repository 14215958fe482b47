"""`mlp`: the seed study's multilayer perceptron, inputs -> widths (ReLU, dropout) -> outputs,
mean squared error on standard-normal regression targets.

Canonical layout: per Dense layer, kernel [in, out] then bias [out].
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from xbench.models import Dim, Param, glorot_uniform, training_flops

MAX_ELEMENTS = 2**31 - 1


class Mlp:
    name: ClassVar[str] = "mlp"
    unit: ClassVar[str] = "samples"
    loss: ClassVar[str] = "mean squared error over the outputs"
    batch_statistics: ClassVar[bool] = False
    dims: ClassVar[Mapping[str, Dim]] = {
        "widths": Dim(1, MAX_ELEMENTS, None, "hidden layer widths", is_list=True),
        "inputs": Dim(3, MAX_ELEMENTS, 50, "input features (the seed's generator needs 3)"),
        "outputs": Dim(1, MAX_ELEMENTS, 3, "regression targets"),
    }
    # The seed study's two MLPs (input 50, output 3, ReLU); batch sizes are the seed's grid.
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "medium": {"widths": (256, 128, 64), "dropout": 0.2, "batch_sizes": (8, 16, 32, 64, 128)},
        "large": {"widths": (1024, 1024, 512, 512, 256), "dropout": 0.3, "batch_sizes": (4, 8, 16, 32, 64)},
    }

    def check(self, dims: Mapping[str, Any]) -> None:
        return None

    def parameters(self, dims: Mapping[str, Any]) -> list[Param]:
        sizes = layer_sizes(dims)
        params = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            params += [Param(f"dense{i}.kernel", (fan_in, fan_out)), Param(f"dense{i}.bias", (fan_out,))]
        return params

    def init(self, dims: Mapping[str, Any], rng: np.random.Generator) -> list[np.ndarray]:
        """Glorot-uniform kernels and zero biases (the common defaults for a dense layer)."""
        arrays = []
        for param in self.parameters(dims):
            if param.name.endswith("kernel"):
                fan_in, fan_out = param.shape
                arrays.append(glorot_uniform(rng, fan_in, fan_out, param.shape))
            else:
                arrays.append(np.zeros(param.shape, np.float32))
        return arrays

    def data(self, dims: Mapping[str, Any], samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The seed study's generator: standard-normal features, columns 1 and 2 correlated
        with column 0, standard-normal targets."""
        x = rng.standard_normal((samples, dims["inputs"])).astype(np.float32)
        x[:, 1] = 0.7 * x[:, 0] + 0.3 * rng.standard_normal(samples)
        x[:, 2] = 0.5 * x[:, 0] - 0.3 * x[:, 1] + 0.4 * rng.standard_normal(samples)
        y = rng.standard_normal((samples, dims["outputs"])).astype(np.float32)
        return x, y

    def flops_per_sample(self, dims: Mapping[str, Any]) -> int:
        sizes = layer_sizes(dims)
        return training_flops([2 * a * b for a, b in zip(sizes[:-1], sizes[1:])])

    def largest_activation(self, dims: Mapping[str, Any]) -> tuple[int, str]:
        return max(layer_sizes(dims)), "activations (the widest layer)"

    def units_per_sample(self, dims: Mapping[str, Any]) -> int:
        return 1


def layer_sizes(dims: Mapping[str, Any]) -> tuple[int, ...]:
    return (dims["inputs"], *dims["widths"], dims["outputs"])
