"""The public contract between xbench and a backend plugin.

A plugin is any class, registered under the entry-point group `xbench.backends`, that has the
attributes and methods of `Backend` (`backend.py`); it needs no base class. It imports this
package and nothing else from xbench: everything a plugin needs is re-exported here, `Work`
and `hash_arrays` included, and the built-in model families' modules (`cnn`, `lstm`, `mlp`,
`transformer`), whose layouts and constants a backend builds from (`cnn.convolutions`,
`transformer.LAYER_NORM_EPSILON`).

The package: `backend.py` (the `Backend` protocol and the values it returns), `abilities.py`
(the optional abilities), `trial.py` (what a backend is asked to run, and its ids),
`work.py` (the identical weights and data) and `timing.py` (how the core times a trial).

`work` is built once per worker process and shared, read-only, by its later trials: copy
arrays before changing them in place.

Life of a backend inside one worker process (one backend, one device count):

    backend = Backend()
    info = backend.setup(devices, platform)       # first: configure devices, import framework
    for trial in trials:
        prepared = backend.prepare(trial, work)   # model from work.arrays, data on devices
        backend.run(prepared, steps)              # timed by the core, many times

Replicates. The core measures each configuration in several fresh worker processes; a
backend sees nothing of it but `trial.replicate`. When the environment variable
`XBENCH_COMPILE_CACHE_DIR` (`COMPILE_CACHE_VARIABLE`) is set, a backend whose framework has a
persistent compilation cache may point it there in `setup`, so that the replicates of one run
share compiled programs; it says whether it did in `PreparedInfo.settings["compile_cache"]`.

Shared devices. Verification runs several workers on one GPU at once. Where the memory limits
how many, it sets `XBENCH_DEVICE_MEMORY_SHARE` (`MEMORY_SHARE_VARIABLE`) to the fraction of
each device's memory a worker may hold (e.g. "0.3090"), and a backend caps its allocator to it
in `setup`: a framework whose allocator grows past what a step uses (one that doubles its
reservation) would otherwise take the memory of the workers beside it. A run that needs more
fails out of memory and is run again alone, without the variable.

Programs and variants. Besides its data-parallel program a backend may offer the plain
single-device program a user would write without xbench (`programs` includes "plain"): for a
trial with `trial.program == "plain"` (always one device) `prepare` builds the step with no
distribution at all (no pmap or sharding, no strategy, no process group in the step, no DDP).
It may also offer `variants`, named ways to run either program as a performance engineer
would tune it (XLA, torch.compile, CUDA graphs, fused steps); `trial.variant` is one of their
names or "as-written" (the program as the framework's docs teach it). A variant must do the
same work (xbench verify checks it like any other program); one that cannot run on this
platform raises `Unsupported` in `prepare`, with the reason. A variant that fuses steps into
one call says how many in `Variant.steps_per_call`, and one that needs more warm-up (CUDA
graphs are recorded on the first calls) says how much in `Variant.warmup_steps`; the core
then sets the trial's `protocol` accordingly. A variant that runs only in some precisions (a
fused attention kernel that takes bf16 alone) lists them in `Variant.precisions`: `prepare`
raises `Unsupported` for the others, and xbench verify checks it in the first of them,
against its backend's float64 run with a tolerance from its backend's own rounding there.
A variant that keeps the as-written program's arithmetic and changes only how it is run
(compiled, captured in CUDA graphs, fused, recomputed, sharded) says so in
`Variant.same_formula`: verify then checks its fp32 runs with its as-written program's float64
run and rounding floor instead of running a float64 run of its own.

Launchers. With the `subprocess` launcher (the default for a backend that does not say
otherwise) one process drives all `devices` devices, as above. With the `spmd` launcher there
is one process per device: every process calls `setup_process(process, platform)` instead of
`setup`, joins the job described by `process` (a `Process`: rank, world size, coordinator),
and then runs the same `prepare`/`run` calls on its own device with `trial.devices ==
process.world_size`; its shard of the global batch is `work.shards(...)[process.rank]`.
A backend lists the launchers it supports in `launchers` (first = preferred).

Optional abilities. Beyond `Backend`, a backend may declare `programs`, `variants`,
`families`, `launchers`, `fork_preload`, `first_call_s`, `fused_attention`, `float32_softmax` and
`reduction_buffers` (`DeclaresPrograms`, `DeclaresVariants`, `DeclaresFamilies`, `DeclaresLaunchers`,
`DeclaresForkPreload`, `DeclaresFirstCall`, `DeclaresFusedAttention`, `DeclaresFloat32Softmax`,
`DeclaresReductionBuffers`) and have the methods of
`SpmdCapable`, `Verifiable`, `ReportsShardLosses`, `AllReduceCapable`, `GathersAndScatters`, `ReportsMemory`,
`ForgetsTrials`, `CompilesQuickly` and `ValidatesOptions`.
Each is a runtime-checkable Protocol: the core asks `isinstance(backend, Verifiable)`, and
an ability a backend lacks is absent, not an error.

The core does all timing, repetition and statistics, so every framework is timed by the same
code. `probe` runs in the xbench process itself (in a helper thread, within
`XBENCH_PROBE_TIMEOUT_S`; see xbench.run.registry) and must not import the framework.
"""

from __future__ import annotations

from xbench.contract.abilities import (
    ALL_GATHER,
    ALL_REDUCE,
    COLLECTIVES,
    REDUCE_SCATTER,
    AllReduceCapable,
    CompilesQuickly,
    DeclaresFamilies,
    DeclaresFirstCall,
    DeclaresFloat32Softmax,
    DeclaresForkPreload,
    DeclaresFusedAttention,
    DeclaresLaunchers,
    DeclaresPrograms,
    DeclaresReductionBuffers,
    DeclaresVariants,
    ForgetsTrials,
    GathersAndScatters,
    ReportsMemory,
    ReportsShardLosses,
    SpmdCapable,
    ValidatesOptions,
    Verifiable,
    families_of,
    first_call_of,
    first_call_per_array_of,
    float32_softmax_of,
    fork_preload_of,
    fused_attention_of,
    launchers_of,
    missing_methods,
    programs_of,
    reduction_buffers_of,
    variants_of,
)
from xbench.contract.backend import (
    ADAM,
    COMPILE_CACHE_VARIABLE,
    MEMORY_SHARE_VARIABLE,
    Adam,
    Availability,
    Backend,
    DeviceInfo,
    DeviceUnavailable,
    Prepared,
    PreparedInfo,
    Unsupported,
    Variant,
    memory_share,
    probe_distributions,
)
from xbench.contract.timing import TimingProtocol
from xbench.contract.trial import (
    AS_WRITTEN,
    DATA_PARALLEL,
    LAUNCHERS,
    PLAIN,
    PROGRAMS,
    Process,
    Trial,
    backend_label,
    backend_of_implementation,
    implementation,
    implementation_of,
    replicate_id,
    trial_id,
)
from xbench.contract.work import Work, hash_arrays, hash_weights

# The built-in model families, whose canonical layouts and constants backends build from.
from xbench.models import Param, cnn, lstm, mlp, transformer
from xbench.models.model_spec import ModelSpec

__all__ = [
    "ADAM", "ALL_GATHER", "ALL_REDUCE", "AS_WRITTEN", "COLLECTIVES", "COMPILE_CACHE_VARIABLE", "DATA_PARALLEL",
    "LAUNCHERS", "MEMORY_SHARE_VARIABLE", "PLAIN", "PROGRAMS", "Adam", "AllReduceCapable", "Availability",
    "Backend", "CompilesQuickly",
    "DeclaresFamilies", "DeclaresFirstCall",
    "DeclaresFloat32Softmax", "DeclaresFusedAttention", "DeclaresForkPreload", "DeclaresLaunchers",
    "DeclaresPrograms", "DeclaresReductionBuffers",
    "DeclaresVariants", "DeviceInfo", "DeviceUnavailable", "ForgetsTrials", "GathersAndScatters", "ModelSpec",
    "Param", "Prepared", "PreparedInfo", "Process", "REDUCE_SCATTER", "ReportsMemory", "ReportsShardLosses",
    "SpmdCapable", "TimingProtocol", "Trial", "Unsupported", "ValidatesOptions", "Variant", "Verifiable", "Work",
    "backend_label", "backend_of_implementation", "cnn", "families_of", "first_call_of", "first_call_per_array_of",
    "float32_softmax_of",
    "fused_attention_of", "fork_preload_of",
    "hash_arrays", "hash_weights", "implementation", "implementation_of", "launchers_of", "lstm", "missing_methods",
    "memory_share", "mlp", "probe_distributions", "programs_of", "reduction_buffers_of", "replicate_id",
    "transformer", "trial_id",
    "variants_of",
]
