"""Model families: what a model is, in numpy, with no framework in sight.

A family (`Family`) names its shape keys ("dims"), lists its parameters in the core's
canonical layout (names, shapes and order, which every backend converts from and back to),
draws their initial values and the synthetic data from the seed, and counts parameters and
the FLOPs of a training step. Backends build the framework's model from these arrays; they
never draw their own. Built in: `mlp`, `transformer`, `cnn`, `lstm`. A plugin adds a family
through the `xbench.families` entry-point group (a class with the attributes below); a
backend says which families it builds with `families` (default: the MLP only).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, ClassVar, Protocol

import numpy as np

from xbench.plugins import TIMEOUT_VARIABLE, call_all, described, plugin_timeout

FAMILY_GROUP = "xbench.families"


@dataclass(frozen=True)
class Dim:
    """One integer shape key of a family: its bounds, and its default (None: required)."""

    minimum: int
    maximum: int
    default: int | None = None
    doc: str = ""
    is_list: bool = False  # a non-empty list of such integers (the MLP's widths)


@dataclass(frozen=True)
class Param:
    """One parameter array in the canonical layout."""

    name: str
    shape: tuple[int, ...]


class Family(Protocol):
    name: ClassVar[str]
    unit: ClassVar[str]  # what throughput counts: "samples", "tokens", "images"
    dims: ClassVar[Mapping[str, Dim]]
    presets: ClassVar[Mapping[str, Mapping[str, Any]]]  # preset name -> dims and batch_sizes
    # True where a layer normalises over the batch (BatchNorm): each device then sees only its
    # own share of the batch, so N devices do different arithmetic than 1 (verify knows).
    batch_statistics: ClassVar[bool]
    loss: ClassVar[str]  # one line: the loss every backend computes

    # Optional, read by xbench.results.checks where present (see verification_model):
    #   verification_dims: Mapping[str, int] -- caps on shape keys for the reduced instance that
    #       verify trains (the CNN: image 32; the transformer: 2 layers, 64 tokens); a model
    #       they shrink is also probed at full size (xbench.results.full_size)
    #   verification_reduce(dims) -> dict -- the reduced instance's dims after those caps, for a
    #       key a cap cannot shrink (the CNN's depth: two blocks a stage, of the model's kind)
    #   verification_per_device: int -- samples per device verify uses (default: a global 32)
    #   verification_precision: str -- "fp32" (default) or "fp64" for a family whose fp32
    #       gradients are too ill-conditioned to compare at 1e-4 (BatchNorm + ReLU networks)

    def check(self, dims: Mapping[str, Any]) -> None:
        """Raise ValueError (one line, what to change) when the keys do not fit together."""

    def parameters(self, dims: Mapping[str, Any]) -> list[Param]:
        """The parameters in canonical order: the order of `Work.params` and of every
        gradient and weight list a backend reports."""

    def init(self, dims: Mapping[str, Any], rng: np.random.Generator) -> list[np.ndarray]:
        """Initial values (float32) of `parameters`, in that order."""

    def data(self, dims: Mapping[str, Any], samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """`samples` inputs and targets, leading axis the sample."""

    def flops_per_sample(self, dims: Mapping[str, Any]) -> int:
        """Model FLOPs of one training step per sample (see `matmul_flops`)."""

    def largest_activation(self, dims: Mapping[str, Any]) -> tuple[int, str]:
        """Elements per sample of the largest activation a device holds, and what it is
        (checked against int32 indexing with the batch)."""

    def units_per_sample(self, dims: Mapping[str, Any]) -> int:
        """How many `unit`s one sample holds (a sequence's tokens; 1 otherwise)."""


def training_flops(forward: Sequence[int], first_needs_input_grad: bool = False) -> int:
    """A training step's model FLOPs from its matmuls' (and convolutions') forward FLOPs, a
    multiply-add counted as 2: forward, weight gradient and input gradient each cost the
    forward's FLOPs, except the first layer's input gradient (nothing needs the data's
    gradient, and no framework computes it). Element-wise work (biases, activations,
    normalisation, the loss, the optimizer) is left out, as in the usual MFU convention."""
    forward = list(forward)
    skipped = 0 if first_needs_input_grad or not forward else forward[0]
    return 3 * sum(forward) - skipped


def glorot_uniform(rng: np.random.Generator, fan_in: int, fan_out: int, shape: tuple[int, ...]) -> np.ndarray:
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape).astype(np.float32)


# An array of at least two such chunks is drawn in chunks, each from a stream of its own spawned
# from the generator, on threads side by side (numpy draws without the GIL): gpt3-13b's 12.9 B
# values took minutes from one stream. The chunks, not the threads, decide the values, so they
# are the same on every machine. Smaller arrays come from the generator itself; as a large one
# no longer advances it, those after a large one differ from what one stream gave (weights
# hashes of transformers changed with this).
DRAW_CHUNK = 1 << 22


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system has one: a container's
    or a rank's share), not the machine's count."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def map_on_threads(function: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """`function` of each item, in order, on up to `usable_cores()` threads side by side."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(items), usable_cores()))) as pool:
        return list(pool.map(function, items))


def normal(rng: np.random.Generator, std: float, shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape))
    if count < 2 * DRAW_CHUNK:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
    out = np.empty(count, dtype=np.float32)
    streams = rng.spawn(-(-count // DRAW_CHUNK))

    def fill(index: int) -> None:
        chunk = out[index * DRAW_CHUNK:(index + 1) * DRAW_CHUNK]
        streams[index].standard_normal(out=chunk, dtype=np.float32)
        chunk *= np.float32(std)

    map_on_threads(fill, range(len(streams)))
    return out.reshape(shape)


def params_count(family: Family, dims: Mapping[str, Any]) -> int:
    return sum(int(np.prod(p.shape)) for p in family.parameters(dims))


def builtin_families() -> dict[str, Family]:
    from xbench.models.cnn import ResNet
    from xbench.models.lstm import Lstm
    from xbench.models.mlp import Mlp
    from xbench.models.transformer import Transformer

    return {f.name: f for f in (Mlp(), Transformer(), ResNet(), Lstm())}


@functools.lru_cache(maxsize=1)
def _discover() -> tuple[dict[str, Family], dict[str, str]]:
    """Built-in families, then plugins' (a plugin cannot replace a built-in name), and the
    plugins that failed to load, with why (a broken plugin must not take the rest down)."""
    found = builtin_families()
    broken: dict[str, str] = {}
    points = {p.name: p for p in entry_points(group=FAMILY_GROUP) if p.name not in found}
    if not points:
        return found, broken
    timeout = plugin_timeout()
    # A family plugin that exits, raises or hangs is broken, never the end of xbench.
    calls = call_all({name: functools.partial(_instantiate, point) for name, point in points.items()}, timeout)
    for name, call in calls.items():
        if not call.done.is_set():
            broken[name] = f"plugin did not answer within {timeout:g} s ({TIMEOUT_VARIABLE})"
        elif call.error is not None:
            broken[name] = described(call.error)
        else:
            found[name] = call.value
    return found, broken


def _instantiate(point: EntryPoint) -> Family:
    return point.load()()


def families() -> dict[str, Family]:
    return _discover()[0]


def broken_families() -> dict[str, str]:
    return _discover()[1]


def family(name: str) -> Family:
    """The family called `name`; KeyError when none is."""
    return families()[name]


def presets() -> dict[str, tuple[str, Mapping[str, Any]]]:
    """Every preset name -> (its family, its keys)."""
    return {preset: (name, keys) for name, fam in families().items() for preset, keys in fam.presets.items()}
