"""The `Backend` protocol every plugin implements, and the values it exchanges with the core:
what `probe`, `setup` and `prepare` return, the errors it raises, the optimizer it builds and
the variants it may declare. Its optional abilities are in `xbench.contract.abilities`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, ClassVar, Protocol

from xbench.contract.trial import Trial
from xbench.contract.work import Work

COMPILE_CACHE_VARIABLE = "XBENCH_COMPILE_CACHE_DIR"  # see "Replicates" in xbench.contract
MEMORY_SHARE_VARIABLE = "XBENCH_DEVICE_MEMORY_SHARE"  # see "Shared devices" in xbench.contract


def memory_share() -> float | None:
    """The fraction of each device's memory this worker may hold (`MEMORY_SHARE_VARIABLE`),
    or None where it has its devices to itself."""
    given = os.environ.get(MEMORY_SHARE_VARIABLE, "").strip()
    try:
        share = float(given) if given else None
    except ValueError:
        return None
    return share if share is not None and 0 < share <= 1 else None


@dataclass(frozen=True)
class Adam:
    """The optimizer every backend implements, with these constants: Adam as in Kingma and
    Ba's Algorithm 1, update = lr * m_hat / (sqrt(v_hat) + eps) with bias-corrected m_hat and
    v_hat (optax's and torch's form). Keras computes eps outside the bias correction, which
    changes the steps (verify catches it), so the tf backend overrides its update."""

    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8


ADAM = Adam()


@dataclass(frozen=True)
class Variant:
    """A named way to run a backend's programs other than as written, e.g. "xla" or
    "compile"; see "Programs and variants" in xbench.contract."""

    name: str
    description: str  # one line: what is turned on
    steps_per_call: int | None = None  # steps fused into one call, when the variant fuses them
    warmup_steps: int | None = None  # at least this many untimed steps first (e.g. CUDA-graph capture)
    precisions: tuple[str, ...] | None = None  # the only precisions it runs in (None: every one)
    families: tuple[str, ...] | None = None  # the only model families it builds (None: the backend's)
    # the only programs it is a variant of (None: every one): runs and verification of the
    # others are not planned (a sharded variant of the plain program has no devices to shard over)
    programs: tuple[str, ...] | None = None
    sharded: bool = False  # parameters, gradients and optimizer state split over the devices (FSDP, ZeRO-3)
    # each block's activations recomputed in the backward pass (activation checkpointing): the
    # step keeps only every block's input, and one block's activations at a time
    recompute: bool = False
    # its attention a fused kernel that keeps no heads x context^2 probabilities for the
    # backward pass (FlashAttention, cuDNN's): the memory estimate's; None: as the backend's
    # as-written program (`DeclaresFusedAttention`)
    fused_attention: bool | None = None
    # gradient-sized buffers its data-parallel reduction holds at a step's peak besides the
    # gradients (the memory estimate's); None: the backend's `reduction_buffers`
    # (`DeclaresReductionBuffers`), which a sharded variant does not take
    reduction_buffers: int | None = None
    # its unfused attention's softmax in float32 under a narrower compute dtype, the backward
    # pass keeping that output and its compute-dtype copy (the memory estimate's); None: the
    # backend's `float32_softmax` (`DeclaresFloat32Softmax`)
    float32_softmax: bool | None = None
    # The as-written program's arithmetic: the same operations on the same values, so that
    # only the rounding of the kernels that run them may differ (a compiler, CUDA graphs, steps
    # fused into one call, recomputation, sharding); not another implementation of the model
    # or another kernel for an operation (a fused attention). Verify then runs no float64
    # referee of its own: its fp32 runs are held to its as-written program's rounding floor
    # (`xbench.results.checks.FLOOR_FACTOR`).
    same_formula: bool = False
    # A compiling variant's first-call seconds per parameter array on GPUs (torch.compile traces
    # and compiles each layer), for the plan's estimate; None: its backend's figure.
    first_call_per_array_s: float | None = None


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, without importing its framework."""

    installed: bool
    version: str | None = None
    reason: str | None = None  # why not, and what to install


@dataclass(frozen=True)
class DeviceInfo:
    """What `setup` found: the devices a worker will use, and the framework behind them."""

    framework: str
    framework_version: str
    platform: str  # "gpu", "cpu", ...
    device_names: tuple[str, ...]
    simulated: bool  # True when one CPU is split into logical devices
    available: int  # how many devices of this platform the framework can use
    details: dict[str, Any] = field(default_factory=dict)


class Unsupported(Exception):
    """The backend lacks an optional capability an action needs (e.g. verification)."""


class DeviceUnavailable(Exception):
    """Raised by `setup` when the devices asked for do not exist; the message says why."""


@dataclass(frozen=True)
class PreparedInfo:
    """Facts a backend reports about a prepared trial; they go into the record."""

    params: int  # counted from the framework's own variables
    weights_hash: str  # hash_weights of the initial weights read back from the framework
    precision: dict[str, Any]  # the matmul-precision settings as read back from the framework
    # True when each compiled call is waited for (simulated devices can deadlock otherwise)
    sync_every_call: bool = False
    notes: tuple[str, ...] = ()
    # Settings in force that change which kernels run (autotuning, cuDNN benchmark mode,
    # compiler flags, the compilation cache), read back from the framework; recorded with
    # every replicate.
    settings: dict[str, Any] = field(default_factory=dict)


class Prepared(Protocol):
    """Whatever `prepare` returns; the core only reads `info`."""

    info: PreparedInfo


class Backend(Protocol):
    """A framework's data-parallel training step, as xbench times it: the part every backend
    has. What a backend may add (the plain program and variants, more model families, the spmd
    launcher, verification, its own all-reduce, peak memory, options) are the protocols of
    `xbench.contract.abilities`; the core asks `isinstance(backend, Ability)`."""

    name: ClassVar[str]
    """The name users type (`--backends NAME`); equals the entry-point name."""

    install_hint: ClassVar[str]
    """What to install when `probe` finds the framework missing, e.g. "pip install 'xbench[jax]'"."""

    def probe(self) -> Availability:
        """Is the framework installed, and which version? Cheap; must not import it."""

    def setup(self, devices: int, platform: str) -> DeviceInfo:
        """Configure `devices` devices on `platform` ("auto", "cpu" or "gpu") in this fresh
        process, before anything else; raise `DeviceUnavailable` if they do not exist.
        Every backend needs it, spmd-only ones too: the core calls `setup(1, platform)` in a
        short-lived process to learn which devices a backend sees (`available` = how many)."""

    def prepare(self, trial: Trial, work: Work) -> Prepared:
        """Build the model of `trial.model.family` from `work.arrays` (the family's canonical
        layout, converted explicitly to the framework's), place `work.shards(...)` on the devices, apply
        `trial.precision` explicitly, build the optimizer (`ADAM`, `trial.learning_rate`) and
        the compiled step. With `trial.all_reduce` False, build the same step without the
        gradient all-reduce (each device applies its own gradient), or raise `Unsupported`.
        Must not run training steps: the core times the first call."""

    def run(self, prepared: Prepared, steps: int) -> None:
        """Run `steps` training steps (a multiple of `trial.protocol.steps_per_call`) and
        return only after the devices have finished them."""


def probe_distributions(framework: str, names: tuple[str, ...], hint: str) -> Availability:
    """Availability from installed distributions, without importing them.

    `names` are the distributions a backend needs; `framework` is the one whose version is
    reported; `hint` says what to install when one is missing.
    """
    missing = []
    for name in names:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        return Availability(False, reason=f"{', '.join(missing)} not installed; {hint}")
    return Availability(True, version=metadata.version(framework))
