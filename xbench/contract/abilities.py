"""What a backend may do besides the required `Backend` part: one `typing.Protocol` per
optional ability, checked at run time with `isinstance(backend, Ability)`. A backend has an
ability by having its members (no base class, no registration); one it lacks is absent, never
an error: docs/writing-a-backend.md says what each one's absence means.

The helpers at the end read what a backend declares, with the defaults of one that declares
nothing: the data-parallel program as written, the MLP, the subprocess launcher."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from xbench.contract.backend import DeviceInfo, Variant
from xbench.contract.trial import DATA_PARALLEL, PLAIN, Process

# -- declarations: class attributes ---------------------------------------------------------------


@runtime_checkable
class DeclaresPrograms(Protocol):
    """Lists "plain" when `prepare` can build the plain single-device program (see "Programs
    and variants" in xbench.contract); without it, the data-parallel program alone."""

    programs: ClassVar[tuple[str, ...]]


@runtime_checkable
class DeclaresVariants(Protocol):
    """The backend's named variants besides "as-written"."""

    variants: ClassVar[tuple[Variant, ...]]


@runtime_checkable
class DeclaresFamilies(Protocol):
    """The model families `prepare` can build (`xbench.models`: "mlp", "transformer", "cnn",
    "lstm", or a plugin's); trials of others are `unsupported`. Without it: the MLP."""

    families: ClassVar[tuple[str, ...]]


@runtime_checkable
class DeclaresLaunchers(Protocol):
    """The launchers that can start this backend, preferred first: "subprocess" (one process
    drives every device: `setup`) and/or "spmd" (one process per device: `SpmdCapable`).
    Without it: "subprocess"."""

    launchers: ClassVar[tuple[str, ...]]


@runtime_checkable
class DeclaresForkPreload(Protocol):
    """Modules (the framework) that a fork server may import once before it forks this
    backend's workers (`xbench.run.zygote`), so that no worker imports them again. Importing
    them must start no device context, runtime or compilation: each forked worker starts its
    own. Without it: none (each worker imports its framework itself, as it would anyway)."""

    fork_preload: ClassVar[tuple[str, ...]]


@runtime_checkable
class DeclaresFusedAttention(Protocol):
    """True where the as-written program's transformer attention is a fused kernel that keeps
    no attention probabilities for the backward pass (torch's scaled_dot_product_attention),
    which the memory estimate counts otherwise (`xbench.models.memory`); a variant may say
    otherwise for itself (`Variant.fused_attention`). Without it: not fused."""

    fused_attention: ClassVar[bool]


@runtime_checkable
class DeclaresFloat32Softmax(Protocol):
    """True where the programs' unfused attention takes its softmax in float32 whatever the
    compute dtype (as one backend's library attention does under its compiler), so that the backward pass
    keeps the float32 probabilities beside their compute-dtype copy: three times the bytes
    of bf16 probabilities alone, which the memory estimate counts then. Without it: not."""

    float32_softmax: ClassVar[bool]


@runtime_checkable
class DeclaresReductionBuffers(Protocol):
    """How many gradient-sized buffers (in the gradients' dtype) the data-parallel program's
    gradient reduction holds at a step's peak beyond the gradients themselves (a bucketed reduction's),
    which the memory estimate adds to its replicated rows (`xbench.models.memory`). Without
    it: none."""

    reduction_buffers: ClassVar[int]


@runtime_checkable
class DeclaresFirstCall(Protocol):
    """A trial's typical first-call seconds (building the model, compiling, any kernel
    search) by platform ("cpu", "gpu"), for the plan's estimate of a run's wall time
    (`xbench.run.estimate`); a platform it leaves out gets the estimate's own figure. A hint,
    never a measurement: records keep each trial's real first call. It may also declare
    `first_call_per_array_s` (by platform): the seconds each parameter array adds (a compiler
    that autotunes every layer's kernels), in place of the estimate's own figure."""

    first_call_s: ClassVar[Mapping[str, float]]


# -- abilities: methods ---------------------------------------------------------------------------


@runtime_checkable
class SpmdCapable(Protocol):
    """Needed for the spmd launcher (one process per device)."""

    def setup_process(self, process: Process, platform: str) -> DeviceInfo:
        """Like `setup`, for one device (`process.local_rank` on this node): join the job
        (jax.distributed.initialize, torch.distributed.init_process_group, TF_CONFIG, ...)."""

    def all_gather(self, values: list[float]) -> list[list[float]]:
        """Every rank's `values`, by rank (through the framework's collectives; untimed).
        The core gathers each rank's window times with it: step time = max over ranks."""


@runtime_checkable
class Verifiable(Protocol):
    """What `xbench verify` (and the check before `compare`) reads; a backend without all
    three is timed but marked unverifiable. In an spmd job, `gradients` is this rank's
    (all-reduced) gradient, `train` the global mean loss of each step, and `replica_weights`
    every rank's weights, by rank."""

    def gradients(self, prepared: Any) -> tuple[float, list[np.ndarray]]:
        """Global-batch loss and the gradient the data-parallel step applies after its
        all-reduce, at the current weights on the current step's batch; in the family's
        canonical order and layout, as `work.arrays` (replica 0)."""

    def train(self, prepared: Any, steps: int) -> list[float]:
        """Run `steps` training steps of the timed program; the global loss of each."""

    def replica_weights(self, prepared: Any) -> list[list[np.ndarray]]:
        """The weights held by each replica, in canonical order and layout."""


@runtime_checkable
class ReportsShardLosses(Protocol):
    """Proof that each device computes its own share of the batch (`xbench verify`): without
    it a data-parallel program that computed the whole batch on one device and copied the
    result to the others would pass every other check. Without it, verify says the shares
    went unchecked."""

    def shard_losses(self, prepared: Any, shards: int) -> list[float]:
        """The loss, at the current weights, of each of `shards` equal consecutive slices of
        the current step's global batch (slice i: samples i*B/shards to (i+1)*B/shards - 1),
        each a forward pass of that slice alone (batch statistics from the slice), before any
        reduction across devices, by slice; untimed, no weights change. A program on N > 1
        devices is asked for shards == N and computes slice i on device i, where its training
        step computes it; a program on one device computes every slice there. In an spmd job,
        every rank returns all N (gathered)."""


@runtime_checkable
class AllReduceCapable(Protocol):
    """The framework's own all-reduce, timed alone (`xbench allreduce`, `--breakdown`);
    without it those results are 'unsupported'."""

    def allreduce_prepare(self, nbytes: int, options: dict[str, Any]) -> Any:
        """A float32 buffer of `nbytes` on each device and the framework's own SUM
        all-reduce over them."""

    def allreduce_run(self, prepared: Any, iterations: int) -> None:
        """`iterations` all-reduces; return after the devices finished them."""


# The collectives `xbench allreduce --collectives` times, by the names its option takes.
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = "allreduce", "allgather", "reducescatter"
COLLECTIVES = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER)


@runtime_checkable
class GathersAndScatters(Protocol):
    """The framework's own all-gather and reduce-scatter, timed alone (`xbench allreduce
    --collectives`); without it those results are 'unsupported'. A backend with only one of
    them raises `Unsupported` from `collective_prepare` for the other, saying why."""

    def collective_prepare(self, collective: str, nbytes: int, options: dict[str, Any]) -> Any:
        """Float32 buffers for `collective` ("allgather" or "reducescatter") and the framework's
        own operation over them. `nbytes` is nccl-tests' size, the whole buffer, a multiple of
        4 × devices: all-gather's output on each device, each device sending its
        nbytes/devices; reduce-scatter's input on each device, each receiving the SUM of its
        nbytes/devices share."""

    def collective_run(self, prepared: Any, iterations: int) -> None:
        """`iterations` of the prepared collective, out of place; return after the devices
        finished them."""


@runtime_checkable
class ReportsMemory(Protocol):
    """The framework's own peak-memory counter, recorded as `telemetry.framework_memory`."""

    def memory_peak_bytes(self, prepared: Any) -> dict[str, Any] | None:
        """{"peak_bytes": [per device], "scope": "trial" or "worker process"}, or None where
        the framework has no counter."""


@runtime_checkable
class ForgetsTrials(Protocol):
    """Lets go of what the framework keeps for a finished trial in its own caches (compiled
    programs, traced functions), so that the next trial in the worker process inherits less
    of it. Without it, the core only collects the finished trial's garbage
    (`xbench.worker.main.run_trials`)."""

    def forget_trial(self) -> None:
        """Called after each trial, its prepared state dropped, outside any timed window."""


@runtime_checkable
class CompilesQuickly(Protocol):
    """Compiles faster at the cost of slower kernels, for verification jobs: they need the
    same arithmetic, not the fastest kernels, and a GPU framework that autotunes its kernels
    (XLA) can spend most of a run's first call on it. Without it, verification compiles as
    timing does; frameworks that pick kernels without compiling (torch eager, tf) need none."""

    def prefer_quick_compilation(self) -> None:
        """Called before `setup` (or `setup_process`) in a verification job, never in a timed
        one: trade kernel speed for compile time, the arithmetic unchanged. Say what was
        chosen in `PreparedInfo.settings`."""


@runtime_checkable
class ValidatesOptions(Protocol):
    """Takes options (`[options.NAME]`, `--option NAME.KEY=VALUE`); without it any option for
    the backend is an error."""

    def validate_options(self, options: dict[str, Any]) -> None:
        """Raise ValueError naming a bad key or value of [options.NAME]."""


def missing_methods(backend: object, protocol: type) -> list[str]:
    """The methods of `protocol` that `backend` (an instance or a class) lacks, in the
    protocol's order, for messages such as "lacks train, replica_weights"."""
    methods = [name for name, member in vars(protocol).items() if callable(member) and not name.startswith("_")]
    return [name for name in methods if not callable(getattr(backend, name, None))]


# -- what a backend declares, with the defaults ---------------------------------------------------


def programs_of(backend: object) -> tuple[str, ...]:
    """The programs a backend can build: always "data-parallel", and "plain" if it says so."""
    declared = backend.programs if isinstance(backend, DeclaresPrograms) else ()
    return (DATA_PARALLEL, PLAIN) if isinstance(declared, (tuple, list)) and PLAIN in declared else (DATA_PARALLEL,)


def variants_of(backend: object) -> dict[str, Variant]:
    """A backend's named variants by name (without "as-written")."""
    declared = backend.variants if isinstance(backend, DeclaresVariants) else ()
    return {v.name: v for v in declared if isinstance(v, Variant)} if isinstance(declared, (tuple, list)) else {}


def fused_attention_of(backend: object) -> bool:
    """Whether the backend's as-written attention is fused (`DeclaresFusedAttention`)."""
    return isinstance(backend, DeclaresFusedAttention) and backend.fused_attention is True


def float32_softmax_of(backend: object) -> bool:
    """Whether the backend's unfused attention softmaxes in float32 (`DeclaresFloat32Softmax`)."""
    return isinstance(backend, DeclaresFloat32Softmax) and backend.float32_softmax is True


def reduction_buffers_of(backend: object) -> int:
    """The gradient-sized buffers its data-parallel reduction adds (`DeclaresReductionBuffers`)."""
    declared = backend.reduction_buffers if isinstance(backend, DeclaresReductionBuffers) else 0
    return declared if isinstance(declared, int) and declared > 0 else 0


def families_of(backend: object) -> tuple[str, ...]:
    """The model families a backend builds (`xbench.models`): the MLP unless it says more."""
    declared = backend.families if isinstance(backend, DeclaresFamilies) else ("mlp",)
    return tuple(declared) if isinstance(declared, (tuple, list)) else ("mlp",)


def fork_preload_of(backend: object) -> tuple[str, ...]:
    """The modules a fork server imports for a backend (its class or an instance)."""
    return tuple(backend.fork_preload) if isinstance(backend, DeclaresForkPreload) else ()


def launchers_of(backend: object) -> tuple[str, ...]:
    """The launchers a backend supports, preferred first."""
    return tuple(backend.launchers) if isinstance(backend, DeclaresLaunchers) else ("subprocess",)


def first_call_of(backend: object, platform: str) -> float | None:
    """The first-call seconds a backend declares for `platform`, or None where it declares
    none (or a value that is not a positive, finite number)."""
    declared = backend.first_call_s if isinstance(backend, DeclaresFirstCall) else None
    return _positive_seconds(declared, platform)


def first_call_per_array_of(backend: object, platform: str) -> float | None:
    """The first-call seconds per parameter array a backend declares for `platform`
    (`DeclaresFirstCall`), or None."""
    declared = getattr(backend, "first_call_per_array_s", None) if isinstance(backend, DeclaresFirstCall) else None
    return _positive_seconds(declared, platform)


def _positive_seconds(declared: object, platform: str) -> float | None:
    return positive_seconds(declared.get(platform) if isinstance(declared, Mapping) else None)


def positive_seconds(seconds: object) -> float | None:
    """A declared figure that is a positive, finite number of seconds, else None (ignored)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
        return None
    return float(seconds)
