"""`torch`: PyTorch models trained with torch.optim.Adam, data-parallel through
`DistributedDataParallel`: one process per device (the `spmd` launcher), NCCL on GPUs and
gloo on CPUs, the gradients averaged over ranks by DDP's bucketed all-reduce during backward.

Besides the data-parallel program, the plain single-device program a user would write
(`trial.program == "plain"`): the same model and fused Adam, no DDP. Every program runs the
family's model and its loss as one module (`training_loss.TrainingLoss`, DDP around it).

The variants (`TUNINGS`) do what a performance engineer would. `compile` and `cuda-graphs`
compile that module, forward and loss in one region (`torch.compile`, inside DDP for the
data-parallel program), in inductor's default mode or in "reduce-overhead" mode (CUDA graphs);
the region's backward, compiled with it, is run by an eager `loss.backward()`, and the fused
Adam step stays eager. `channels-last` stays eager. `fsdp` (data-parallel program only) runs
the eager step under FSDP2 instead of DDP: parameters, gradients and Adam state sharded over
the ranks (`fsdp`); `fsdp-compile` compiles each sharded unit in place before sharding it.
`remat` (transformer) runs the eager step with each block under
`torch.utils.checkpoint` (`transformer`); `fsdp-remat`, `fsdp` with each block checkpointed
before it is sharded (`fsdp.checkpoint_units`). `compile`, `cuda-graphs` and `channels-last` turn on
cuDNN's benchmark mode and lay out the cnn family (its weights, activations and images) channels-last; as
written, neither. `channels-last` alone is refused for families without convolutions.

Eager PyTorch has no fused multi-step call: `steps_per_call` steps run as a Python loop.
The module imports no torch at import time (`probe` runs in the xbench process). Each family's
model, its loss, its data placement and its weights read back in the core's canonical layout
are in its module (`mlp`, `transformer`, `cnn`, `lstm`; the dispatch in `families`).

One option (`--option torch.extra_work=F`): a planted slowdown: `run` makes a fraction F more
training steps than it counts (`xbench_backends.extra_work`).
"""

from __future__ import annotations

import atexit
import gc
import importlib.util
import inspect
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, ClassVar

import numpy as np

from xbench.contract import (
    ADAM,
    ALL_GATHER,
    AS_WRITTEN,
    COMPILE_CACHE_VARIABLE,
    DATA_PARALLEL,
    PLAIN,
    REDUCE_SCATTER,
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
from xbench_backends.torch import families as model_families

SIMULATED_DEVICE_LIMIT = 8  # as in the jax backend: CPU "devices" are processes sharing one host
# How long joining the job and each collective may take before torch.distributed gives up, so
# a lost rank fails the trial instead of hanging it (the core's trial timeout is 300 s too).
TIMEOUT_S = 300.0
# DDP's own default, spelled out: gradients are all-reduced in buckets of at most this many MiB
# (after the first step DDP rebuilds the buckets in the order gradients become ready, with a
# 1 MiB first bucket, so that communication starts early in the backward pass).
BUCKET_CAP_MB = 25.0
# The spec's precision: (cuda matmul TF32, cudnn TF32, float32 matmul precision, autocast dtype,
# parameter dtype: that of the parameters, buffers, float inputs and targets, so of the whole step).
PRECISION = {
    "fp32": (False, False, "highest", None, "float32"),
    "tf32": (True, True, "high", None, "float32"),
    # bf16 mixed: bf16 compute under autocast, float32 parameters and optimizer, float32 loss;
    # any float32 matmul or convolution left outside autocast stays strict (there is none in
    # this step). cudnn's flag covers its convolutions and its LSTM alike.
    "bf16": (False, False, "highest", "bfloat16", "float32"),
    # float64 throughout (verify's precision for ill-conditioned families, xbench.results.checks):
    # parameters, BatchNorm statistics, activations, loss, gradients, all-reduce and Adam's
    # state; no autocast. The float32 flags are set strict all the same, so that nothing a
    # previous trial in this process set applies.
    "fp64": (False, False, "highest", None, "float64"),
}
FSDP_COMPILE = "fsdp-compile"
SHARDED = (*sharding.SHARDED, FSDP_COMPILE)
FSDP_HOW = "FSDP2 fully_shard per block and at the root, bf16 through its MixedPrecisionPolicy"
VARIANTS = (
    # Inductor's kernels compute the traced graph's operations (same_formula: only their rounding
    # differs from eager's); cudnn.benchmark and channels-last pick kernels for the same convolutions.
    # First calls on H200s: 22 s for GPT-2 small (148 arrays), 53 s for ResNet-50 (161), 76 s
    # for gpt2-xl (580); with CUDA graphs 28 and 52 s.
    Variant("compile", "torch.compile of forward and loss, default mode; cudnn.benchmark, cnn channels-last",
            same_formula=True, first_call_per_array_s=0.2),
    # CUDA graphs are recorded on the first calls after compilation: more untimed warm-up.
    Variant("cuda-graphs", "the same in mode='reduce-overhead': CUDA graphs", warmup_steps=3, same_formula=True,
            first_call_per_array_s=0.25),
    Variant("channels-last", "eager, channels-last memory format and cudnn.benchmark (cnn only)",
            families=("cnn",), same_formula=True),
    sharding.variant(FSDP_HOW),
    # torchtitan's order: each block compiled in place, then sharded; embeddings, head and loss eager.
    sharding.variant("the same with each block torch.compile'd (default mode) before fully_shard", FSDP_COMPILE,
                     first_call_per_array_s=0.2),
    recompute.variant("torch.utils.checkpoint, use_reentrant=False"),
    # torchtitan's order: each block wrapped in checkpoint_wrapper, then sharded.
    sharding.remat_variant(FSDP_HOW, "checkpoint_wrapper (torch.utils.checkpoint, use_reentrant=False) around "
                                     "each block before fully_shard"),
)


@dataclass(frozen=True)
class Tuning:
    """What a variant turns on."""

    compile_mode: str | None = None  # torch.compile's mode for forward and loss; None: eager
    cudnn_benchmark: bool = False  # cuDNN picks each convolution's algorithm by timing the candidates
    channels_last: bool = False  # convolutional families in the channels-last memory format
    only_channels_last: bool = False  # nothing else: Unsupported for a family without convolutions
    checkpoint_blocks: bool = False  # each transformer block under torch.utils.checkpoint (remat)
    compile_units: str | None = None  # torch.compile's mode for each sharded unit (fsdp-compile); None: eager


TUNINGS = {
    AS_WRITTEN: Tuning(),
    "compile": Tuning("default", cudnn_benchmark=True, channels_last=True),
    "cuda-graphs": Tuning("reduce-overhead", cudnn_benchmark=True, channels_last=True),
    "channels-last": Tuning(cudnn_benchmark=True, channels_last=True, only_channels_last=True),
    sharding.FSDP: Tuning(),  # eager, as written; the program differs (`fsdp`), not the tuning
    FSDP_COMPILE: Tuning(compile_units="default"),
    recompute.REMAT: Tuning(checkpoint_blocks=True),  # eager, as written, but for how blocks are differentiated
    sharding.FSDP_REMAT: Tuning(checkpoint_blocks=True),  # fsdp's program, remat's blocks
}
# What the compiled variants compile (settings["compiled_region"]): the TrainingLoss module.
COMPILED_REGION = "forward and loss"


@dataclass
class TorchPrepared:
    info: PreparedInfo
    # forward(batch, targets) -> the mean loss over this rank's batch, float32 (float64 in
    # fp64): the TrainingLoss, compiled or not, or DDP around it
    forward: Any
    ddp: Any  # DistributedDataParallel around it (for no_sync); None in the plain program
    model: Any  # the family's nn.Module
    canonical: Any  # canonical(grad) -> the weights or gradients in the core's order and layout
    optimizer: Any
    xs: Any  # this rank's shard: (batches, per_device_batch, ...) on the device, in the model's layout
    ys: Any
    all_reduce: bool
    device: Any
    step: int = 0  # the step counter: step i uses batch i % batches
    extra: ExtraWork = field(default_factory=ExtraWork)  # the extra_work option's steps


@dataclass
class TorchAllReduce:
    buffer: Any
    device: Any


@dataclass
class TorchCollective:
    """An all-gather or reduce-scatter: `op(output, input)`, out of place."""

    op: Any
    output: Any
    source: Any  # the input
    device: Any


class TorchDdpBackend:
    name: ClassVar[str] = "torch"
    install_hint: ClassVar[str] = "pip install 'xbench[torch]'"
    launchers: ClassVar[tuple[str, ...]] = ("spmd",)
    programs: ClassVar[tuple[str, ...]] = (DATA_PARALLEL, PLAIN)
    variants: ClassVar[tuple[Variant, ...]] = VARIANTS
    families: ClassVar[tuple[str, ...]] = model_families.FAMILIES
    # Imported once by the fork server (xbench.run.zygote); none initialises CUDA at import.
    fork_preload: ClassVar[tuple[str, ...]] = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo",
                                                "torch._refs", "torch.fx.experimental.symbolic_shapes")
    # The plan's estimate of a trial's first call: eager torch compiles nothing (medians on
    # H200s: 0.006 s for MLPs, 0.3 s for GPT-2 small, 0.6 s for ResNet-50); the compiling
    # variants declare their own cost per parameter array. CPUs: the estimate's own figures.
    first_call_s: ClassVar[Mapping[str, float]] = {"cpu": 0.6, "gpu": 0.05}
    first_call_per_array_s: ClassVar[Mapping[str, float]] = {"gpu": 0.002}
    fused_attention: ClassVar[bool] = True  # F.scaled_dot_product_attention keeps no probabilities
    # DDP's buckets, which the gradients are views of, outlive zero_grad(set_to_none=True): the
    # gradients' memory is held through the forward pass too, and the buckets rebuilt in
    # gradient-ready order after the first step come while the first set is held (the peak
    # counts from `prepare`). Measured, gpt2-xl bf16 at 8 sequences a GPU on 2 H200s: 58.2 GiB
    # against 46.4 for the plain program on one; two gradients' size is 11.6 GiB.
    reduction_buffers: ClassVar[int] = 2

    def __init__(self) -> None:
        self.process: Process | None = None
        self.device: Any = None
        self.platform: str | None = None

    def probe(self) -> Availability:
        return probe_distributions("torch", ("torch",), self.install_hint)

    def validate_options(self, options: dict[str, Any]) -> None:
        extra_work.validate(options, self.name)

    # -- joining the job ---------------------------------------------------------------------

    def setup(self, devices: int, platform: str) -> DeviceInfo:
        """One device without a launcher: a job of one process, whose store takes any free
        port (`setup_process`)."""
        if devices != 1:
            raise DeviceUnavailable("torch runs one process per device; use --launcher spmd")
        process = Process(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, nnodes=1,
                          coordinator="127.0.0.1:0", hosts=("127.0.0.1",))  # 0: any free port
        return self.setup_process(process, platform)

    def setup_process(self, process: Process, platform: str) -> DeviceInfo:
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        if platform == "gpu" and not cuda:
            raise DeviceUnavailable("torch finds no CUDA device"
                                    + ("" if torch.version.cuda else " (this torch is a CPU-only build)"))
        gpu = cuda and platform != "cpu"
        details: dict[str, Any] = {"rank": process.rank, "world_size": process.world_size,
                                   "local_rank": process.local_rank, "local_world_size": process.local_world_size,
                                   "node_rank": process.node_rank, "nnodes": process.nnodes,
                                   "coordinator": process.coordinator}
        if gpu:
            count = torch.cuda.device_count()
            # Checked on every rank alike, so that all of them fail instead of some waiting
            # in init_process_group for ranks that never come.
            if max(process.local_world_size, process.local_rank + 1) > count:
                raise DeviceUnavailable(f"{process.local_world_size} ranks on this node need as many CUDA devices "
                                        f"(local rank {process.local_rank} uses cuda:{process.local_rank}); "
                                        f"torch sees {count}")
            torch.cuda.set_device(process.local_rank)
            device = torch.device("cuda", process.local_rank)
            name = f"cuda:{process.local_rank} {torch.cuda.get_device_name(device)}"
            available = count
            details.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                           nccl=".".join(map(str, torch.cuda.nccl.version())))
            share = memory_share()
            if share is not None:  # workers share this GPU (verification): see xbench.contract
                torch.cuda.set_per_process_memory_fraction(share, device)
                details["memory_share"] = share
        else:
            if process.world_size > SIMULATED_DEVICE_LIMIT:
                raise DeviceUnavailable(f"asked for {process.world_size} CPU processes; "
                                        f"xbench allows {SIMULATED_DEVICE_LIMIT}")
            # The ranks on a node share its cores: without this each would start one thread
            # per core and oversubscribe the machine.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // process.local_world_size))
            device = torch.device("cpu")
            name = f"cpu:{process.local_rank} cpu"
            available = SIMULATED_DEVICE_LIMIT

        kwargs: dict[str, Any] = {}
        if gpu and "device_id" in inspect.signature(dist.init_process_group).parameters:
            kwargs["device_id"] = device  # binds the NCCL communicator to it now, not lazily
        if process.world_size == 1:
            # The store binds a port the kernel gives it (port 0): a free port picked before
            # the bind could be taken by another process in between (EADDRINUSE in CI).
            kwargs["store"] = store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True,
                                                    timeout=timedelta(seconds=TIMEOUT_S))
            details["coordinator"] = f"127.0.0.1:{store.port}"
        else:
            kwargs["init_method"] = f"tcp://{process.coordinator}"
        dist.init_process_group(backend="nccl" if gpu else "gloo", rank=process.rank, world_size=process.world_size,
                                timeout=timedelta(seconds=TIMEOUT_S), **kwargs)
        atexit.register(_teardown)
        self.process, self.device, self.platform = process, device, "gpu" if gpu else "cpu"
        details.update(dist_backend=str(dist.get_backend()), threads=torch.get_num_threads(),
                       interop_threads=torch.get_num_interop_threads(),
                       eager_init="device_id" in kwargs)
        return DeviceInfo(framework="torch", framework_version=torch.__version__, platform=self.platform,
                          device_names=(name,), simulated=not gpu, available=available, details=details)

    def teardown(self) -> None:
        _teardown()

    def all_gather(self, values: list[float]) -> list[list[float]]:
        import torch.distributed as dist

        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, [float(v) for v in values])
        return [list(v) for v in gathered]

    # -- one trial ---------------------------------------------------------------------------

    def prepare(self, trial: Trial, work: Work) -> TorchPrepared:
        tuning = _tuning(trial)
        mode = tuning.compile_mode
        if tuning.only_channels_last:
            reason = model_families.channels_last_unsupported(trial.model.family)
            if reason:
                raise Unsupported(reason)  # before torch is even imported
        if tuning.checkpoint_blocks and (reason := recompute.refusal(trial.model.family, trial.variant)):
            raise Unsupported(reason)
        fsdp = trial.variant in SHARDED
        reason = fsdp_module().refusal(trial, work, self._process().world_size) if fsdp else None
        if reason:
            raise Unsupported(reason)
        import torch

        from xbench_backends.torch.training_loss import TrainingLoss

        process, device, gpu = self._process(), self.device, self.platform == "gpu"
        if trial.devices != process.world_size:
            raise ValueError(f"trial {trial.id} wants {trial.devices} devices; this job has {process.world_size} ranks")
        if trial.program == PLAIN and trial.devices != 1:
            raise ValueError(f"trial {trial.id}: the plain program runs on one device, not {trial.devices}")
        compiles = mode or tuning.compile_units
        if compiles is not None:
            reason = _compile_unsupported(compiles, device)
            if reason:
                raise Unsupported(reason)  # before anything expensive: the core records the reason
        compile_cache = _fresh_compiler_state(compiles)
        if gpu:
            gc.collect()  # the previous trial's module and optimizer, should a cycle hold them
            torch.cuda.reset_peak_memory_stats(device)

        if trial.precision not in PRECISION:
            raise ValueError(f"unknown precision {trial.precision!r} of torch; known: {', '.join(PRECISION)}")
        matmul_tf32, cudnn_tf32, matmul_precision, autocast_dtype, param_dtype_name = PRECISION[trial.precision]
        param_dtype = getattr(torch, param_dtype_name)
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        torch.set_float32_matmul_precision(matmul_precision)
        compute_dtype = None if autocast_dtype is None else getattr(torch, autocast_dtype)
        # Set in every trial, as written too: trials share a worker process, so a tuned
        # trial's setting would otherwise leak into the next one.
        torch.backends.cudnn.benchmark = tuning.cudnn_benchmark

        # Dropout masks come from this stream; each rank draws its own, as jax folds in its index.
        torch.manual_seed(trial.seed + process.rank)

        channels_last = tuning.channels_last and trial.model.family in model_families.CONVOLUTIONAL
        built = model_families.build(work, device, compute_dtype, param_dtype, channels_last=channels_last)
        model = built.model
        canonical = built.canonical
        remat_notes = (_checkpoint_blocks(model, fsdp),) if tuning.checkpoint_blocks else ()
        if fsdp:  # sharded before the optimizer is built, so that Adam holds the shards
            canonical = fsdp_module().shard(model, built.canonical, device, process.world_size, compute_dtype,
                                            tuning.compile_units)
            # The family's reader holds the whole unsharded parameters: dropped, they are freed
            # now, not when prepare returns (gpt3-13b: 51 GB a GPU beside the shards).
            built = replace(built, canonical=canonical)
        # FSDP2's mixed-precision policy casts the parameters itself: no autocast under it.
        step_loss = TrainingLoss(model, built.loss, None if fsdp else compute_dtype)
        # Forward and loss are compiled as one region, as experts compile them: for the
        # transformer the float32 cross-entropy over every position's logits is then fused
        # into the compiled code instead of running eagerly on the materialised logits. The
        # batch is sliced outside (a Python int index inside would recompile per batch).
        # The compiled graph draws dropout masks from inductor's RNG, not eager's stream, so the
        # masks differ from the eager program's (verify runs with dropout 0).
        compiled = step_loss if mode is None else torch.compile(step_loss, mode=mode)
        # DDP around the compiled module, not torch.compile(ddp) as PyTorch's DDP notes show: in
        # torch 2.13 dynamo graph-breaks in DDP.forward (its logger) and runs it eagerly, so
        # that would compile only what DDP's forward calls, frame by frame after the break (and
        # nothing where that is torch's own code, which dynamo skips: a bare nn.Sequential).
        # Compiled inside DDP's forward, the region is exactly the TrainingLoss, and it still gets
        # DDPOptimizer (graphs split at bucket boundaries, all-reduce overlapping backward).
        # cuda-graphs over several ranks is written the same way but untested here: the
        # all-reduce runs in DDP's hooks between the recorded backward graphs, and whether
        # CUDA-graph trees keep the gradients DDP reads valid is to be checked on GPUs.
        ddp = None if trial.program == PLAIN or fsdp else _ddp(compiled, device, gpu)
        forward = compiled if ddp is None else ddp

        # torch's Adam is the paper's (eps added to sqrt(v_hat), after the bias correction),
        # as is optax's. The fused kernel: one launch per step for all parameters.
        # Only the trainable parameters (the LSTM's frozen second bias is not).
        # The compiled variants leave it eager: the update is one pass over parameters,
        # gradients and both moments, bound by memory bandwidth, which fused=True already makes
        # in one launch; torch.compile of optimizer.step could at best generate the same pass,
        # at the cost of compiling it (and guarding on its step counter), and the programs
        # experts write (measured) leave the fused step eager too.
        optimizer = torch.optim.Adam(built.trainable, lr=trial.learning_rate, betas=(ADAM.b1, ADAM.b2),
                                     eps=ADAM.eps, fused=True)

        # Placed once, in the model's layout and dtype (NCHW images, channels-last where tuned,
        # int64 tokens, float inputs and targets in the parameters' dtype): outside the step.
        xs, ys = work.shards(trial.global_batch, trial.devices)
        xs_d = built.place_inputs(_placed(xs[process.rank], device, param_dtype))
        ys_d = built.place_targets(_placed(ys[process.rank], device, param_dtype))

        info = PreparedInfo(
            params=sum(p.numel() for p in built.trainable),
            # one parameter on the device and the host at a time (a sharded one gathered whole)
            weights_hash=hash_weights(t.cpu().numpy() for t in canonical(False, lazily=True)),
            precision={
                "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
                "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
                "float32_matmul_precision": torch.get_float32_matmul_precision(),
                "autocast_dtype": autocast_dtype,
                "param_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                "loss_dtype": "float64" if param_dtype == torch.float64 else "float32",
            },
            sync_every_call=False,
            # cuDNN's benchmark mode (off as written, on in the variants) picks kernels by timing
            # them; compiled variants add what they compile and inductor's compilation cache.
            settings={"cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
                      "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
                      "memory_format": "channels_last" if channels_last else "contiguous",
                      "program": trial.program, "variant": trial.variant, "compile_mode": mode,
                      "compiled_region": _compiled_region(mode, tuning.compile_units),
                      "compile_cache": compile_cache, **_fp32_precision_settings(), **_dynamo_settings(mode, ddp)},
            notes=(
                (fsdp_module().note(model, process.world_size, compute_dtype,
                                    [tuple(p.shape) for p in work.parameters]) if fsdp else _program_note(ddp)),
                *(() if mode is None else (_compile_note(mode, ddp, model, compute_dtype),)),
                *(() if tuning.compile_units is None else (fsdp_module().compile_note(model, tuning.compile_units),)),
                *built.notes, *remat_notes,
                "Adam: torch.optim.Adam(fused=True), eps after the bias correction (paper/optax form)",
                "no fused multi-step call: steps_per_call steps run as a Python loop",
                *(() if trial.all_reduce else (_compute_only_note(ddp),)),
            ),
        )
        return TorchPrepared(info, forward, ddp, model, canonical, optimizer, xs_d, ys_d, trial.all_reduce,
                             device, extra=ExtraWork.of(trial.options))

    def run(self, prepared: TorchPrepared, steps: int) -> None:
        import torch

        for _ in range(steps + prepared.extra.owed(steps)):  # + the extra_work option's steps
            _train_step(prepared)
        if prepared.device.type == "cuda":
            torch.cuda.synchronize(prepared.device)

    def memory_peak_bytes(self, prepared: TorchPrepared) -> dict[str, Any] | None:
        """This rank's device: peak bytes allocated by torch since `prepare`; None on CPU."""
        import torch

        if prepared.device.type != "cuda":
            return None
        return {"peak_bytes": [int(torch.cuda.max_memory_allocated(prepared.device))], "scope": "trial"}

    # -- all-reduce microbenchmark capability (xbench allreduce, --breakdown) ---------------

    def allreduce_prepare(self, nbytes: int, options: dict[str, Any]) -> TorchAllReduce:
        """A float32 buffer of `nbytes` on this rank's device, reduced in place (SUM) by
        torch.distributed.all_reduce. In an spmd job each rank times only its own calls."""
        import torch

        self.validate_options(options)
        return TorchAllReduce(torch.ones(nbytes // 4, dtype=torch.float32, device=self.device), self.device)

    def allreduce_run(self, prepared: TorchAllReduce, iterations: int) -> None:
        import torch
        import torch.distributed as dist

        for _ in range(iterations):
            dist.all_reduce(prepared.buffer)  # values grow (to inf); a sum's cost does not change
        if prepared.device.type == "cuda":
            torch.cuda.synchronize(prepared.device)

    def collective_prepare(self, collective: str, nbytes: int, options: dict[str, Any]) -> TorchCollective:
        """This rank's float32 input and output and torch.distributed's single-tensor
        all-gather or reduce-scatter (SUM) between them; nbytes is nccl-tests' size, the
        whole buffer. In an spmd job each rank times only its own calls."""
        import torch

        self.validate_options(options)
        world, share = torch.distributed.get_world_size(), nbytes // 4 // torch.distributed.get_world_size()
        op = _collective_op(collective)
        sizes = (world * share, share) if collective == ALL_GATHER else (share, world * share)
        output, source = (torch.ones(n, dtype=torch.float32, device=self.device) for n in sizes)
        return TorchCollective(op, output, source, self.device)

    def collective_run(self, prepared: TorchCollective, iterations: int) -> None:
        import torch

        for _ in range(iterations):
            prepared.op(prepared.output, prepared.source)
        if prepared.device.type == "cuda":
            torch.cuda.synchronize(prepared.device)

    # -- verification capability (xbench verify) -------------------------------------------

    def gradients(self, prepared: TorchPrepared) -> tuple[float, list[np.ndarray]]:
        """The global mean loss and this rank's gradient after DDP's all-reduce, at the current
        weights on the current step's batch; no step is applied."""
        loss = _forward_backward(prepared)
        grads = _numpy(prepared.canonical(True))
        prepared.optimizer.zero_grad(set_to_none=True)
        return float(_global_mean(loss.reshape(1))[0]), grads

    def train(self, prepared: TorchPrepared, steps: int) -> list[float]:
        import torch

        # Each loss copied at once: under CUDA graphs it is an output of the recorded forward,
        # whose memory the next step's replay overwrites.
        losses = torch.stack([_train_step(prepared).clone() for _ in range(steps)])
        return [float(x) for x in _global_mean(losses)]

    def shard_losses(self, prepared: TorchPrepared, shards: int) -> list[float]:
        """Each rank's loss of its own share of the current step's batch (the one `gradients`
        uses), gathered by rank (`dist.all_gather`): one forward under no_grad of the module DDP
        wraps, in training mode (BatchNorm's statistics from the rank's batch, dropout on as the
        trial says), with no gradient and no all-reduce. On one process, the batch's `shards`
        slices one by one. Untimed; nothing of the trial changes: BatchNorm's running
        statistics are put back and the random stream is forked (`torch.random.fork_rng`).
        The compiled variants run their TrainingLoss eagerly here: the compiled region is a
        training graph, and calling it under no_grad (or at a slice's shape) would compile
        another one in the trial's process."""
        import torch
        import torch.distributed as dist

        world = dist.get_world_size()
        global_batch = prepared.xs.shape[1] * world
        if shards < 1 or global_batch % shards:
            raise ValueError(f"{shards} shards do not divide the global batch of {global_batch}")
        if world > 1 and shards != world:
            raise ValueError(f"a program on {world} ranks reports {world} shards (one per rank), not {shards}")
        module = prepared.ddp.module if prepared.ddp is not None else prepared.forward
        module = getattr(module, "_orig_mod", module)  # torch.compile's wrapper: the eager module
        index = prepared.step % prepared.xs.shape[0]
        batch, target = prepared.xs[index], prepared.ys[index]
        slices = 1 if world > 1 else shards
        size = batch.shape[0] // slices
        kept = [buffer.clone() for buffer in module.buffers()]
        devices = [prepared.device] if prepared.device.type == "cuda" else []
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=devices):
                losses = torch.stack([module(batch[i * size:(i + 1) * size], target[i * size:(i + 1) * size])
                                      for i in range(slices)])
        finally:
            with torch.no_grad():
                for buffer, value in zip(module.buffers(), kept):
                    buffer.copy_(value)
        if world == 1:
            return [float(v) for v in losses.cpu()]
        gathered = [torch.empty_like(losses) for _ in range(world)]
        dist.all_gather(gathered, losses)
        return [float(v) for shard in gathered for v in shard.cpu()]

    def replica_weights(self, prepared: TorchPrepared) -> list[list[np.ndarray]]:
        import torch
        import torch.distributed as dist

        tensors = prepared.canonical(False)
        flat = torch.cat([t.reshape(-1) for t in tensors])
        gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)
        replicas = []
        for buffer in gathered:
            pieces, offset = [], 0
            for t in tensors:
                pieces.append(buffer[offset:offset + t.numel()].reshape(t.shape).cpu().numpy().copy())
                offset += t.numel()
            replicas.append(pieces)
        return replicas

    def _process(self) -> Process:
        if self.process is None:
            raise RuntimeError("setup or setup_process must run before prepare")
        return self.process


def fsdp_module():
    """`xbench_backends.torch.fsdp`, imported when a trial asks for it (it imports FSDP2)."""
    from xbench_backends.torch import fsdp

    return fsdp


def _checkpoint_blocks(model, sharded: bool) -> str:
    """Each block of a built transformer checkpointed, as `remat` does it (a flag the model's
    forward reads) or, to be sharded next, as FSDP trainers do it (`fsdp.checkpoint_units`);
    what it did, for the notes."""
    return fsdp_module().checkpoint_units(model) if sharded else model_families.checkpoint_blocks(model)


def _forward_backward(p: TorchPrepared):
    """Loss and gradients of the current step's batch (all-reduced unless compute-only)."""
    index = p.step % p.xs.shape[0]
    batch, target = p.xs[index], p.ys[index]  # outside any compiled callable (see prepare)
    p.optimizer.zero_grad(set_to_none=True)
    # Compute-only: DDP skips its all-reduce; the plain program has none to skip.
    with p.ddp.no_sync() if p.ddp is not None and not p.all_reduce else nullcontext():
        loss = p.forward(batch, target)  # float32 (float64 in fp64), the mean over this rank's batch
        loss.backward()
    return loss.detach()


def _train_step(p: TorchPrepared):
    loss = _forward_backward(p)
    p.optimizer.step()
    p.step += 1
    return loss


def _ddp(model, device, gpu: bool):
    from torch.nn.parallel import DistributedDataParallel

    kwargs: dict[str, Any] = {"device_ids": [device.index] if gpu else None,
                              "bucket_cap_mb": BUCKET_CAP_MB, "gradient_as_bucket_view": True}
    # No broadcast of buffers from rank 0 at each forward: only the cnn has any (BatchNorm's
    # running statistics), and each rank keeps its own, as it normalises with its own batch's
    # statistics; they do not enter the loss (torch 2.13 renamed the flag).
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        kwargs["forward_sync_buffers"] = False
    else:
        kwargs["broadcast_buffers"] = False
    return DistributedDataParallel(model, **kwargs)


def _tuning(trial: Trial) -> Tuning:
    """What the trial's variant turns on; refuses unknown programs and variants."""
    if trial.program not in (DATA_PARALLEL, PLAIN):
        raise ValueError(f"unknown program {trial.program!r} of torch; known: {DATA_PARALLEL}, {PLAIN}")
    if trial.variant not in TUNINGS:
        raise ValueError(f"unknown variant {trial.variant!r} of torch; known: {', '.join(TUNINGS)}")
    return TUNINGS[trial.variant]


def _compile_unsupported(mode: str, device) -> str | None:
    """Why torch.compile cannot run `mode` on `device` here, or None: checked up front, so the
    trial is recorded as unsupported with the reason instead of failing at its first call."""
    if mode == "reduce-overhead" and device.type != "cuda":
        return "CUDA graphs need a CUDA device; this trial runs on CPU"
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return f"torch.compile does not support Python {sys.version.split()[0]} in torch {torch.__version__}"
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "torch.compile on CUDA needs Triton; pip install triton (the version torch pins)"
        return None
    compilers = _cpu_compilers()
    if not any(shutil.which(c) for c in compilers):
        return (f"torch.compile on CPU needs a C++ compiler ({' or '.join(compilers)} not found); "
                "install g++ (apt-get install g++) or set CXX")
    return None


def _cpu_compilers() -> list[str]:
    """The C++ compilers inductor would try, as its config lists them (CXX, else g++)."""
    try:
        from torch._inductor import config

        cxx = config.cpp.cxx
        found = [c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c]
    except (ImportError, AttributeError):  # a private config: fall back to its documented default
        found = []
    return found or [os.environ.get("CXX") or "g++"]


def _fresh_compiler_state(mode: str | None) -> str | None:
    """Start every trial from a fresh compiler, whatever ran before in this process.

    Dynamo keeps compiled graphs (and recompile counts) on the code objects it compiled, which
    every trial's TrainingLoss.forward shares, and its guards hold the previous trial's module:
    reset, or a later trial would run, or count recompiles against, graphs of an earlier one and keep its
    memory alive. Inductor's on-disk cache is on by default and persists across processes and
    runs; it goes to the run's directory when xbench gives one (contract: "Replicates"),
    otherwise to a private one per trial, so that each compiles afresh. Returns the shared
    cache directory, or None."""
    if "torch._dynamo" in sys.modules:  # something may have compiled earlier in this process
        import torch._dynamo

        torch._dynamo.reset()
    if mode is None:
        return None
    from torch._inductor.utils import clear_caches

    shared = os.environ.get(COMPILE_CACHE_VARIABLE) or None
    path = shared or tempfile.mkdtemp(prefix="xbench-inductor-")
    if shared is None:
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path  # read by inductor at each use
    clear_caches()  # inductor's in-memory caches of compiled code, keyed to the old directory
    return shared


def _compiled_region(mode: str | None, units: str | None) -> str | None:
    """What a trial compiles (settings["compiled_region"])."""
    if units is not None:
        return f"each sharded unit (mode={units})"
    return None if mode is None else COMPILED_REGION


def _dynamo_settings(mode: str | None, ddp) -> dict[str, Any]:
    """What decides how a compiled DDP module is split into graphs (none when eager or plain)."""
    if mode is None or ddp is None:
        return {}
    import torch._dynamo

    return {"dynamo_optimize_ddp": torch._dynamo.config.optimize_ddp}


def _program_note(ddp) -> str:
    import torch.distributed as dist

    if ddp is None:
        return "plain: no DDP, no process group in the step"
    return (f"DDP over {dist.get_backend()}: bucket_cap_mb={ddp.bucket_bytes_cap / 2**20:g}, "
            f"{_buckets(ddp)}, gradient_as_bucket_view=True, zero_grad(set_to_none=True)")


def _compile_note(mode: str, ddp, model, compute_dtype) -> str:
    import torch.nn as nn

    what = "the nn.Sequential" if isinstance(model, nn.Sequential) else f"the {type(model).__name__} module"
    autocast = "" if compute_dtype is None else f" under {str(compute_dtype).removeprefix('torch.')} autocast"
    region = f"TrainingLoss ({what}{autocast}, then its loss)"
    if any(isinstance(m, nn.RNNBase) for m in model.modules()):
        region += " (dynamo runs nn.LSTM eagerly unless torch._dynamo.config.allow_rnn)"
    rest = "its backward compiled with it, run by an eager loss.backward(); fused Adam eager"
    if ddp is None:
        return f"torch.compile(mode={mode}) of {region}; {rest}"
    return f"DDP(torch.compile(mode={mode}) of {region}); DDPOptimizer splits graphs at buckets; {rest}"


def _fp32_precision_settings() -> dict[str, Any]:
    """torch's newer per-operation float32 settings (torch >= 2.9), as the legacy flags set
    them: matmul, cuDNN convolutions and cuDNN RNNs ("ieee" or "none": no TF32; "tf32")."""
    import torch

    found = {}
    for key, owner in (("cuda_matmul_fp32_precision", "cuda.matmul"), ("cudnn_conv_fp32_precision", "cudnn.conv"),
                       ("cudnn_rnn_fp32_precision", "cudnn.rnn")):
        obj: Any = torch.backends
        try:
            for part in owner.split("."):
                obj = getattr(obj, part)
            found[key] = str(obj.fp32_precision)
        except (AttributeError, RuntimeError):  # an older torch: the legacy flags in `precision` say it
            continue
    return found


def _compute_only_note(ddp) -> str:
    if ddp is None:
        return "compute-only: the plain step itself (it has no all-reduce)"
    return "compute-only: each step under ddp.no_sync(), no gradient all-reduce"


def _global_mean(values):
    """The mean over ranks of per-rank values (equal shards: the global-batch mean)."""
    import torch.distributed as dist

    values = values.clone()
    dist.all_reduce(values)
    return (values / dist.get_world_size()).cpu().tolist()


def _placed(array: np.ndarray, device, param_dtype):
    """A host array on the device; floating ones (images, sequences, MLP features and
    targets, float32 in the core) in `param_dtype` (exact for float64), integer ones as they are."""
    import torch

    tensor = torch.from_numpy(array)
    if tensor.is_floating_point() and tensor.dtype != param_dtype:
        return tensor.to(device, param_dtype)
    return tensor.to(device)


def _numpy(tensors) -> list[np.ndarray]:
    """Host copies (a CPU tensor's numpy() shares its memory, and gradients are bucket views)."""
    return [t.cpu().numpy().copy() for t in tensors]


def _buckets(ddp) -> str:
    try:
        sizes = ddp._get_ddp_logging_data().get("bucket_sizes")
    except Exception:  # a private API: describe what is known without it
        sizes = None
    # DDP may rebuild the buckets after the first step, in the order gradients become ready,
    # with a smaller (1 MiB) first bucket; prepare runs no step, so these are the initial ones.
    return f"initial bucket sizes {sizes} bytes" if sizes else "bucket sizes unknown"


def _teardown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _collective_op(collective: str):
    """torch.distributed's single-tensor all-gather or reduce-scatter: the `*_single` names
    where this torch has them (newer releases deprecate the `*_tensor` ones), else those."""
    import torch
    import torch.distributed as dist

    names = {ALL_GATHER: ("all_gather_single", "all_gather_into_tensor"),
             REDUCE_SCATTER: ("reduce_scatter_single", "reduce_scatter_tensor")}
    if collective not in names:
        raise Unsupported(f"no collective {collective!r} in torch.distributed's program (allgather, reducescatter)")
    found = [getattr(dist, name) for name in names[collective] if hasattr(dist, name)]
    if not found:
        raise Unsupported(f"torch {torch.__version__} has none of torch.distributed.{', '.join(names[collective])}")
    return found[0]
