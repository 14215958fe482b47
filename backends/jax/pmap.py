"""`jax`: the model of `work.model.family` as a Flax NNX module (`families`), trained with optax
Adam, data-parallel through `jax.pmap` with a `lax.pmean` all-reduce of the gradients over the
device axis. pmap takes pytrees, so the data-parallel program uses Flax's functional pattern:
the parameters split from the model once (`nnx.split`), the model merged from them inside
the step (`nnx.merge`).

Runs on jax 0.10 and 0.11+: inputs are placed with `jax.device_put` and a `NamedSharding`
(the old `device_put_replicated`/`device_put_sharded` helpers are gone since jax 0.10).

Besides the data-parallel program, the plain single-device program a user would write
(`trial.program == "plain"`), no pmap, no sharding, no collective: as written, NNX's own
`nnx.jit` train step over the module and an `nnx.Optimizer` (`nnx_program`). Variants (either
program unless said): `jnp`, the earlier plain jax.numpy models; `functional` (plain program
only), the functional pattern under `jax.jit`, as Flax's performance guide advises;
`cudnn`, the functional program with cuDNN's fused attention (transformer, bf16, NVIDIA
GPUs); `fused`, `FUSED_STEPS` functional steps per compiled call (lax.scan); `fsdp`
(data-parallel program only), parameters and Adam state sharded over the devices (`sharded`);
`remat` (transformer), each block under nnx.remat (`nnx_transformer`); `fsdp-remat`, both;
`fsdp-cudnn`, `fsdp` with `cudnn`'s attention (the sharded program of MaxText's GPU runs).

Memory: each GPU is allocated as needed (no 75 % grab up front) up to 95 % of it
(`XLA_PYTHON_CLIENT_MEM_FRACTION`, jax's default 75 %, which refused gpt2-xl's 82 GiB step on
a 141 GB H200): the share xbench's memory check plans with. A user's own settings win.

Two ways to start it: one process driving every device (`setup`), or one process per device
(`setup_process`, the spmd launcher) joined by `jax.distributed.initialize`; the pmapped
program is the same, over the global devices. Every process holds the same numpy work and
`device_put` places only its own shards; read-backs take the local shard or gather.

The step programs this shares with `jax-shardmap` and `jax-auto` are in `steps`.

One option (`--option jax.extra_work=F`, the same for `jax-shardmap` and `jax-auto`): a planted
slowdown: `run` makes a fraction F more calls of the step than it counts (`xbench_backends.extra_work`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import Any, ClassVar

import numpy as np

from xbench.contract import (
    ALL_GATHER,
    AS_WRITTEN,
    DATA_PARALLEL,
    PLAIN,
    Availability,
    DeviceInfo,
    DeviceUnavailable,
    PreparedInfo,
    Process,
    Trial,
    Unsupported,
    Variant,
    Work,
    hash_weights,
    memory_share,
    probe_distributions,
)
from xbench_backends import extra_work, recompute, sharding
from xbench_backends.extra_work import ExtraWork
from xbench_backends.jax import nnx_program, sharded
from xbench_backends.jax.families import FAMILIES, JNP, JaxModel, build, canonical_arrays, refusal
from xbench_backends.jax.layers import FLOAT64, compute_dtype_name, float64_scope, in_precision
from xbench_backends.jax.nnx_program import NnxPrepared
from xbench_backends.jax.nnx_transformer import CUDNN, FSDP_CUDNN
from xbench_backends.jax.steps import (
    AXIS,
    MATMUL_PRECISION,
    JaxAllReduce,
    JaxCollective,
    check_shards,
    check_variant,
    collective_shape,
    initial_state,
    kernel_settings,
    optimizer,
    programs,
    quick_gpu_compilation,
    run_collective,
    shard_loss_fn,
    steady_cpu_scheduler,
    step_losses,
    use_compile_cache,
)

SIMULATED_DEVICE_LIMIT = 8
GPU_MEMORY_FRACTION = "0.95"  # of each GPU jax may allocate (`allocate_as_needed`)
# The variable that caps XLA's pool: jax's current name, and the older one it still reads
MEMORY_FRACTION_NAMES = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
# Steps per compiled call of the `fused` variant: enough that the per-call dispatch (tens of
# µs) is spread thin; measured on an H200, 50 fused steps ran within 2-7 % across processes.
FUSED_STEPS = 50
FUNCTIONAL = "functional"
SHARDED_HOW = "jax.jit with NamedSharding over the data axis; XLA all-gathers and reduce-scatters"
SHARDED = (*sharding.SHARDED, FSDP_CUDNN)  # the variants that run jax's sharded program (`sharded`)
_FSDP = sharding.variant(SHARDED_HOW)
VARIANTS = (
    Variant(JNP, "the model in plain jax.numpy (the MLP through flax.linen's apply), no NNX"),
    # the data-parallel program is functional as written (pmap takes the split state)
    Variant(FUNCTIONAL, "plain program: nnx.split once, jax.jit of a step that merges the model inside",
            programs=(PLAIN,)),
    Variant(CUDNN, "cuDNN fused attention (implementation='cudnn') in the functional step; transformer, "
                   "bf16, NVIDIA GPUs", precisions=("bf16",), families=("transformer",), fused_attention=True),
    # The functional step, unchanged, scanned over: its arithmetic is that of the data-parallel
    # program as written (functional already) and of plain+functional, which keeps a float64
    # run of its own (the plain program's step is built otherwise), so a slip shared with it shows there.
    Variant("fused", f"{FUSED_STEPS} functional steps fused into one compiled call (lax.scan)",
            steps_per_call=FUSED_STEPS, same_formula=True),
    _FSDP,
    recompute.variant("nnx.remat"),
    sharding.remat_variant(SHARDED_HOW, "nnx.remat"),
    # The sharded program a performance engineer runs on GPUs (MaxText's): fsdp with cudnn's attention.
    replace(_FSDP, name=FSDP_CUDNN, precisions=("bf16",), families=("transformer",), fused_attention=True,
            same_formula=False, description=f"{_FSDP.description}; and cuDNN fused attention as {CUDNN}'s "
                                            "(transformer, bf16, NVIDIA GPUs)"),
)


@dataclass
class JaxPrepared:
    info: PreparedInfo
    step: Any  # pmapped (jitted: plain): (state, xs, ys) -> (state, each step's loss [per device])
    grads: Any  # pmapped (jitted: plain): (state, xs, ys) -> (loss [per device], all-reduced gradients)
    state: Any  # (params, opt_state, step, key), pmap: a leading device axis; params read through in_order
    xs: Any
    ys: Any
    steps_per_call: int
    in_order: Any = None  # a tree shaped like the params -> its leaves in canonical order
    stacked: bool = True  # state and outputs carry a leading device axis (pmap); False: plain
    float64: bool = False  # an "fp64" trial: every call runs in x64 mode (`layers.float64_scope`)
    extra: ExtraWork = field(default_factory=ExtraWork)  # the extra_work option's calls
    global_batch: int = 0
    # shards -> pmapped (jitted: plain) (state, xs, ys) -> each device's loss (one device: each
    # slice's), no collective (`steps.shard_loss_fn`); built and compiled on first use only
    shard_program: Any = None
    # state -> each device's gathered copy of the weights, canonical order (`fsdp`: the state
    # is sharded, so a replica is what an all-gather puts on each device); None: read the state
    gather_replicas: Any = None


class JaxPmapBackend:
    name: ClassVar[str] = "jax"
    install_hint: ClassVar[str] = "pip install 'xbench[jax]'"
    launchers: ClassVar[tuple[str, ...]] = ("subprocess", "spmd")
    programs: ClassVar[tuple[str, ...]] = (DATA_PARALLEL, PLAIN)
    variants: ClassVar[tuple[Variant, ...]] = VARIANTS
    families: ClassVar[tuple[str, ...]] = FAMILIES
    # Imported once by the fork server (xbench.run.zygote); none touches a device at import.
    fork_preload: ClassVar[tuple[str, ...]] = ("jax", "flax.nnx", "optax")
    # The plan's estimate of a trial's first call: a fixed part and one per parameter array (XLA
    # compiles and autotunes each layer's kernels). Medians on H200s (2026-11-28): 1.8-2.9 s for
    # MLPs of 8 arrays, 12.4 s for GPT-2 small's pmap step (148), 15.7 s for ResNet-50 (161),
    # 35-49 s for gpt2-xl (580). CPUs: the estimate's own figures for every backend.
    first_call_s: ClassVar[Mapping[str, float]] = {"cpu": 0.6, "gpu": 2.0}
    first_call_per_array_s: ClassVar[Mapping[str, float]] = {"gpu": 0.08}
    # jax.nn.dot_product_attention as XLA runs it (not cuDNN's) softmaxes in float32: in bf16
    # the backward pass keeps those probabilities and their bf16 copy. Measured, gpt2-xl bf16
    # at 8 sequences a GPU on 2 H200s: 102.5 GiB, 39.6 above the estimate with bf16 ones only.
    float32_softmax: ClassVar[bool] = True

    def __init__(self) -> None:
        self.devices: list[Any] = []
        self.quick_compilation = False  # a verification job's: XLA's GPU autotuning off
        # each device's peak bytes when the last trial was forgotten: a later peak above it is
        # the next trial's own (jax's counter covers the process and cannot be reset)
        self.peaks_before: list[int] | None = None

    def prefer_quick_compilation(self) -> None:
        """In a verification job: no GPU kernel autotuning (`steps.quick_gpu_compilation`),
        unless XLA_FLAGS sets its level; CPU compilation is unchanged."""
        self.quick_compilation = True

    def probe(self) -> Availability:
        return probe_distributions("jax", ("jax", "jaxlib", "flax", "optax"), self.install_hint)

    def validate_options(self, options: dict[str, Any]) -> None:
        extra_work.validate(options, self.name)

    def setup(self, devices: int, platform: str) -> DeviceInfo:
        allocate_as_needed()
        import jax

        use_compile_cache()
        if platform == "cpu" or (platform == "auto" and not _cuda_plugin_present()):
            steady_cpu_scheduler()
        elif self.quick_compilation:
            quick_gpu_compilation()
        if platform == "cpu":
            jax.config.update("jax_platforms", "cpu")
        # Only the CPU client reads this; it splits the host into `devices` logical devices.
        jax.config.update("jax_num_cpu_devices", devices)
        try:
            found = jax.devices("gpu") if platform == "gpu" else jax.devices()
        except RuntimeError as err:
            raise DeviceUnavailable(f"jax finds no {platform} devices: {err}") from None
        kind = found[0].platform
        simulated = kind == "cpu"
        if simulated and devices > SIMULATED_DEVICE_LIMIT:
            raise DeviceUnavailable(
                f"asked for {devices} simulated CPU devices; xbench allows {SIMULATED_DEVICE_LIMIT}")
        if len(found) < devices:
            raise DeviceUnavailable(f"asked for {devices} devices; jax sees {len(found)} {kind} device(s)")
        self.devices = found[:devices]
        return DeviceInfo(
            framework="jax",
            framework_version=jax.__version__,
            platform=kind,
            device_names=tuple(f"{d.platform}:{d.id} {d.device_kind}" for d in self.devices),
            simulated=simulated,
            available=SIMULATED_DEVICE_LIMIT if simulated else len(found),
            details={"jaxlib": metadata.version("jaxlib"), "flax": metadata.version("flax"),
                     "optax": metadata.version("optax"),
                     **allocator_settings()},
        )

    def setup_process(self, process: Process, platform: str) -> DeviceInfo:
        """One device per process: join the job through jax.distributed (gloo on CPU)."""
        allocate_as_needed()
        import jax

        use_compile_cache()
        gpu = platform == "gpu" or (platform == "auto" and _cuda_plugin_present())
        if gpu and self.quick_compilation:
            quick_gpu_compilation()
        if not gpu:
            steady_cpu_scheduler()
            jax.config.update("jax_platforms", "cpu")
            jax.config.update("jax_num_cpu_devices", 1)
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(process.coordinator, process.world_size, process.rank,
                                   local_device_ids=[process.local_rank] if gpu else None,
                                   initialization_timeout=120, heartbeat_timeout_seconds=30)
        try:
            found = jax.devices()
        except RuntimeError as err:
            raise DeviceUnavailable(f"jax finds no {platform} devices: {err}") from None
        if gpu and found[0].platform != "gpu":
            raise DeviceUnavailable(f"jax finds no GPU (found {found[0].platform})")
        if len(found) != process.world_size:
            raise DeviceUnavailable(f"{process.world_size} processes of one device each, but jax sees "
                                    f"{len(found)} devices in all")
        self.devices = found
        local = jax.local_devices()
        return DeviceInfo(
            framework="jax",
            framework_version=jax.__version__,
            platform=found[0].platform,
            device_names=tuple(f"{d.platform}:{d.id} {d.device_kind}" for d in local),
            simulated=found[0].platform == "cpu",
            available=process.local_world_size,
            details={"jaxlib": metadata.version("jaxlib"), "processes": jax.process_count(),
                     "process_index": jax.process_index(),
                     "cpu_collectives": jax.config.jax_cpu_collectives_implementation,
                     **allocator_settings()},
        )

    def all_gather(self, values: list[float]) -> list[list[float]]:
        """Every process's `values`, by process index (float32 on the way; ample for times)."""
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather(np.asarray(values, np.float32))
        return [[float(v) for v in row] for row in np.asarray(gathered)]

    def prepare(self, trial: Trial, work: Work) -> JaxPrepared | NnxPrepared:
        import jax

        check_variant(trial, self.variants)
        jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION[trial.precision])
        with float64_scope(trial.precision == FLOAT64):
            why = self.program_refusal(trial) or refusal(trial, work, self.devices[0])
            if why:
                raise Unsupported(why)  # before anything expensive: the core records the reason
            model = build(trial, work, self.devices[0])
            if trial.variant in SHARDED:
                prepared = sharded.prepare(trial, work, model, self.devices, precision_info(trial), model.notes)
            elif trial.program != PLAIN:
                prepared = self._prepare(trial, work, model)
            elif trial.variant == AS_WRITTEN:
                prepared = self._prepare_nnx(trial, work, model)
            else:
                prepared = self._prepare_plain(trial, work, model)
        prepared.float64 = trial.precision == FLOAT64
        prepared.extra = ExtraWork.of(trial.options)
        return prepared

    def program_refusal(self, trial: Trial) -> str | None:
        """Why the variant does not apply to the trial's program, or None."""
        if trial.variant == FUNCTIONAL and trial.program != PLAIN:
            return ("the data-parallel program is functional as written (pmap takes the split state); "
                    f"{FUNCTIONAL} is a variant of the plain program")
        if trial.variant in SHARDED and trial.program == PLAIN:
            return (f"{trial.variant} shards the data-parallel program over its devices; the plain program has "
                    "no devices to shard over")
        return None

    def _prepare(self, trial: Trial, work: Work, model: JaxModel) -> JaxPrepared:
        """`jax.pmap` of the step over every device, a `lax.pmean` of the gradients inside."""
        import jax
        from jax import lax

        mesh = jax.sharding.Mesh(np.array(self.devices), (AXIS,))
        sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(AXIS))
        n = len(self.devices)

        tx = optimizer(trial.learning_rate)
        state = initial_state(model.params, tx, trial.seed)
        replicated = jax.tree.map(lambda a: jax.device_put(np.broadcast_to(a, (n, *np.shape(a))), sharded),
                                  state)
        xs, ys = (jax.device_put(a, sharded) for a in in_precision(work.shards(trial.global_batch, n), trial))

        reduce = self.reduce_gradients if trial.all_reduce else (lambda grads: grads)
        step_fn, grads_fn = programs(trial, model.loss_fn, tx, xs.shape[1], reduce, n, lambda: lax.axis_index(AXIS))
        step = jax.pmap(step_fn, axis_name=AXIS, devices=self.devices, donate_argnums=(0,))
        grads = jax.pmap(grads_fn, axis_name=AXIS, devices=self.devices)
        readback = canonical_arrays(model.in_order(_local(replicated[0])), replica=0)
        info = PreparedInfo(
            params=sum(int(np.prod(a.shape[1:])) for a in jax.tree.leaves(replicated[0])),
            weights_hash=hash_weights(readback),
            precision=precision_info(trial),
            # Simulated CPU devices can deadlock when collective steps are queued back to back
            # (the all-reduce's rendezvous hangs, then aborts the process): wait for every call.
            sync_every_call=self.devices[0].platform == "cpu",
            notes=(*program_notes(trial, "jax.pmap, a lax.pmean of the gradients"), *model.notes),
            settings=kernel_settings(),
        )
        # Each device's loss of its own batch, pmapped as the step is, without the pmean.
        shard_program = functools.cache(lambda count: jax.pmap(
            shard_loss_fn(model.loss_fn, xs.shape[1], n, lambda: lax.axis_index(AXIS), count),
            axis_name=AXIS, devices=self.devices))
        return JaxPrepared(info, step, grads, replicated, xs, ys, trial.protocol.steps_per_call, model.in_order,
                           global_batch=trial.global_batch, shard_program=shard_program)

    def _prepare_plain(self, trial: Trial, work: Work, model: JaxModel) -> JaxPrepared:
        """`jax.jit` of the functional step on the first device: the same model, loss, Adam,
        data and dropout stream as the data-parallel program on one device (device index 0
        folded into the key), without pmap, sharding or a collective."""
        import jax

        device = self.devices[0]
        tx = optimizer(trial.learning_rate)
        state = jax.device_put(initial_state(model.params, tx, trial.seed), device)
        xs, ys = (jax.device_put(a[0], device) for a in in_precision(work.shards(trial.global_batch, 1), trial))
        step_fn, grads_fn = programs(trial, model.loss_fn, tx, xs.shape[0], lambda grads: grads, 1, lambda: 0)
        step, grads = jax.jit(step_fn, donate_argnums=(0,)), jax.jit(grads_fn)
        info = PreparedInfo(
            params=sum(int(a.size) for a in jax.tree.leaves(state[0])),
            weights_hash=hash_weights(canonical_arrays(model.in_order(_stacked(state[0])), replica=0)),
            precision=precision_info(trial),
            sync_every_call=False,  # no collective, so no all-reduce rendezvous to deadlock
            notes=(*program_notes(trial, "jit"), *model.notes),
            settings=kernel_settings(),
        )
        shard_program = functools.cache(
            lambda count: jax.jit(shard_loss_fn(model.loss_fn, xs.shape[0], 1, lambda: 0, count)))
        return JaxPrepared(info, step, grads, state, xs, ys, trial.protocol.steps_per_call, model.in_order,
                           stacked=False, global_batch=trial.global_batch, shard_program=shard_program)

    def _prepare_nnx(self, trial: Trial, work: Work, model: JaxModel) -> NnxPrepared:
        """The plain program as NNX users write it (`nnx_program`)."""
        from flax import nnx

        device = self.devices[0]
        net, opt, step, loss_and_grads, xs, ys = nnx_program.build(trial, work, device, model.nnx, model.objective)
        readback = [np.asarray(w) for w in model.in_order(nnx.state(net, nnx.Param))]
        info = PreparedInfo(
            params=sum(int(a.size) for a in readback),
            weights_hash=hash_weights(readback),
            precision=precision_info(trial),
            sync_every_call=False,
            notes=(*program_notes(trial, "nnx.jit"), *model.notes, *_one_step_per_call(trial)),
            settings={**kernel_settings(), "flax": metadata.version("flax")},
        )
        return NnxPrepared(info, net, opt, step, loss_and_grads, model.nnx.paths, xs, ys, objective=model.objective)

    def run(self, prepared: JaxPrepared | NnxPrepared, steps: int) -> None:
        import jax

        if isinstance(prepared, NnxPrepared):
            return nnx_program.run(prepared, steps)
        # Locals, not attribute lookups, inside the loop: it is the user's loop being timed.
        step, state, xs, ys = prepared.step, prepared.state, prepared.xs, prepared.ys
        wait = prepared.info.sync_every_call
        calls = steps // prepared.steps_per_call
        with float64_scope(prepared.float64):  # entered once per call, outside the timed loop
            for _ in range(calls + prepared.extra.owed(calls)):  # + the extra_work option's calls
                state, loss = step(state, xs, ys)
                if wait:
                    loss.block_until_ready()
        prepared.state = state
        jax.block_until_ready(state)

    def forget_trial(self) -> None:
        """On CPUs, drop jax's caches of the finished trial's compiled programs and traces:
        on simulated CPU devices a trial timed after others in a process otherwise sometimes
        runs at the slower of two speeds (docs/statistics.md, "Bimodal processes"). Not on
        GPUs, where no such mode was seen and the next trial would recompile the small
        helper programs it shares with the last one (with autotuning) for nothing."""
        import jax

        if self.devices and self.devices[0].platform == "cpu":
            jax.clear_caches()
        self.peaks_before = self._device_peaks()

    def memory_peak_bytes(self, prepared: JaxPrepared) -> dict[str, Any] | None:
        """Each device's peak bytes in use, or None where the platform reports none. JAX keeps
        no per-trial counter and cannot reset its own: a peak above the one the last trial left
        is this trial's ("trial"); otherwise an earlier trial of this worker set it, and it only
        bounds this one's ("worker process": on one H200, gpt2-xl's remat program reported the
        cudnn program's 49.68 GB to the byte, timed before it in the same worker)."""
        peaks = self._device_peaks()
        if peaks is None:
            return None
        before = self.peaks_before
        own = before is None or all(now > then for now, then in zip(peaks, before))
        return {"peak_bytes": peaks, "scope": "trial" if own else "worker process"}

    def _device_peaks(self) -> list[int] | None:
        import jax

        stats = [device.memory_stats() for device in self.devices if device.process_index == jax.process_index()]
        if any(not s or "peak_bytes_in_use" not in s for s in stats):
            return None
        return [int(s["peak_bytes_in_use"]) for s in stats]

    def reduce_gradients(self, grads):
        """The data-parallel all-reduce: the mean gradient over the device axis."""
        from jax import lax

        return lax.pmean(grads, AXIS)

    # -- all-reduce microbenchmark capability (xbench allreduce, --breakdown) ---------------

    def allreduce_prepare(self, nbytes: int, options: dict[str, Any]) -> JaxAllReduce:
        """A float32 buffer of `nbytes` on every device, made there, and a pmapped psum."""
        import jax
        import jax.numpy as jnp
        from jax import lax

        n, count = len(self.devices), nbytes // 4
        sharded = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(self.devices), (AXIS,)),
                                             jax.sharding.PartitionSpec(AXIS))
        buffer = jax.jit(lambda: jnp.ones((n, count), jnp.float32), out_shardings=sharded)()
        # The input is donated, so XLA reduces in place as torch.distributed does: no new
        # output buffer per operation. (Values grow to inf; a sum's cost does not change.)
        reduce = jax.pmap(lambda x: lax.psum(x, AXIS), axis_name=AXIS, devices=self.devices,
                          donate_argnums=(0,))
        return JaxAllReduce(reduce, buffer, sync_every_call=self.devices[0].platform == "cpu")

    def allreduce_run(self, prepared: JaxAllReduce, iterations: int) -> None:
        """`iterations` in-place all-reduces of one buffer; returns after the last finished."""
        for _ in range(iterations):
            prepared.buffer = prepared.reduce(prepared.buffer)
            if prepared.sync_every_call:
                prepared.buffer.block_until_ready()
        prepared.buffer.block_until_ready()

    def collective_prepare(self, collective: str, nbytes: int, options: dict[str, Any]) -> JaxCollective:
        """A float32 input on every device, made there, and a pmapped lax.all_gather or
        lax.psum_scatter (tiled: one flat buffer each, as NCCL's)."""
        import jax
        import jax.numpy as jnp
        from jax import lax

        n = len(self.devices)
        count, _ = collective_shape(collective, nbytes, n)
        sharded = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(self.devices), (AXIS,)),
                                             jax.sharding.PartitionSpec(AXIS))
        buffer = jax.jit(lambda: jnp.ones((n, count), jnp.float32), out_shardings=sharded)()
        if collective == ALL_GATHER:
            op = jax.pmap(lambda x: lax.all_gather(x, AXIS, tiled=True), axis_name=AXIS, devices=self.devices)
        else:
            op = jax.pmap(lambda x: lax.psum_scatter(x, AXIS, tiled=True), axis_name=AXIS, devices=self.devices)
        return JaxCollective(op, buffer, sync_every_call=self.devices[0].platform == "cpu")

    def collective_run(self, prepared: JaxCollective, iterations: int) -> None:
        run_collective(prepared, iterations)

    # -- verification capability (xbench verify) -------------------------------------------

    def gradients(self, prepared: JaxPrepared | NnxPrepared) -> tuple[float, list[np.ndarray]]:
        if isinstance(prepared, NnxPrepared):
            return nnx_program.gradients(prepared)
        with float64_scope(prepared.float64):
            loss, grads = prepared.grads(prepared.state, prepared.xs, prepared.ys)
        if not prepared.stacked:
            return float(loss), canonical_arrays(prepared.in_order(_stacked(grads)), replica=0)
        return float(np.mean(_gathered(loss))), canonical_arrays(prepared.in_order(_local(grads)), replica=0)

    def train(self, prepared: JaxPrepared | NnxPrepared, steps: int) -> list[float]:
        if isinstance(prepared, NnxPrepared):
            return nnx_program.train(prepared, steps)
        losses: list[float] = []
        with float64_scope(prepared.float64):
            for _ in range(steps // prepared.steps_per_call):
                prepared.state, loss = prepared.step(prepared.state, prepared.xs, prepared.ys)
                losses += step_losses(_gathered(loss) if prepared.stacked else loss, prepared.steps_per_call)
        return losses

    def shard_losses(self, prepared: JaxPrepared | NnxPrepared, shards: int) -> list[float]:
        """Each device's loss of its own share of the current step's batch, from a pmap of the
        step's loss without its pmean, in device order (gathered from every process); on one
        device (and in the plain programs), the batch's `shards` slices, each its own forward
        pass. Untimed; the state is read, never donated or changed."""
        if isinstance(prepared, NnxPrepared):
            return nnx_program.shard_losses(prepared, shards)
        check_shards(prepared.global_batch, len(self.devices) if prepared.stacked else 1, shards)
        with float64_scope(prepared.float64):
            losses = prepared.shard_program(shards)(prepared.state, prepared.xs, prepared.ys)
            values = _gathered(losses) if prepared.stacked else np.asarray(losses)
        return [float(v) for v in np.asarray(values).reshape(-1)]

    def replica_weights(self, prepared: JaxPrepared | NnxPrepared) -> list[list[np.ndarray]]:
        if isinstance(prepared, NnxPrepared):
            return [nnx_program.weights(prepared)]
        if prepared.gather_replicas is not None:
            with float64_scope(prepared.float64):
                return prepared.gather_replicas(prepared.state)
        if not prepared.stacked:
            return [canonical_arrays(prepared.in_order(_stacked(prepared.state[0])), replica=0)]
        with float64_scope(prepared.float64):  # a multi-process gather runs a program
            params = prepared.in_order(_gathered(prepared.state[0]))
        return [canonical_arrays(params, replica=r) for r in range(len(self.devices))]


def allocate_as_needed() -> None:
    """Before jax's GPU client starts: allocate as needed instead of 75 % of each GPU up front,
    so NVML's "used" means something, and allow up to 95 % of it (jax's default cap is 75 %;
    xbench's memory check plans with the GPU's memory less 5 %). A user's own settings win,
    except where workers share the GPUs (verification): there a worker's share caps XLA's pool
    (`memory_share`), whose reservation otherwise grows past what its programs use. The cap
    goes under the name the user set, if any (jax refuses both names at once)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    given = next((name for name in MEMORY_FRACTION_NAMES if os.environ.get(name)), None)
    share = memory_share()
    if share is not None:
        os.environ[given or MEMORY_FRACTION_NAMES[-1]] = f"{share:.4f}"
    elif given is None:
        os.environ[MEMORY_FRACTION_NAMES[-1]] = GPU_MEMORY_FRACTION


def allocator_settings() -> dict[str, str]:
    return {name: os.environ[name] for name in ("XLA_PYTHON_CLIENT_PREALLOCATE", *MEMORY_FRACTION_NAMES)
            if name in os.environ}


def _one_step_per_call(trial: Trial) -> tuple[str, ...]:
    """The nnx.jit step has no fused form: say so where the protocol asks for one."""
    if trial.protocol.steps_per_call == 1:
        return ()
    return (f"steps_per_call {trial.protocol.steps_per_call}: as many nnx.jit calls of one step each (NNX's "
            "step has no fused form; the fused variant fuses the functional step)",)


def program_notes(trial: Trial, how: str) -> tuple[str, ...]:
    """What runs the step, in the record's notes."""
    if how == "nnx.jit":
        return ("as written: Flax NNX, an nnx.jit train step over the nnx.Module and nnx.Optimizer "
                "(wrt=nnx.Param), both donated; no pmap, no sharding, no collective",)
    model = "plain jax.numpy model" if trial.variant == JNP else "Flax NNX model merged inside the step (nnx.merge)"
    if how == "jit":
        return (f"plain: jax.jit of a functional step ({model}) on one device; no pmap, no sharding, no collective",)
    return (f"data-parallel: {how}; a functional step ({model})",)


def precision_info(trial: Trial) -> dict[str, Any]:
    """What the trial computes in, as this process set it (in `prepare`)."""
    import jax

    info = {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
            "compute_dtype": compute_dtype_name(trial)}
    if trial.precision == FLOAT64:  # parameters, statistics, loss and Adam state float64 too
        info.update(param_dtype="float64", jax_enable_x64="scoped to this trial's calls")
    return info


def _cuda_plugin_present() -> bool:
    """Whether jax can use CUDA here, judged without initialising jax (which must come after
    jax.distributed.initialize)."""
    plugins = ("jax_cuda13_plugin", "jax_cuda12_plugin")
    return any(importlib.util.find_spec(p) is not None for p in plugins) and os.path.exists("/dev/nvidiactl")


def _stacked(tree):
    """Host copies with a leading axis of one device, as pmap's outputs have."""
    import jax

    return jax.tree.map(lambda a: np.asarray(a)[None], tree)


def _local(tree):
    """This process's first device's slice of each device-stacked array, as a leading axis
    of 1 (everything when one process drives every device)."""
    import jax

    if jax.process_count() == 1:
        return tree
    return jax.tree.map(lambda a: np.asarray(a.addressable_shards[0].data), tree)


def _gathered(tree):
    """Device-stacked arrays as whole numpy arrays, gathered from every process."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, tree)
    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))
