"""The identical work every backend receives: initial weights and synthetic data, in numpy.

Built once per model from the spec's seed by the model's family (`xbench.models`), so every
framework starts from the same arrays. Backends never draw their own weights or data; they
load these and prove it by hashing the weights they read back (`hash_arrays`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from xbench.models import Param, map_on_threads
from xbench.models.model_spec import ModelSpec

# Distinct streams so that changing the data size never changes the weights.
_WEIGHTS_STREAM = 1
_DATA_STREAM = 2
# The synthetic data a worker holds for one model: enough distinct batches that steps see new
# data, without gigabytes of random images (resnet50 at 224 x 224 is 0.6 MB an image).
DATA_BUDGET_BYTES = 512 * 2**20
HASH_BLOCK = 64 * 2**20  # bytes (see `hash_arrays`)


@dataclass(frozen=True)
class Work:
    """The parameters in the family's canonical layout and order (`parameters`), the data
    (inputs `x`, targets `y`, leading axis the sample), and their fingerprints."""

    model: ModelSpec
    arrays: tuple[np.ndarray, ...]
    x: np.ndarray
    y: np.ndarray

    @property
    def parameters(self) -> list[Param]:
        """Names and shapes of `arrays`, in their order."""
        return self.model.kind.parameters(self.model.shape)

    @property
    def params(self) -> int:
        return sum(array.size for array in self.arrays)

    @property
    def flat_weights(self) -> list[np.ndarray]:
        """The parameters in canonical order: the order `hash_arrays` uses."""
        return list(self.arrays)

    @property
    def weights(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """The MLP's (kernel [in, out], bias [out]) per layer."""
        if self.model.family != "mlp":
            raise TypeError(f"weights as (kernel, bias) pairs exist for the MLP only, not {self.model.family!r}")
        return tuple(zip(self.arrays[0::2], self.arrays[1::2]))

    @property
    def weights_hash(self) -> str:
        return hash_arrays(self.arrays)

    @property
    def data_hash(self) -> str:
        return hash_arrays([self.x, self.y])

    def shards(self, global_batch: int, devices: int) -> tuple[np.ndarray, np.ndarray]:
        """Data laid out as [devices, batches, per_device_batch, ...one sample's shape].

        Step k uses batch k mod `batches`; device r takes rows r*per_device .. of that global
        batch, the same rows in every backend. Rows past the last whole batch are unused.
        """
        per_device = global_batch // devices
        batches = self.x.shape[0] // global_batch
        used = batches * global_batch

        def split(array: np.ndarray) -> np.ndarray:
            grouped = array[:used].reshape(batches, devices, per_device, *array.shape[1:])
            return np.ascontiguousarray(np.swapaxes(grouped, 0, 1))

        return split(self.x), split(self.y)


def build_work(model: ModelSpec, samples: int, seed: int) -> Work:
    """Weights and data for `model`, deterministic in (`seed`, shapes)."""
    x, y = make_data(model, samples, seed)
    return Work(model=model, arrays=tuple(init_weights(model, seed)), x=x, y=y)


def init_weights(model: ModelSpec, seed: int) -> list[np.ndarray]:
    """The family's initial parameters, in canonical order. A -0.0 becomes +0.0: frameworks
    may turn one into the other on the way (indexing a sharded array did, in one), which
    would change the weights' hash without changing the model."""
    arrays = model.kind.init(model.shape, np.random.default_rng([seed, _WEIGHTS_STREAM]))
    return [_positive_zeros(np.asarray(array)) for array in arrays]


def _positive_zeros(array: np.ndarray) -> np.ndarray:
    """`array` with -0.0 as +0.0: in place where it may be written (a copy of each would hold
    a 13 B model's 51 GB twice for a moment), else a copy."""
    if array.flags.writeable:
        return np.add(array, 0.0, out=array)
    return np.add(array, 0.0, dtype=array.dtype)


def make_data(model: ModelSpec, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    return model.kind.data(model.shape, samples, np.random.default_rng([seed, _DATA_STREAM]))


def sample_bytes(model: ModelSpec) -> int:
    """Bytes of one sample's input and target."""
    x, y = make_data(model, 1, 0)
    return x.nbytes + y.nbytes


def data_samples(model: ModelSpec, samples: int, global_batch: int) -> int:
    """How many of the spec's `samples` a trial's work holds: all, unless they would pass
    `DATA_BUDGET_BYTES`; then as many whole global batches as fit, at least one."""
    fit = DATA_BUDGET_BYTES // max(sample_bytes(model), 1)
    if samples <= fit:
        return samples
    return max(global_batch, fit // global_batch * global_batch)


def hash_weights(arrays: Iterable[np.ndarray]) -> str:
    """`hash_arrays` of weights read back from a framework, as the core's float32: a float64
    copy (verify's "fp64") is cast back, which is exact, so it hashes as `Work.weights_hash`."""
    return hash_arrays(np.asarray(a).astype(np.float32, copy=False) for a in arrays)


def hash_arrays(arrays: Iterable[np.ndarray]) -> str:
    """A short fingerprint of arrays' shapes, dtypes and bytes, in order. An array of more than
    `HASH_BLOCK` bytes enters as the digests of its blocks, hashed on threads side by side
    (hashlib hashes without the GIL): gpt3-13b's 51 GB took a minute on one core."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        data = array.reshape(-1).view(np.uint8).data  # no copy, as tobytes() made
        digest.update(data if len(data) <= HASH_BLOCK else b"".join(_block_digests(data)))
    return digest.hexdigest()[:16]


def _block_digests(data: memoryview) -> list[bytes]:
    """sha256 of each `HASH_BLOCK` bytes of `data`, in order."""
    blocks = [data[start:start + HASH_BLOCK] for start in range(0, len(data), HASH_BLOCK)]
    return map_on_threads(lambda block: hashlib.sha256(block).digest(), blocks)
