"""A third-party model family as a plugin would ship it: a linear regression, registered in
the tests through the `xbench.families` entry-point group."""

from typing import Any, ClassVar, Mapping

import numpy as np

from xbench.models import Dim, Param, glorot_uniform, training_flops


class Linear:
    name: ClassVar[str] = "linear"
    unit: ClassVar[str] = "samples"
    loss: ClassVar[str] = "mean squared error"
    batch_statistics: ClassVar[bool] = False
    dims: ClassVar[Mapping[str, Dim]] = {"inputs": Dim(1, 1_000, 8), "outputs": Dim(1, 1_000, 2)}
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {"linear-small": {"batch_sizes": (4,)}}

    def check(self, dims):
        if dims["outputs"] > dims["inputs"]:
            raise ValueError("outputs must not exceed inputs")

    def parameters(self, dims):
        return [Param("kernel", (dims["inputs"], dims["outputs"])), Param("bias", (dims["outputs"],))]

    def init(self, dims, rng):
        return [glorot_uniform(rng, dims["inputs"], dims["outputs"], (dims["inputs"], dims["outputs"])),
                np.zeros(dims["outputs"], np.float32)]

    def data(self, dims, samples, rng):
        return (rng.standard_normal((samples, dims["inputs"]), dtype=np.float32),
                rng.standard_normal((samples, dims["outputs"]), dtype=np.float32))

    def flops_per_sample(self, dims):
        return training_flops([2 * dims["inputs"] * dims["outputs"]])

    def largest_activation(self, dims):
        return dims["outputs"], "outputs"

    def units_per_sample(self, dims):
        return 1


class Broken:
    def __init__(self):
        raise RuntimeError("this family cannot load")


class Exits:
    """A family plugin that ends the process it loads in."""

    def __init__(self):
        raise SystemExit(5)


class Hangs:
    """A family plugin that never finishes loading."""

    def __init__(self):
        import threading

        threading.Event().wait()
