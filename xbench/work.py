"""The identical work every backend receives: initial weights and synthetic data, in numpy.

Built once per model from the spec's seed, so every framework starts from the same arrays.
Backends never draw their own weights or data; they load these and prove it by hashing the
weights they read back (`hash_arrays`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from xbench.spec import ModelSpec

# Distinct streams so that changing the data size never changes the weights.
_WEIGHTS_STREAM = 1
_DATA_STREAM = 2


@dataclass(frozen=True)
class Work:
    """Weights (kernel [in, out], bias [out] per layer), data, and their fingerprints."""

    model: ModelSpec
    weights: tuple[tuple[np.ndarray, np.ndarray], ...]
    x: np.ndarray
    y: np.ndarray

    @property
    def params(self) -> int:
        return sum(kernel.size + bias.size for kernel, bias in self.weights)

    @property
    def flat_weights(self) -> list[np.ndarray]:
        """Kernels and biases in layer order: the order `hash_arrays` uses."""
        return [array for layer in self.weights for array in layer]

    @property
    def weights_hash(self) -> str:
        return hash_arrays(self.flat_weights)

    @property
    def data_hash(self) -> str:
        return hash_arrays([self.x, self.y])

    def shards(self, global_batch: int, devices: int) -> tuple[np.ndarray, np.ndarray]:
        """Data laid out as [devices, batches, per_device_batch, features].

        Step k uses batch k mod `batches`; device r takes rows r*per_device .. of that global
        batch, the same rows in every backend. Rows past the last whole batch are unused.
        """
        per_device = global_batch // devices
        batches = self.x.shape[0] // global_batch
        used = batches * global_batch

        def split(array: np.ndarray) -> np.ndarray:
            grouped = array[:used].reshape(batches, devices, per_device, array.shape[1])
            return np.ascontiguousarray(grouped.transpose(1, 0, 2, 3))

        return split(self.x), split(self.y)


def build_work(model: ModelSpec, samples: int, seed: int) -> Work:
    """Weights and data for `model`, deterministic in (`seed`, shapes)."""
    x, y = make_data(model, samples, seed)
    return Work(model=model, weights=init_weights(model, seed), x=x, y=y)


def init_weights(model: ModelSpec, seed: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Glorot-uniform kernels and zero biases (the Keras and Flax defaults for Dense)."""
    rng = np.random.default_rng([seed, _WEIGHTS_STREAM])
    sizes = model.layer_sizes
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        kernel = rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype(np.float32)
        layers.append((kernel, np.zeros(fan_out, dtype=np.float32)))
    return tuple(layers)


def make_data(model: ModelSpec, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The seed study's generator: standard-normal features, columns 1 and 2 correlated
    with column 0, standard-normal targets."""
    rng = np.random.default_rng([seed, _DATA_STREAM])
    x = rng.standard_normal((samples, model.inputs)).astype(np.float32)
    x[:, 1] = 0.7 * x[:, 0] + 0.3 * rng.standard_normal(samples)
    x[:, 2] = 0.5 * x[:, 0] - 0.3 * x[:, 1] + 0.4 * rng.standard_normal(samples)
    y = rng.standard_normal((samples, model.outputs)).astype(np.float32)
    return x, y


def hash_arrays(arrays: Iterable[np.ndarray]) -> str:
    """A short fingerprint of arrays' shapes, dtypes and bytes, in order."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:16]
