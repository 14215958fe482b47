"""xbench's programs against the minimal loops an expert writes: GPT-2 small, ResNet-50, seed MLPs.

    python benchmarks/expert_loops.py --models gpt2-small --out gpt2.json            # ~4-5 min on an H100
    python benchmarks/expert_loops.py --models resnet50 mlp --out resnet-mlp.json    # ~6-7 min
    python benchmarks/expert_loops.py --models resnet50 --frameworks torch --programs compile
    python benchmarks/expert_loops.py --quick                 # CPU smoke test, about 1.5 min on 2 cores
    python benchmarks/expert_loops.py --list                  # the programs of each framework

Without --models: gpt2-small resnet50 mlp on a GPU (about 11-12 minutes on an H100 with the
default lineup, more than one 10-minute command: the deadline below cuts the tail), the
CPU-sized transformer-tiny resnet18 medium on a CPU.

What it measures. For each configuration (GPT-2 small in bf16 at 16 x 1,024
tokens, ResNet-50 in bf16 at 256 images of 224 x 224, the seed MLPs in tf32: medium @ 128 and
large @ 65,536), the training throughput of xbench's programs and of minimal loops written
here, timed interleaved in one process per framework, as throughput ratios with intervals.

Processes. One child process per model and framework (jax and torch never share a process;
the children run one after the other, GPT-2 first). In a child, per configuration: the core's
work (xbench.contract.work.build_work: initial weights and data) is built once, then every program is
built from it:

- xbench's programs, through the backend in this process as the core drives it
  (`setup(1, platform)`, `prepare(Trial(program="plain", variant=V), work)`, `run(prepared,
  steps)`); the lineup is in JAX_XBENCH and TORCH_XBENCH, one line a program. A variant the
  backend does not know, or cannot run here, is recorded as "unknown" or "unsupported" with
  the reason; `--dp` adds the data-parallel program on one device.
- minimal loops, written here as an expert writes them (JAX_MINIMAL, TORCH_MINIMAL):
  jax GPT-2: plain jax.numpy + optax.adam, one `jax.jit` step per call with the state
  donated, attention `jax.nn.dot_product_attention(is_causal=True)` with implementation None
  (XLA) or "cudnn" (GPU and bf16 only); jax ResNet: a flax.linen ResNet v1.5 (NHWC, BatchNorm
  in training mode with its running averages as a mutable collection), the same jitted and
  donated step; torch GPT-2: a nanoGPT-style nn.Module (SDPA is_causal=True, tied head, loss
  inside forward) eager and `torch.compile`d; torch ResNet: a torchvision-style ResNet v1.5
  in channels-last with cudnn.benchmark, eager and `torch.compile`d; the MLPs: overhead.py's
  minimal loops. torch: autocast bf16, `torch.optim.Adam(fused=True)` (the default Adam where
  there is no fused kernel), `zero_grad(set_to_none=True)`.
  Same work as xbench: the preset's shapes, the core's initial weights (each loop's parameter
  count is printed beside xbench's, and must equal the core's), the core's data resident on
  the device with batch i = step mod batches, Adam with xbench.contract.ADAM's b1, b2, eps
  and the learning rate of configs/families.toml (1e-4; the MLPs xbench's default 1e-3), bf16
  mixed precision with float32 parameters and float32 loss, matmul precision as xbench sets it
  (jax_default_matmul_precision "bfloat16"/"tensorfloat32"; torch's TF32 flags), LayerNorm and
  BatchNorm epsilon 1e-5, GELU tanh, no dropout but the MLPs'.

Timing (benchmarks/_interleave.py). Every program is built before any runs (xbench's torch
prepare resets torch.compile's caches, which would throw away a program compiled earlier).
Then each program's first call (compilation, autotuning, first allocations) is timed on its
own and reported as "first call" (each torch.compile'd program starts from an empty inductor
cache, so none reuses kernels another compiled), and --warmup more steps run untimed; each program's steps
per window are calibrated so that its window lasts about --window-s (whole calls); then
--rounds rounds time one window of every program, in alternating order, each window ending
in a device sync. Settings that are global to a process (cuDNN's benchmark mode, TF32 flags,
jax's default matmul precision) are put back before each call as the program set them when
it was built, so that one program's settings never leak into another's windows.

Reported per configuration: each program's median ms/step, throughput in the family's unit
(tokens/s: global batch x context per step; images/s; samples/s), MFU (xbench.models'
FLOPs per sample x samples/s / xbench.results.peaks' dense peak for the device and precision;
"unknown" where there is none, as on CPUs), first-call seconds, and the ratio of its
throughput to the framework's reference minimal loop: the median over rounds of (reference
window / program window, per step) with a distribution-free interval (order statistics;
[min, max] with few rounds, its coverage printed). The reference is the first minimal loop of
the family, in table order, that ran: the expert's fastest (jax+cudnn, torch+compile, torch
compile+channels-last), else the next.

Acceptance (on a GPU; on a CPU the targets do not apply): GPT-2 small bf16 @ 16: the best
xbench jax program >= 0.95 x the minimal cuDNN-attention jax loop, xbench's torch plain+compile
>= 0.95 x the minimal compiled torch loop, and the best xbench program >= 37 % MFU; ResNet-50
bf16 @ 256 (224 x 224): the best xbench torch and the best xbench jax program each >= 0.95 x
the fastest minimal loop of its framework. "Best" is the highest median throughput; a check
compares by the paired per-round ratio, and a verdict marked "~" has the target inside its
interval. A check applies when its configuration and framework were asked for (not with
--precision or another batch); asked for but not measured, it misses. Exit status 0 when every
child ran and every check that applies here meets.

Cost. --deadline-s (default 570, under the device's 10-minute limit per command): a child
skips a program whose compilation would not fit before it, and no child starts too close to
it; the JSON (--out) is rewritten after every child, so a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import atexit
import fnmatch
import functools
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _interleave import Runner, calibrate, child_records, describe, median_interval, paired_ratio, race, warm_up

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax is imported: no preallocation
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off, as on the lent GPU machines

MARK = "EXPERT-LOOPS-JSON "  # the children's record lines start with this
SEED = 0
LAYER_NORM_EPSILON = 1e-5
BATCH_NORM_EPSILON = 1e-5
BATCH_NORM_MOMENTUM = 0.1  # the weight of the new batch (torch's convention; flax's 0.9 is the old one's)
# The learning rate of configs/families.toml for the models teams train; the MLPs keep
# xbench's default (and overhead.py's minimal loops').
LEARNING_RATE = {"mlp": 1e-3}
DEFAULT_LEARNING_RATE = 1e-4
TARGET_RATIO = 0.95
TARGET_MFU = 0.37
DEFAULT_DEADLINE_S = 570.0
# Six rounds give the median's interval as [min, max] with 97 % coverage; windows of 0.4 s hold
# 5-10 steps of GPT-2 small or ResNet-50 on an H100.
ROUNDS, WINDOW_S, WARMUP = 6, 0.4, 3
QUICK_ROUNDS, QUICK_WINDOW_S, QUICK_WARMUP = 3, 0.05, 1
# A rough first call (compilation) on a GPU, to decide whether a program still fits before the
# deadline: jax compiles GPT-2 small / ResNet-50 in 20-40 s, torch.compile in 40-55 s.
FIRST_CALL_ESTIMATE_S = {"transformer": 60.0, "cnn": 75.0, "mlp": 20.0}
EAGER_FIRST_CALL_ESTIMATE_S = 10.0
CHILD_START_S = 60.0  # no child starts with less time than this before the deadline


# -- configurations ------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """One configuration: a preset of any family at a global batch, in a precision."""

    preset: str
    batch: int
    precision: str
    image: int | None = None  # the cnn's image size where not the preset's (--image)

    @property
    def label(self) -> str:
        return f"{self.preset}@{self.batch}" + (f" {self.image}px" if self.image else "")

    def model(self):
        from xbench.models.model_spec import preset_model

        changes = {"image": self.image} if self.image else {}
        return preset_model(self.preset, batch_sizes=(self.batch,), **changes)


MODEL_GROUPS: dict[str, tuple[Config, ...]] = {
    "gpt2-small": (Config("gpt2-small", 16, "bf16"),),
    "resnet50": (Config("resnet50", 256, "bf16"),),
    "mlp": (Config("medium", 128, "tf32"), Config("large", 65536, "tf32")),
    "medium": (Config("medium", 128, "tf32"),),
    "large": (Config("large", 65536, "tf32"),),
    # CPU-sized, for the smoke test: the tiny transformer, ResNet-18 at 32 x 32 (8 images a step)
    "transformer-tiny": (Config("transformer-tiny", 8, "bf16"),),
    "resnet18": (Config("resnet18", 8, "bf16"),),
}
GPU_MODELS = ("gpt2-small", "resnet50", "mlp")
CPU_MODELS = ("transformer-tiny", "resnet18", "medium")
DEFAULT_PRECISION = {"transformer": "bf16", "cnn": "bf16"}  # others: tf32 (a PRESET:BATCH model)


def parse_model(text: str) -> tuple[str, tuple[Config, ...]]:
    """A group of MODEL_GROUPS, or PRESET:BATCH for any preset (bf16 for transformers and
    CNNs, tf32 otherwise)."""
    from xbench.models import presets

    if text in MODEL_GROUPS:
        return text, MODEL_GROUPS[text]
    preset, _, batch = text.partition(":")
    if preset not in presets() or not batch.isdigit() or int(batch) < 1:
        raise argparse.ArgumentTypeError(f"model {text!r}: one of {', '.join(MODEL_GROUPS)}, or PRESET:BATCH "
                                         f"with PRESET one of {', '.join(presets())}")
    family = presets()[preset][0]
    return text, (Config(preset, int(batch), DEFAULT_PRECISION.get(family, "tf32")),)


def overridden(config: Config, precision: str | None, image: int | None) -> Config:
    """The configuration with --precision and (for a CNN) --image applied; the preset's own
    image size is no change (the acceptance checks still apply)."""
    from xbench.models import presets

    family, keys = presets()[config.preset]
    image = image if image and family == "cnn" else config.image
    return Config(config.preset, config.batch, precision or config.precision,
                  None if image == keys.get("image") else image)


def default_samples(family: str, batch: int) -> int:
    """Rows of data: overhead.py's 4096 for the MLPs, families.toml's 512 otherwise, and at
    least two global batches (xbench.contract.work caps what does not fit its memory budget)."""
    return max(4096 if family == "mlp" else 512, 2 * batch)


# -- the programs --------------------------------------------------------------------------

@dataclass(frozen=True)
class XbenchProgram:
    """One of xbench's programs: a backend variant, single-device ("plain") by default."""

    variant: str
    program: str = "plain"
    families: tuple[str, ...] | None = None  # in the default lineup only for these (None: all)
    compiles: bool = True  # its first call compiles (decides the deadline's estimate)
    slow_on_cpu: bool = False  # torch.compile takes minutes on a small CPU host: off there by default

    def name(self, backend: str) -> str:
        """xbench's name for it ("jax plain+cudnn"), the data-parallel program said outright
        (xbench calls it plain "jax")."""
        from xbench.contract import DATA_PARALLEL, implementation

        name = implementation(backend, self.variant, self.program)
        return f"{name} (data-parallel, 1 device)" if self.program == DATA_PARALLEL else name


@dataclass(frozen=True)
class Loop:
    """A minimal loop, built: `run(steps)` returns after the device finished them."""

    run: Callable[[int], None]
    params: int
    notes: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    last_loss: Callable[[], float] | None = None  # the loss of the last step run (reads the device)


@dataclass(frozen=True)
class LoopContext:
    """What a minimal loop is built from: the core's work and the configuration."""

    work: Any
    batch: int
    precision: str
    learning_rate: float
    device: Any  # a jax Device or a torch.device
    platform: str  # "gpu" or "cpu"


@dataclass(frozen=True)
class MinimalProgram:
    name: str
    family: str
    build: Callable[[LoopContext], Loop]
    compiles: bool = True
    slow_on_cpu: bool = False
    gpu_only: bool = False


class Unavailable(Exception):
    """A minimal loop that cannot run here (cuDNN attention on a CPU, ...): the reason."""


# -- minimal loops: jax ----------------------------------------------------------------------

JAX_MATMUL_PRECISION = {"fp32": "float32", "tf32": "tensorfloat32", "bf16": "bfloat16"}  # as xbench sets it


def jax_compute_dtype(precision: str):
    import jax.numpy as jnp

    return jnp.bfloat16 if precision == "bf16" else jnp.float32


def jax_training_loop(ctx: LoopContext, params, aux, loss_fn) -> tuple[Callable[[int], None], int, Callable]:
    """The step an expert jits: `loss_fn(params, aux, x, y) -> (loss, aux)` differentiated,
    optax.adam, the state (params, aux, Adam state, step) donated, batch step % batches taken
    on the device from data resident there. Returns run(steps), the parameter count and
    last_loss()."""
    import jax
    import numpy as np
    import optax

    from xbench.contract import ADAM

    tx = optax.adam(ctx.learning_rate, b1=ADAM.b1, b2=ADAM.b2, eps=ADAM.eps)
    params = jax.device_put(params, ctx.device)
    state = (params, jax.device_put(aux, ctx.device), jax.device_put(tx.init(params), ctx.device),
             jax.device_put(np.int32(0), ctx.device))
    xs, ys = (jax.device_put(a[0], ctx.device) for a in ctx.work.shards(ctx.batch, 1))
    batches = xs.shape[0]

    @functools.partial(jax.jit, donate_argnums=0)
    def train_step(state, xs, ys):
        params, aux, opt_state, step = state
        i = step % batches
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, aux, xs[i], ys[i])
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), aux, opt_state, step + 1), loss

    holder = [state, None]

    def run(steps: int) -> None:
        state = holder[0]
        for _ in range(steps):
            state, loss = train_step(state, xs, ys)
        holder[0], holder[1] = state, loss  # keeping the loss costs no sync
        jax.block_until_ready(state)

    return run, sum(int(leaf.size) for leaf in jax.tree.leaves(params)), lambda: float(holder[1])


def canonical_arrays(work) -> dict[str, Any]:
    """The core's initial arrays by canonical name."""
    return dict(zip((p.name for p in work.parameters), work.arrays))


def require_cudnn_attention(ctx: LoopContext, heads: int, head_width: int, context: int) -> None:
    """Raise Unavailable unless cuDNN's fused attention compiles here, forward and backward."""
    import jax
    import jax.numpy as jnp

    if ctx.platform != "gpu":
        raise Unavailable(f"cuDNN fused attention needs an NVIDIA GPU; this run is on {ctx.platform}")
    if ctx.precision != "bf16":
        raise Unavailable(f"cuDNN fused attention takes bf16 inputs; this configuration is {ctx.precision}")

    def attention_sum(q, k, v):
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        return out.astype(jnp.float32).sum()

    shape = jax.ShapeDtypeStruct((1, context, heads, head_width), jnp.bfloat16,
                                 sharding=jax.sharding.SingleDeviceSharding(ctx.device))
    try:
        jax.jit(jax.grad(attention_sum, argnums=(0, 1, 2))).lower(shape, shape, shape).compile()
    except Exception as err:
        raise Unavailable(f"cuDNN fused attention does not compile here: {describe(err)}") from None


def attention_kernel_note(ctx: LoopContext, heads: int, head_width: int, context: int) -> str:
    """Which kernel dot_product_attention(implementation=None) compiles to here, read from
    the compiled HLO of one head group (cheap beside the step's own compilation)."""
    import jax

    shape = jax.ShapeDtypeStruct((1, context, heads, head_width), jax_compute_dtype(ctx.precision),
                                 sharding=jax.sharding.SingleDeviceSharding(ctx.device))
    attention = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))
    text = attention.lower(shape, shape, shape).compile().as_text().lower()
    kernel = "cuDNN fused attention" if "cudnn" in text and "fmha" in text else "XLA's own (no fused kernel)"
    return f"attention: dot_product_attention(implementation=None) compiles to {kernel}"


def jax_gpt2(ctx: LoopContext, attention: str | None) -> Loop:
    """GPT-2 in plain jax.numpy: pre-LayerNorm blocks, bf16 activations with float32
    statistics and loss, float32 params cast where used, the head tied to wte."""
    import jax
    import jax.numpy as jnp
    import optax

    dims = ctx.work.model.shape
    heads, width, context = dims["heads"], dims["width"], dims["context"]
    if attention == "cudnn":
        require_cudnn_attention(ctx, heads, width // heads, context)
    jax.config.update("jax_default_matmul_precision", JAX_MATMUL_PRECISION[ctx.precision])
    dtype = jax_compute_dtype(ctx.precision)

    arrays = canonical_arrays(ctx.work)
    take = arrays.pop  # every canonical array is taken exactly once (checked below)

    def pair(prefix: str, first: str, second: str):
        return take(f"{prefix}.{first}"), take(f"{prefix}.{second}")

    params = {"wte": take("wte"), "wpe": take("wpe"),
              "blocks": [{"ln1": pair(f"h{b}.ln1", "scale", "bias"), "qkv": pair(f"h{b}.attn.qkv", "kernel", "bias"),
                          "proj": pair(f"h{b}.attn.proj", "kernel", "bias"), "ln2": pair(f"h{b}.ln2", "scale", "bias"),
                          "fc": pair(f"h{b}.mlp.fc", "kernel", "bias"), "out": pair(f"h{b}.mlp.proj", "kernel", "bias")}
                         for b in range(dims["layers"])],
              "lnf": pair("lnf", "scale", "bias")}
    if arrays:
        raise ValueError(f"the minimal GPT-2 has no place for xbench's {sorted(arrays)[:3]}")

    def layer_norm(x, scale_bias):
        scale, bias = scale_bias
        x = x.astype(jnp.float32)
        mean = x.mean(-1, keepdims=True)
        variance = jnp.square(x - mean).mean(-1, keepdims=True)
        return ((x - mean) * jax.lax.rsqrt(variance + LAYER_NORM_EPSILON) * scale + bias).astype(dtype)

    def dense(x, kernel_bias):
        kernel, bias = kernel_bias
        return x @ kernel.astype(dtype) + bias.astype(dtype)

    def block(p, x):
        batch, length, _ = x.shape
        q, k, v = jnp.split(dense(layer_norm(x, p["ln1"]), p["qkv"]), 3, axis=-1)
        q, k, v = (t.reshape(batch, length, heads, width // heads) for t in (q, k, v))
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=attention)
        x = x + dense(y.reshape(batch, length, width), p["proj"])
        return x + dense(jax.nn.gelu(dense(layer_norm(x, p["ln2"]), p["fc"]), approximate=True), p["out"])

    def loss_fn(params, aux, tokens, targets):
        x = (params["wte"][tokens] + params["wpe"][: tokens.shape[1]]).astype(dtype)
        for p in params["blocks"]:
            x = block(p, x)
        logits = layer_norm(x, params["lnf"]) @ params["wte"].astype(dtype).T
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean(), aux

    run, count, last_loss = jax_training_loop(ctx, params, (), loss_fn)
    note = ("attention: dot_product_attention(implementation='cudnn')" if attention == "cudnn"
            else attention_kernel_note(ctx, heads, width // heads, context))
    return Loop(run, count, (note,), {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision},
                last_loss)


RESNET_STAGES = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
RESNET_WIDTHS = (64, 128, 256, 512)


@functools.lru_cache(maxsize=None)
def flax_resnet_class():
    """A flax.linen ResNet v1.5 as the Flax ImageNet example writes it (stride on the 3x3
    convolution), NHWC, explicit symmetric padding, BatchNorm in training mode."""
    import flax.linen as nn
    import jax.numpy as jnp

    def conv(dtype, *args, **kwargs):
        return nn.Conv(*args, use_bias=False, dtype=dtype, **kwargs)

    def norm(dtype, name: str):
        return nn.BatchNorm(use_running_average=False, momentum=1 - BATCH_NORM_MOMENTUM, epsilon=BATCH_NORM_EPSILON,
                            dtype=dtype, name=name)

    pad1, pad3 = ((1, 1), (1, 1)), ((3, 3), (3, 3))

    class ResidualBlock(nn.Module):
        width: int
        stride: int
        bottleneck: bool
        dtype: Any

        @nn.compact
        def __call__(self, x):
            d, strides = self.dtype, (self.stride, self.stride)
            out = self.width * (4 if self.bottleneck else 1)
            if self.bottleneck:
                y = nn.relu(norm(d, "bn1")(conv(d, self.width, (1, 1), padding="VALID", name="conv1")(x)))
                y = nn.relu(norm(d, "bn2")(conv(d, self.width, (3, 3), strides, padding=pad1, name="conv2")(y)))
                y = norm(d, "bn3")(conv(d, out, (1, 1), padding="VALID", name="conv3")(y))
            else:
                y = nn.relu(norm(d, "bn1")(conv(d, self.width, (3, 3), strides, padding=pad1, name="conv1")(x)))
                y = norm(d, "bn2")(conv(d, self.width, (3, 3), padding=pad1, name="conv2")(y))
            if self.stride != 1 or x.shape[-1] != out:
                x = norm(d, "down_bn")(conv(d, out, (1, 1), strides, padding="VALID", name="down_conv")(x))
            return nn.relu(x + y)

    class ResNet(nn.Module):
        depth: int
        classes: int
        dtype: Any

        @nn.compact
        def __call__(self, images):
            d = self.dtype
            x = conv(d, RESNET_WIDTHS[0], (7, 7), (2, 2), padding=pad3, name="stem_conv")(images.astype(d))
            x = nn.max_pool(nn.relu(norm(d, "stem_bn")(x)), (3, 3), strides=(2, 2), padding=pad1)
            for stage, (width, blocks) in enumerate(zip(RESNET_WIDTHS, RESNET_STAGES[self.depth])):
                for b in range(blocks):
                    x = ResidualBlock(width, 2 if stage and not b else 1, self.depth >= 50, d, name=f"s{stage}_b{b}")(x)
            features = jnp.mean(x.astype(jnp.float32), axis=(1, 2)).astype(d)
            return nn.Dense(self.classes, dtype=d, name="head")(features)

    return ResNet


def flax_path(name: str) -> tuple[str, ...]:
    """The core's canonical name -> this Flax model's parameter path:
    "stem.conv.kernel" -> (stem_conv, kernel), "s1.b0.down.bn.scale" -> (s1_b0, down_bn, scale)."""
    parts = name.split(".")
    if parts[0] == "head":
        return ("head", parts[1])
    if parts[0] == "stem":
        return (f"stem_{parts[1]}", parts[2])
    return (f"{parts[0]}_{parts[1]}", "_".join(parts[2:-1]), parts[-1])


def jax_resnet(ctx: LoopContext) -> Loop:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax.traverse_util import flatten_dict, unflatten_dict

    jax.config.update("jax_default_matmul_precision", JAX_MATMUL_PRECISION[ctx.precision])
    dims = ctx.work.model.shape
    model = flax_resnet_class()(dims["depth"], dims["classes"], jax_compute_dtype(ctx.precision))
    image = jax.ShapeDtypeStruct((1, dims["image"], dims["image"], dims["channels"]), jnp.float32)
    expected = jax.eval_shape(model.init, jax.random.key(0), image)
    expected_params = flatten_dict(expected["params"])
    params = {flax_path(name): array for name, array in canonical_arrays(ctx.work).items()}
    if set(params) != set(expected_params) or any(params[k].shape != expected_params[k].shape for k in params):
        wrong = (sorted(set(params) ^ set(expected_params))
                 or [k for k in params if params[k].shape != expected_params[k].shape])
        raise ValueError(f"the minimal Flax ResNet and xbench's disagree at {wrong[:3]}")
    stats = {path: (np.zeros if path[-1] == "mean" else np.ones)(leaf.shape, np.float32)
             for path, leaf in flatten_dict(expected["batch_stats"]).items()}

    def loss_fn(params, batch_stats, images, labels):
        logits, updated = model.apply({"params": params, "batch_stats": batch_stats}, images, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean(), \
            updated["batch_stats"]

    run, count, last_loss = jax_training_loop(ctx, unflatten_dict(params), unflatten_dict(stats), loss_fn)
    return Loop(run, count, ("flax.linen ResNet v1.5, BatchNorm running averages updated as a mutable collection",),
                {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision}, last_loss)


def jax_mlp(ctx: LoopContext) -> Loop:
    """overhead.py's minimal jax loop (plain jnp MLP, dropout keys folded from one key)."""
    import overhead

    check_mlp_loop(ctx, overhead)
    run, count, readback = overhead.jax_minimal(ctx.work, ctx.batch, ctx.precision, ctx.device)
    return Loop(run, count, ("overhead.py's minimal jax loop",), readback)


def check_mlp_loop(ctx: LoopContext, overhead) -> None:
    if ctx.precision not in overhead.JAX_PRECISION:
        raise Unavailable(f"overhead.py's minimal MLP loops run in {', '.join(overhead.JAX_PRECISION)}, "
                          f"not {ctx.precision}")
    if ctx.learning_rate != overhead.LEARNING_RATE:
        raise ValueError(f"overhead.py's loops use learning rate {overhead.LEARNING_RATE}, not {ctx.learning_rate}")


# -- minimal loops: torch --------------------------------------------------------------------

# (cuda matmul allow_tf32, cudnn allow_tf32, float32 matmul precision), as xbench's torch backend sets them.
TORCH_PRECISION = {"fp32": (False, False, "highest"), "tf32": (True, True, "high"), "bf16": (False, False, "highest")}


def torch_set_precision(precision: str, cudnn_benchmark: bool) -> None:
    import torch

    matmul_tf32, cudnn_tf32, matmul_precision = TORCH_PRECISION[precision]
    torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    torch.set_float32_matmul_precision(matmul_precision)
    torch.backends.cudnn.benchmark = cudnn_benchmark


def torch_settings() -> dict[str, Any]:
    import torch

    return {"cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def torch_adam(params, learning_rate: float):
    """Adam with the fused kernel where torch has one for the device, else torch's default."""
    import torch

    from xbench.contract import ADAM

    params = list(params)
    kwargs = {"lr": learning_rate, "betas": (ADAM.b1, ADAM.b2), "eps": ADAM.eps}
    try:
        return torch.optim.Adam(params, fused=True, **kwargs), True
    except (RuntimeError, ValueError):
        return torch.optim.Adam(params, **kwargs), False


def torch_compile_unavailable(device) -> str | None:
    """Why torch.compile cannot run on `device` here, or None."""
    import importlib.util

    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return f"torch.compile does not support Python {sys.version.split()[0]} here"
    if device.type == "cuda":
        return None if importlib.util.find_spec("triton") else "torch.compile on CUDA needs Triton"
    return None if shutil.which(os.environ.get("CXX") or "g++") else "torch.compile on CPU needs a C++ compiler"


def torch_training_loop(ctx: LoopContext, model, forward) -> tuple[Callable[[int], None], bool, Callable]:
    """The loop an expert writes: `forward(x, y)` returns the loss (under autocast for
    bf16), backward, fused Adam, zero_grad(set_to_none=True); batch index a Python int.
    Returns run(steps), whether Adam is fused, and last_loss()."""
    import torch

    optimizer, fused = torch_adam(model.parameters(), ctx.learning_rate)
    autocast = (functools.partial(torch.autocast, ctx.device.type, dtype=torch.bfloat16)
                if ctx.precision == "bf16" else nullcontext)
    xs, ys = torch_data(ctx)
    batches, cuda = xs.shape[0], ctx.device.type == "cuda"
    counter, last = [0], [None]

    def run(steps: int) -> None:
        step = counter[0]
        for _ in range(steps):
            i = step % batches
            with autocast():
                loss = forward(xs[i], ys[i])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
        counter[0], last[0] = step, loss.detach()  # keeping the loss costs no sync
        if cuda:
            torch.cuda.synchronize(ctx.device)

    return run, fused, lambda: float(last[0])


def torch_data(ctx: LoopContext):
    """The core's data on the device, once: tokens and labels as int64; images NHWC as drawn,
    viewed as [batches, N, C, H, W], so that each batch is an NCHW tensor in channels-last
    memory (no copy)."""
    import torch

    xs, ys = (torch.from_numpy(a[0]).to(ctx.device) for a in ctx.work.shards(ctx.batch, 1))
    if xs.is_floating_point() and xs.dim() == 5:
        xs = xs.permute(0, 1, 4, 2, 3)
    elif not xs.is_floating_point():
        xs = xs.long()
    return xs, ys.long()


def torch_load(model, work, place: Callable[[str], tuple[str, Callable]]) -> int:
    """Copy the core's arrays into `model`: place(canonical name) -> (parameter name, layout
    conversion). Every parameter must be filled exactly once; returns the parameter count
    (a tied parameter counted once, as torch lists it)."""
    import torch

    params = dict(model.named_parameters())
    filled = set()
    with torch.no_grad():
        for param, array in zip(work.parameters, work.arrays):
            name, convert = place(param.name)
            tensor = convert(torch.from_numpy(array))
            if name not in params or name in filled or params[name].shape != tensor.shape:
                raise ValueError(f"the minimal model has no free slot of shape {tuple(tensor.shape)} for xbench's "
                                 f"{param.name} (tried {name})")
            params[name].copy_(tensor)
            filled.add(name)
    if set(params) != filled:
        raise ValueError(f"the minimal model has parameters xbench's lacks: {sorted(set(params) - filled)[:3]}")
    return sum(p.numel() for p in params.values())


def same(tensor):
    return tensor


def transpose(tensor):
    return tensor.T


def hwio_to_oihw(tensor):
    return tensor.permute(3, 2, 0, 1)


@functools.lru_cache(maxsize=None)
def torch_gpt_class():
    """nanoGPT's GPT, trimmed to what the benchmark needs: no dropout, SDPA, the head tied
    to the token embedding, and the loss inside forward (so torch.compile compiles it too)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class CausalSelfAttention(nn.Module):
        def __init__(self, width: int, heads: int) -> None:
            super().__init__()
            self.c_attn = nn.Linear(width, 3 * width)
            self.c_proj = nn.Linear(width, width)
            self.heads = heads

        def forward(self, x):
            batch, length, width = x.size()
            q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
                       for t in self.c_attn(x).split(width, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(batch, length, width))

    class MLP(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.c_fc = nn.Linear(width, 4 * width)
            self.c_proj = nn.Linear(4 * width, width)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, width: int, heads: int) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(width, eps=LAYER_NORM_EPSILON)
            self.attn = CausalSelfAttention(width, heads)
            self.ln_2 = nn.LayerNorm(width, eps=LAYER_NORM_EPSILON)
            self.mlp = MLP(width)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, layers: int, heads: int, width: int, context: int, vocab: int) -> None:
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(context, width)
            self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
            self.ln_f = nn.LayerNorm(width, eps=LAYER_NORM_EPSILON)
            self.lm_head = nn.Linear(width, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as GPT-2's

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    return GPT


GPT_BLOCK_NAMES = {"ln1.scale": ("ln_1.weight", same), "ln1.bias": ("ln_1.bias", same),
                   "attn.qkv.kernel": ("attn.c_attn.weight", transpose), "attn.qkv.bias": ("attn.c_attn.bias", same),
                   "attn.proj.kernel": ("attn.c_proj.weight", transpose), "attn.proj.bias": ("attn.c_proj.bias", same),
                   "ln2.scale": ("ln_2.weight", same), "ln2.bias": ("ln_2.bias", same),
                   "mlp.fc.kernel": ("mlp.c_fc.weight", transpose), "mlp.fc.bias": ("mlp.c_fc.bias", same),
                   "mlp.proj.kernel": ("mlp.c_proj.weight", transpose), "mlp.proj.bias": ("mlp.c_proj.bias", same)}


def gpt_place(name: str) -> tuple[str, Callable]:
    """The core's canonical name -> the nanoGPT-style module's parameter (nn.Linear holds
    kernels [out, in])."""
    if name in ("wte", "wpe"):
        return f"{name}.weight", same
    if name.startswith("lnf."):
        return "ln_f." + {"scale": "weight", "bias": "bias"}[name.split(".")[1]], same
    block, rest = name.split(".", 1)
    target, convert = GPT_BLOCK_NAMES[rest]
    return f"h.{block[1:]}.{target}", convert


def torch_sdpa_note(ctx: LoopContext, heads: int, head_width: int, context: int) -> str:
    """Which SDPA kernel torch's dispatcher picks for these shapes (a private function: the
    note says so where it is missing)."""
    import torch

    dtype = torch.bfloat16 if ctx.precision == "bf16" else torch.float32
    try:
        from torch.nn.attention import SDPBackend

        q = torch.zeros((1, heads, context, head_width), dtype=dtype, device=ctx.device, requires_grad=True)
        choice = SDPBackend(torch._fused_sdp_choice(q, q, q, None, 0.0, True)).name
    except Exception as err:
        choice = f"unknown ({type(err).__name__})"
    return f"attention: F.scaled_dot_product_attention(is_causal=True), {choice}"


def torch_gpt2(ctx: LoopContext, compiled: bool) -> Loop:
    import torch

    if compiled and (reason := torch_compile_unavailable(ctx.device)):
        raise Unavailable(reason)
    torch_set_precision(ctx.precision, cudnn_benchmark=False)
    dims = ctx.work.model.shape
    with torch.device(ctx.device):
        model = torch_gpt_class()(dims["layers"], dims["heads"], dims["width"], dims["context"], dims["vocab"])
    count = torch_load(model, ctx.work, gpt_place)
    model.train()
    forward = torch.compile(model) if compiled else model
    run, fused, last_loss = torch_training_loop(ctx, model, forward)
    notes = (torch_sdpa_note(ctx, dims["heads"], dims["width"] // dims["heads"], dims["context"]),
             f"torch.optim.Adam(fused={fused})", "torch.compile(model), loss inside forward" if compiled else "eager")
    return Loop(run, count, notes, torch_settings(), last_loss)


@functools.lru_cache(maxsize=None)
def torch_resnet_class():
    """torchvision's ResNet v1.5, compacted: stride on the 3x3 convolution, projection
    shortcut (downsample) where the shape changes, the loss inside forward."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def norm(channels: int):
        return nn.BatchNorm2d(channels, eps=BATCH_NORM_EPSILON, momentum=BATCH_NORM_MOMENTUM)

    def shortcut(inputs: int, outputs: int, stride: int):
        if stride == 1 and inputs == outputs:
            return None
        return nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), norm(outputs))

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inputs: int, width: int, stride: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(inputs, width, 1, bias=False), norm(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), norm(width)
            self.conv3, self.bn3 = nn.Conv2d(width, 4 * width, 1, bias=False), norm(4 * width)
            self.downsample = shortcut(inputs, 4 * width, stride)

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = F.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return F.relu(y + (x if self.downsample is None else self.downsample(x)))

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inputs: int, width: int, stride: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(inputs, width, 3, stride, 1, bias=False), norm(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, 1, 1, bias=False), norm(width)
            self.downsample = shortcut(inputs, width, stride)

        def forward(self, x):
            y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(y + (x if self.downsample is None else self.downsample(x)))

    class ResNet(nn.Module):
        def __init__(self, depth: int, classes: int, channels: int) -> None:
            super().__init__()
            block = Bottleneck if depth >= 50 else BasicBlock
            self.conv1, self.bn1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False), norm(64)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inputs, stages = 64, []
            for stage, (width, blocks) in enumerate(zip(RESNET_WIDTHS, RESNET_STAGES[depth])):
                layer = []
                for b in range(blocks):
                    layer.append(block(inputs, width, 2 if stage and not b else 1))
                    inputs = width * block.expansion
                stages.append(nn.Sequential(*layer))
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.fc = nn.Linear(inputs, classes)

        def forward(self, images, labels):
            x = self.maxpool(F.relu(self.bn1(self.conv1(images))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
            return F.cross_entropy(logits.float(), labels)

    return ResNet


def resnet_place(name: str) -> tuple[str, Callable]:
    """The core's canonical name -> the torchvision-style module's parameter: kernels HWIO
    -> OIHW, the head's [in, out] -> nn.Linear's [out, in]."""
    parts = name.split(".")
    leaf = {"kernel": "weight", "scale": "weight", "bias": "bias"}[parts[-1]]
    if parts[0] == "head":
        return f"fc.{leaf}", transpose if leaf == "weight" else same
    convert = hwio_to_oihw if parts[-1] == "kernel" else same
    if parts[0] == "stem":
        return {"conv": "conv1", "bn": "bn1"}[parts[1]] + f".{leaf}", convert
    role = ".".join(parts[2:-1])
    role = {"down.conv": "downsample.0", "down.bn": "downsample.1"}.get(role, role)
    return f"layer{int(parts[0][1:]) + 1}.{int(parts[1][1:])}.{role}.{leaf}", convert


def torch_resnet(ctx: LoopContext, compiled: bool) -> Loop:
    import torch

    if compiled and (reason := torch_compile_unavailable(ctx.device)):
        raise Unavailable(reason)
    torch_set_precision(ctx.precision, cudnn_benchmark=True)
    dims = ctx.work.model.shape
    with torch.device(ctx.device):
        model = torch_resnet_class()(dims["depth"], dims["classes"], dims["channels"])
    count = torch_load(model, ctx.work, resnet_place)
    model.to(memory_format=torch.channels_last).train()
    forward = torch.compile(model) if compiled else model
    run, fused, last_loss = torch_training_loop(ctx, model, forward)
    notes = ("channels-last, cudnn.benchmark on", f"torch.optim.Adam(fused={fused})",
             "torch.compile(model), loss inside forward" if compiled else "eager")
    return Loop(run, count, notes, torch_settings(), last_loss)


def torch_mlp(ctx: LoopContext) -> Loop:
    """overhead.py's minimal torch loop (eager nn.Sequential, fused Adam)."""
    import overhead

    check_mlp_loop(ctx, overhead)
    run, count, readback = overhead.torch_minimal(ctx.work, ctx.batch, ctx.precision, ctx.device)
    return Loop(run, count, ("overhead.py's minimal torch loop",), readback)


# -- the lineups: one line a program ---------------------------------------------------------

JAX_XBENCH = (
    XbenchProgram("as-written"),
    XbenchProgram("jnp"),
    XbenchProgram("functional"),
    XbenchProgram("cudnn", families=("transformer",)),
    # 50 steps per call: it matters where steps are short; a GPT-2 window would last 2-4 s.
    XbenchProgram("fused", families=("mlp",)),
)
TORCH_XBENCH = (
    XbenchProgram("as-written", compiles=False),
    XbenchProgram("compile", slow_on_cpu=True),
    # CUDA graphs hold a private memory pool of a whole step's activations; they pay off
    # where launches dominate (the MLPs), not at 40-100 ms steps.
    XbenchProgram("cuda-graphs", families=("mlp",), slow_on_cpu=True),
    XbenchProgram("channels-last", families=("cnn",), compiles=False),
)
# Per family, the first minimal loop that runs is the reference: the expert's fastest first.
JAX_MINIMAL = (
    MinimalProgram("minimal jax+cudnn", "transformer", functools.partial(jax_gpt2, attention="cudnn"), gpu_only=True),
    MinimalProgram("minimal jax", "transformer", functools.partial(jax_gpt2, attention=None)),
    MinimalProgram("minimal jax (flax)", "cnn", jax_resnet),
    MinimalProgram("minimal jax", "mlp", jax_mlp),
)
TORCH_MINIMAL = (
    MinimalProgram("minimal torch+compile", "transformer", functools.partial(torch_gpt2, compiled=True),
                   slow_on_cpu=True),
    MinimalProgram("minimal torch", "transformer", functools.partial(torch_gpt2, compiled=False), compiles=False),
    MinimalProgram("minimal torch+compile+channels-last", "cnn", functools.partial(torch_resnet, compiled=True),
                   slow_on_cpu=True),
    MinimalProgram("minimal torch+channels-last", "cnn", functools.partial(torch_resnet, compiled=False),
                   compiles=False),
    MinimalProgram("minimal torch", "mlp", torch_mlp, compiles=False),
)
LINEUPS = {"jax": (JAX_XBENCH, JAX_MINIMAL), "torch": (TORCH_XBENCH, TORCH_MINIMAL)}
DATA_PARALLEL_PROGRAM = XbenchProgram("as-written", program="data-parallel")  # --dp


@dataclass
class Entry:
    """A program of one configuration's lineup, and why it is left out (None: it runs)."""

    name: str
    kind: str  # "xbench" or "minimal"
    spec: XbenchProgram | MinimalProgram
    skip: str | None = None


def lineup(framework: str, family: str, platform: str, options: dict[str, Any]) -> list[Entry]:
    """The programs of `framework` for `family`: minimal loops first (the reference first),
    then xbench's; --programs patterns select (the reference always runs), and on a CPU the
    torch.compile programs are left out unless --programs names them."""
    xbench_programs, minimal_programs = LINEUPS[framework]
    patterns = options.get("programs") or []
    entries = [Entry(p.name, "minimal", p) for p in minimal_programs if p.family == family]
    extra = (DATA_PARALLEL_PROGRAM,) if options.get("dp") else ()
    entries += [Entry(p.name(framework), "xbench", p) for p in (*xbench_programs, *extra)
                if patterns or p.families is None or family in p.families]
    for i, entry in enumerate(entries):
        reference_candidate = entry.kind == "minimal" and not any(e.kind == "minimal" and not e.skip
                                                                   for e in entries[:i])
        if platform == "cpu" and getattr(entry.spec, "gpu_only", False):
            entry.skip = "needs an NVIDIA GPU"
        elif patterns and not selected(entry.name, patterns) and not reference_candidate:
            entry.skip = "not selected (--programs)"
        elif platform == "cpu" and entry.spec.slow_on_cpu and not (patterns and selected(entry.name, patterns)):
            entry.skip = "torch.compile takes minutes on a CPU; name it in --programs to time it"
    return entries


def selected(name: str, patterns: list[str]) -> bool:
    """A pattern selects a name it matches (fnmatch), or, without wildcards, one containing it."""
    name = name.lower()
    for pattern in (p.lower() for p in patterns):
        if fnmatch.fnmatchcase(name, pattern) or (not any(c in pattern for c in "*?[") and pattern in name):
            return True
    return False


# -- a child: one framework, one model group -------------------------------------------------

@dataclass
class Side:
    """The framework side of a child: its backend, set up on one device, and the means to
    snapshot and restore the settings that are global to the process."""

    framework: str
    backend: Any
    device: Any
    platform: str
    device_name: str
    version: str
    details: dict[str, Any]
    snapshot: Callable[[], Callable[[], None]]  # the global settings now -> what puts them back
    free_memory: Callable[[], None]  # after a program failed: what it held
    between_configurations: Callable[[], None]
    teardown: Callable[[], None] = lambda: None
    fresh_compiler: Callable[[], None] = lambda: None  # before a compiling program's first call
    pristine: Callable[[], None] = lambda: None  # the settings as the process started

    def __post_init__(self) -> None:
        self.pristine = self.snapshot()


def jax_side(platform: str) -> Side:
    from importlib import metadata

    from xbench_backends.jax.pmap import JaxPmapBackend

    backend = JaxPmapBackend()
    info = backend.setup(1, platform)
    import jax

    def snapshot() -> Callable[[], None]:
        value = jax.config.jax_default_matmul_precision
        return lambda: jax.config.update("jax_default_matmul_precision", value)

    device = backend.devices[0]
    details = {**info.details, "jax": jax.__version__}
    for package in ("jaxlib", "flax", "optax", "jax-cuda13-plugin", "jax-cuda12-plugin"):
        try:
            details[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    def between_configurations() -> None:
        jax.clear_caches()  # the previous configuration's compiled programs (never mid-configuration)
        gc.collect()

    return Side("jax", backend, device, device.platform, device.device_kind, jax.__version__, details, snapshot,
                free_memory=gc.collect, between_configurations=between_configurations)


def torch_side(platform: str) -> Side:
    import torch

    from xbench.run.environment import cpu_name
    from xbench_backends.torch.ddp import TorchDdpBackend

    backend = TorchDdpBackend()
    info = backend.setup(1, platform)
    device = backend.device
    gpu = device.type == "cuda"

    def snapshot() -> Callable[[], None]:
        flags = torch_settings()

        def restore() -> None:
            torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
            torch.backends.cudnn.allow_tf32 = flags["cudnn_allow_tf32"]
            torch.backends.cuda.matmul.allow_tf32 = flags["cuda_matmul_allow_tf32"]
            torch.set_float32_matmul_precision(flags["float32_matmul_precision"])

        return restore

    def free_memory() -> None:
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()

    caches = tempfile.mkdtemp(prefix="expert-loops-inductor-")
    atexit.register(shutil.rmtree, caches, ignore_errors=True)

    def fresh_compiler() -> None:
        """A private, empty inductor cache for each compiled program's first call (set when it
        runs, not when it is built), so that none reuses the kernels another compiled and its
        first call is what a fresh process pays (but for importing the compiler)."""
        from torch._inductor.utils import clear_caches

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(dir=caches)
        clear_caches()  # inductor's in-memory caches; compiled programs keep what they loaded

    details = dict(info.details)
    try:
        import triton

        details["triton"] = triton.__version__
    except ImportError:
        pass
    return Side("torch", backend, device, "gpu" if gpu else "cpu",
                torch.cuda.get_device_name(device) if gpu else cpu_name(), torch.__version__, details, snapshot,
                free_memory, free_memory, backend.teardown, fresh_compiler)


def emit(record: dict[str, Any]) -> None:
    print(MARK + json.dumps(record), flush=True)


def progress(text: str) -> None:
    emit({"kind": "progress", "text": text})


def child(payload: dict[str, Any]) -> int:
    from xbench.contract import DeviceUnavailable

    options = payload["options"]
    try:
        side = (jax_side if payload["framework"] == "jax" else torch_side)(options["platform"])
    except DeviceUnavailable as err:
        print(f"{payload['framework']}: {err}", file=sys.stderr)
        return 1
    emit({"kind": "header", "framework": side.framework, "version": side.version, "platform": side.platform,
          "device": side.device_name, "details": side.details})
    for raw in payload["configs"]:
        config = Config(**raw)
        try:
            time_configuration(side, config, payload["group"], options)
        except Exception as err:  # a configuration that cannot even be set up must not stop the next
            emit({"kind": "error", "framework": side.framework, "config": asdict(config), "label": config.label,
                  "error": describe(err)})
        side.between_configurations()
    side.teardown()
    return 0


def time_configuration(side: Side, config: Config, group: str, options: dict[str, Any]) -> None:
    """Build every program of the configuration, warm each up, race them, emit the result."""
    from xbench.contract.work import build_work, data_samples
    from xbench.results.peaks import peak_for

    started = time.monotonic()
    model = config.model()
    samples = data_samples(model, options.get("samples") or default_samples(model.family, config.batch), config.batch)
    work = build_work(model, samples, SEED)
    learning_rate = LEARNING_RATE.get(model.family, DEFAULT_LEARNING_RATE)
    context = LoopContext(work, config.batch, config.precision, learning_rate, side.device, side.platform)
    where = f"{side.framework} {config.label} {config.precision}"
    entries = lineup(side.framework, model.family, side.platform, options)
    records = {e.name: {"name": e.name, "kind": e.kind, "status": "skipped", "reason": e.skip} for e in entries}

    runners = build_programs(side, entries, records, config, context, samples, options)
    alive = warm_up_all(side, model.family, warm_up_order(entries, runners), records, options, where)
    alive = [runner for runner in alive if calibrated(runner, records, options)]
    if alive:
        progress(f"{where}: timing {len(alive)} programs, {options['rounds']} rounds of ~{options['window_s']:g} s")
        race(alive, options["rounds"])
    reference = next((e.name for e in entries if e.kind == "minimal" and any(r.name == e.name for r in alive)), None)
    peak = peak_for(side.device_name, config.precision)
    units_per_step = config.batch * model.units_per_sample
    for runner in alive:
        records[runner.name].update(figures(runner, runners.get(reference), units_per_step,
                                           model.training_flops_per_sample * config.batch, peak))
        if runner.last_loss is not None and runner.error is None:  # a sanity figure, read after the windows
            records[runner.name]["last_loss"] = runner.last_loss()
    emit({"kind": "result", "framework": side.framework, "group": group, "config": asdict(config),
          "label": config.label, "precision": config.precision, "family": model.family, "unit": model.unit,
          "units_per_step": units_per_step, "flops_per_sample": model.training_flops_per_sample,
          "params_core": work.params, "samples": samples, "learning_rate": learning_rate,
          "device": side.device_name, "platform": side.platform,
          "peak": None if peak is None else asdict(peak), "reference": reference, "rounds": options["rounds"],
          "window_s": options["window_s"], "programs": [records[e.name] for e in entries],
          "wall_s": time.monotonic() - started})


def build_programs(side: Side, entries: list[Entry], records: dict[str, dict], config: Config,
                   context: LoopContext, samples: int, options: dict[str, Any]) -> dict[str, Runner]:
    """Every program that is not skipped, built before any runs: xbench's torch prepare
    resets torch.compile's caches, which would throw away a program compiled before it. A
    program that cannot be built is recorded (unsupported, unknown, error) and left out."""
    runners: dict[str, Runner] = {}
    for entry in (e for e in entries if not e.skip):
        side.pristine()  # each program starts from the process's own settings, as in a process of its own
        try:
            runner, facts = (build_xbench(side, entry, config, context.work, context.learning_rate, samples, options)
                             if entry.kind == "xbench" else build_minimal(side, entry, context, options))
        except Exception as err:
            records[entry.name].update(status=failure_status(entry, err), reason=describe(err))
            side.free_memory()
            continue
        runners[entry.name] = runner
        records[entry.name].update(status="built", reason=None, **facts)
    return runners


def warm_up_order(entries: list[Entry], runners: dict[str, Runner]) -> list[Runner]:
    """The reference candidate (the first minimal loop built) first, so that a deadline never
    leaves the others without it; then xbench's programs; then the other minimal loops."""
    minimal = [e.name for e in entries if e.kind == "minimal" and e.name in runners]
    xbench = [e.name for e in entries if e.kind == "xbench" and e.name in runners]
    return [runners[name] for name in (*minimal[:1], *xbench, *minimal[1:])]


def calibrated(runner: Runner, records: dict[str, dict], options: dict[str, Any]) -> bool:
    try:
        calibrate(runner, options["window_s"])
        return True
    except Exception as err:
        records[runner.name].update(status="error", reason=describe(err))
        return False


def failure_status(entry: Entry, err: Exception) -> str:
    """"unsupported" (it cannot run here), "unknown" (the backend has no such variant, yet),
    or "error"."""
    from xbench.contract import Unsupported

    if isinstance(err, (Unsupported, Unavailable)):
        return "unsupported"
    if entry.kind == "xbench" and isinstance(err, ValueError) and "variant" in str(err):
        return "unknown"
    return "error"


def build_xbench(side: Side, entry: Entry, config: Config, work, learning_rate: float, samples: int,
                 options: dict[str, Any]) -> tuple[Runner, dict[str, Any]]:
    """xbench's program through its backend, as the core prepares it (protocol of the variant)."""
    from xbench.contract import Trial, variants_of
    from xbench.contract.timing import TimingProtocol
    from xbench.run.plan import AS_WRITTEN_VARIANT, variant_protocol

    spec = entry.spec
    variant = variants_of(side.backend).get(spec.variant, AS_WRITTEN_VARIANT)
    protocol = variant_protocol(TimingProtocol(warmup_steps=options["warmup"]), variant)
    trial = Trial(backend=side.backend.name, model=work.model, devices=1, global_batch=config.batch,
                  scaling="strong", precision=config.precision, platform=options["platform"],
                  learning_rate=learning_rate, seed=SEED, samples=samples, protocol=protocol,
                  program=spec.program, variant=spec.variant)
    prepared = side.backend.prepare(trial, work)
    runner = Runner(entry.name, lambda steps: side.backend.run(prepared, steps), protocol.steps_per_call,
                    protocol.warmup_steps, side.snapshot())
    info = prepared.info
    return runner, {"params": info.params, "weights_match": info.weights_hash == work.weights_hash,
                    "precision_readback": info.precision, "settings": info.settings, "notes": list(info.notes),
                    "compiles": spec.compiles}


def build_minimal(side: Side, entry: Entry, context: LoopContext,
                  options: dict[str, Any]) -> tuple[Runner, dict[str, Any]]:
    loop = entry.spec.build(context)
    runner = Runner(entry.name, loop.run, 1, options["warmup"], side.snapshot(), loop.last_loss)
    return runner, {"params": loop.params, "precision_readback": loop.settings, "notes": list(loop.notes),
                    "compiles": entry.spec.compiles}


def warm_up_all(side: Side, family: str, runners: list[Runner], records: dict[str, dict], options: dict[str, Any],
                where: str) -> list[Runner]:
    """Each runner's first call and warm-up, in order (the reference first); those that fail
    are recorded and dropped, those that would not fit before the deadline skipped."""
    alive = []
    for n, runner in enumerate(runners):
        record = records[runner.name]
        if (reason := past_deadline(family, record.get("compiles", True), len(runners) + 1, options)) is not None:
            record.update(status="skipped", reason=reason)
            continue
        progress(f"{where}: first call of {runner.name} ({n + 1}/{len(runners)})")
        try:
            if record.get("compiles", True):
                side.fresh_compiler()
            warm_up(runner)
        except Exception as err:
            record.update(status="error", reason=describe(err))
            side.free_memory()
            continue
        record["first_call_s"] = runner.first_call_s
        progress(f"{where}: {runner.name}: first call {runner.first_call_s:.1f} s")
        alive.append(runner)
    return alive


def past_deadline(family: str, compiles: bool, programs: int, options: dict[str, Any]) -> str | None:
    """Why a program must be skipped to finish before the deadline, or None."""
    deadline = options.get("deadline")
    if deadline is None:
        return None
    first_call = FIRST_CALL_ESTIMATE_S.get(family, 60.0) if compiles else EAGER_FIRST_CALL_ESTIMATE_S
    timing = programs * (options["rounds"] + 2) * options["window_s"]
    left = deadline - time.time()
    if left >= first_call + timing + 10:
        return None
    return f"past the deadline: {left:.0f} s left, its first call and the timing need about {first_call + timing:.0f} s"


def figures(runner: Runner, reference: Runner | None, units_per_step: int, flops_per_step: int, peak) -> dict[str, Any]:
    """A timed runner's figures: ms/step, throughput, MFU, and its ratio to the reference."""
    per_step = runner.per_step_s
    if not per_step:
        return {"status": "error", "reason": runner.error or "no window timed"}
    ms = statistics.median(per_step) * 1e3
    mfu = None if peak is None else flops_per_step / (ms / 1e3) / peak.flops
    mfu_interval = None
    if peak is not None:
        low, high, _ = median_interval([flops_per_step / s / peak.flops for s in per_step])
        mfu_interval = [low, high]
    ratio = None if reference is None or reference.error else paired_ratio(reference.per_step_s, per_step)
    return {"status": "error" if runner.error else "timed", "reason": runner.error,
            "steps_per_call": runner.steps_per_call, "steps_per_window": runner.steps_per_window,
            "per_step_s": per_step, "ms": ms, "throughput": units_per_step / (ms / 1e3), "mfu": mfu,
            "mfu_interval": mfu_interval, "ratio": ratio}


# -- the parent ------------------------------------------------------------------------------

def run_child(framework: str, group: str, configs: tuple[Config, ...], options: dict[str, Any],
              started: float) -> tuple[list[dict], int, str]:
    """One child process; its records, exit status and stderr. Progress is printed as it comes."""
    payload = {"framework": framework, "group": group, "configs": [asdict(c) for c in configs], "options": options}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(payload)]

    def show(record: dict) -> None:
        stamp = f"[{time.monotonic() - started:4.0f} s]"
        if record["kind"] == "progress":
            print(f"{stamp} {record['text']}", flush=True)
        elif record["kind"] == "header":
            print(f"{stamp} {framework} {record['version']} on {record['platform']}: {record['device']}", flush=True)
        elif record["kind"] == "result":
            print(f"{stamp} {framework} {record['label']} {record['precision']}: {summary_line(record)}", flush=True)
        elif record["kind"] == "error":
            print(f"{stamp} {framework} {record['label']}: failed: {record['error']}", flush=True)

    records, code, stderr = child_records(command, MARK, show)
    return [r for r in records if r["kind"] != "progress"], code, stderr


def summary_line(result: dict[str, Any]) -> str:
    timed = [p for p in result["programs"] if p["status"] == "timed"]
    others = len(result["programs"]) - len(timed)
    best = max((p for p in timed if p["kind"] == "xbench"), key=lambda p: p["throughput"], default=None)
    text = f"{len(timed)} programs timed ({others} not)"
    if best and best.get("ratio"):
        text += f"; best xbench {best['name']} = {best['ratio']['median']:.3f} x {result['reference']}"
    return text


def number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def print_configuration(result: dict[str, Any]) -> None:
    unit = result["unit"]
    peak = result["peak"]
    peak_text = (f"peak {peak['flops'] / 1e12:g} TFLOP/s ({peak['device']} {result['precision']})" if peak
                 else "no peak known (MFU unknown)")
    per_unit = result["flops_per_sample"] * result["config"]["batch"] / result["units_per_step"]
    print(f"\n{result['framework']} {result['label']} {result['precision']} on {result['device']}: "
          f"{result['units_per_step']:,} {unit}/step, {per_unit / 1e6:,.1f} MFLOP/{unit.rstrip('s')}, {peak_text}")
    print(f"  params (core) {result['params_core']:,}; reference: {result['reference'] or 'none ran'}; "
          f"{result['rounds']} rounds of ~{result['window_s']:g} s windows")
    print(f"  {'program':36s} {'params':>12s} {'ms/step':>9s} {unit + '/s':>12s} {'MFU':>6s} {'1st call':>8s}  "
          f"{'x reference [CI]':22s}")
    coverages = set()
    for p in result["programs"]:
        if p["status"] not in ("timed", "error") or "ms" not in p:
            why = p.get("reason") or ""
            print(f"  {p['name']:36s} {p['status']}: {why[:110]}")
            continue
        params = f"{p['params']:,}" + ("" if p["params"] == result["params_core"] else "!")
        mfu = "unknown" if p["mfu"] is None else f"{p['mfu']:.1%}"
        if p["name"] == result["reference"]:
            ratio = "reference"
        elif p.get("ratio"):
            r = p["ratio"]
            coverages.add(r["coverage"])
            ratio = f"{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
        else:
            ratio = "-"
        print(f"  {p['name']:36s} {params:>12s} {p['ms']:9.3f} {number(p['throughput']):>12s} {mfu:>6s} "
              f"{p.get('first_call_s', float('nan')):7.1f}s  {ratio}"
              + (f"  (failed later: {p['reason'][:60]})" if p["status"] == "error" else ""))
    for coverage in sorted(coverages):
        print(f"  [CI]: order-statistic interval of the per-round throughput ratios' median, coverage {coverage:.1%}"
              + (" (too few rounds for 95 %)" if coverage < 0.95 else ""))
    mismatched = [p["name"] for p in result["programs"] if "params" in p and p["params"] != result["params_core"]]
    if mismatched:
        print(f"  ! parameter count differs from the core's: {', '.join(mismatched)}")
    other_weights = [p["name"] for p in result["programs"] if p.get("weights_match") is False]
    if other_weights:
        print(f"  ! initial weights read back differ from the core's (hash): {', '.join(other_weights)}")


# -- acceptance ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """One acceptance check: a candidate's throughput over a reference's in one configuration
    (paired per-round ratio), or the best program's MFU."""

    title: str
    config: Config
    framework: str | None  # None: over every framework (the MFU check)
    candidate: str  # "best xbench" or a program's name
    reference: str | None = None  # a minimal loop's name, "fastest minimal", or None (MFU)
    target: float = TARGET_RATIO


CHECKS = (
    Check("GPT-2 small", MODEL_GROUPS["gpt2-small"][0], "jax", "best xbench", "minimal jax+cudnn"),
    Check("GPT-2 small", MODEL_GROUPS["gpt2-small"][0], "torch", "torch plain+compile", "minimal torch+compile"),
    Check("GPT-2 small", MODEL_GROUPS["gpt2-small"][0], None, "best xbench", None, TARGET_MFU),
    Check("ResNet-50", MODEL_GROUPS["resnet50"][0], "torch", "best xbench", "fastest minimal"),
    Check("ResNet-50", MODEL_GROUPS["resnet50"][0], "jax", "best xbench", "fastest minimal"),
)


def evaluate(check: Check, results: list[dict[str, Any]], requested: set[tuple[Config, str]],
             gpu: bool) -> dict[str, Any] | None:
    """The check's verdict; None when this invocation did not ask for its configuration and
    framework. Asked for but not measured (a child failed, the deadline): it misses on a GPU."""
    frameworks = {check.framework} if check.framework else {"jax", "torch"}
    if not any((check.config, framework) in requested for framework in frameworks):
        return None
    matching = [r for r in results if Config(**r["config"]) == check.config and r["framework"] in frameworks]
    if not matching:
        return {"verdict": "misses" if gpu else "n/a", "text": "not measured (see the children's output)"}
    if any(r["platform"] != "gpu" for r in matching):
        return {"verdict": "n/a", "text": "n/a on a CPU (the targets apply on a GPU)"}
    programs = [(r, p) for r in matching for p in r["programs"] if p["status"] == "timed"]
    if check.reference is None:
        return evaluate_mfu(check, programs)
    result = matching[0]
    by_name = {p["name"]: p for _, p in programs}
    candidate = (max((p for _, p in programs if p["kind"] == "xbench"), key=lambda p: p["throughput"], default=None)
                 if check.candidate == "best xbench" else by_name.get(check.candidate))
    reference = (max((p for _, p in programs if p["kind"] == "minimal"), key=lambda p: p["throughput"], default=None)
                 if check.reference == "fastest minimal" else by_name.get(check.reference))
    missing = [what for what, p in ((check.candidate, candidate), (check.reference, reference)) if p is None]
    if missing:
        why = "; ".join(f"{name}: {status_of(result, name)}" for name in missing)
        return {"verdict": "misses", "text": f"cannot measure ({why})"}
    ratio = paired_ratio(reference["per_step_s"], candidate["per_step_s"])
    label = candidate["name"] if check.candidate == candidate["name"] else f"{check.candidate} ({candidate['name']})"
    ref_label = reference["name"] if check.reference == reference["name"] else \
        f"{check.reference} ({reference['name']})"
    return verdict(f"{label} / {ref_label}", ratio, check.target, "{:.3f}")


def evaluate_mfu(check: Check, programs: list[tuple[dict, dict]]) -> dict[str, Any]:
    xbench = [(r, p) for r, p in programs if p["kind"] == "xbench"]
    if not xbench:
        return {"verdict": "misses", "text": "cannot measure (no xbench program was timed)"}
    result, best = max(xbench, key=lambda rp: rp[1]["mfu"] if rp[1]["mfu"] is not None else -1)
    if best["mfu"] is None:
        return {"verdict": "misses", "text": f"cannot measure (no peak known for {result['device']})"}
    low, high = best["mfu_interval"]
    return verdict(f"MFU of the best xbench program ({best['name']})",
                   {"median": best["mfu"], "low": low, "high": high}, check.target, "{:.1%}")


def status_of(result: dict[str, Any], name: str) -> str:
    if name in ("best xbench", "fastest minimal"):
        return "none was timed"
    found = next((p for p in result["programs"] if p["name"] == name), None)
    if found is None:
        return "not in the lineup"
    return f"{found['status']}" + (f": {found['reason'][:120]}" if found.get("reason") else "")


def verdict(what: str, ratio: dict[str, float], target: float, fmt: str) -> dict[str, Any]:
    meets = ratio["median"] >= target
    unsure = "~" if ratio["low"] <= target <= ratio["high"] else ""
    text = (f"{what} = {fmt.format(ratio['median'])} [{fmt.format(ratio['low'])}, {fmt.format(ratio['high'])}] "
            f">= {fmt.format(target)}: {'meets' if meets else 'misses'}{unsure}")
    return {"verdict": "meets" if meets else "misses", "unsure": bool(unsure), "value": ratio, "text": text}


def describe_check(check: Check) -> str:
    config = check.config
    where = f" ({check.framework})" if check.framework else ""
    return f"{check.title} {config.precision} @ {config.batch}{where}"


# -- main ------------------------------------------------------------------------------------

def gpu_expected(platform: str) -> bool:
    """Whether the children will find a GPU (judged without importing a framework)."""
    from xbench.run.environment import nvidia_gpus

    return platform == "gpu" or (platform == "auto" and bool(nvidia_gpus()))


def print_lineups() -> None:
    for framework, (xbench_programs, minimal_programs) in LINEUPS.items():
        print(f"{framework}:")
        for family in ("transformer", "cnn", "mlp"):
            names = [p.name for p in minimal_programs if p.family == family]
            names += [p.name(framework) + ("" if p.families is None or family in p.families else " (--programs)")
                      for p in xbench_programs]
            print(f"  {family}: {'; '.join(names)}")
    print(f"--dp adds {DATA_PARALLEL_PROGRAM.name('jax')!r} / {DATA_PARALLEL_PROGRAM.name('torch')!r}; models: "
          f"{', '.join(MODEL_GROUPS)} or PRESET:BATCH")


def write_json(path: Path | None, document: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1), encoding="utf-8")


def parent(args) -> int:
    from xbench.run.environment import host_environment

    started = time.monotonic()
    gpu = gpu_expected(args.platform)
    groups = [parse_model(m) for m in (args.models or (GPU_MODELS if gpu and not args.quick else CPU_MODELS))]
    groups = [(name, tuple(overridden(c, args.precision, args.image) for c in configs)) for name, configs in groups]
    options = {"platform": args.platform, "rounds": args.rounds, "window_s": args.window_s, "warmup": args.warmup,
               "samples": args.samples, "programs": args.programs, "dp": args.dp,
               "deadline": time.time() + args.deadline_s if args.deadline_s else None}
    print(f"expert loops: xbench's programs against minimal loops; models {', '.join(n for n, _ in groups)}; "
          f"frameworks {', '.join(args.frameworks)}; {args.rounds} rounds of ~{args.window_s:g} s windows"
          + (f"; deadline in {args.deadline_s:g} s" if args.deadline_s else ""), flush=True)
    document: dict[str, Any] = {"benchmark": "expert_loops", "arguments": {k: str(v) if isinstance(v, Path) else v
                                                                           for k, v in vars(args).items()},
                                "environment": host_environment(), "children": [], "results": [], "errors": []}
    failed = False
    for group, configs in groups:
        for framework in args.frameworks:
            if options["deadline"] and options["deadline"] - time.time() < CHILD_START_S:
                print(f"{framework} {group}: not started, too close to the deadline", flush=True)
                document["children"].append({"framework": framework, "group": group, "skipped": "deadline"})
                continue
            records, code, stderr = run_child(framework, group, configs, options, started)
            header = next((r for r in records if r["kind"] == "header"), None)
            document["children"].append({"framework": framework, "group": group, "exit_code": code,
                                         "header": header, "stderr_tail": stderr[-4000:]})
            document["results"] += [r for r in records if r["kind"] == "result"]
            document["errors"] += [r for r in records if r["kind"] == "error"]
            if code != 0 or header is None or any(r["kind"] == "error" for r in records):
                failed = True
                print(f"{framework} {group}: the child exited with status {code}; its stderr ends:\n"
                      f"{stderr[-3000:].rstrip()}", file=sys.stderr, flush=True)
            write_json(args.out, document)

    for result in document["results"]:
        print_configuration(result)
    requested = {(config, framework) for _, configs in groups for config in configs for framework in args.frameworks}
    ok = print_checks(document, requested, gpu)
    wall = time.monotonic() - started
    document["wall_s"] = wall
    print(f"wall: {wall:.0f} s")
    write_json(args.out, document)
    if args.out:
        print(f"results: {args.out}")
    return 0 if ok and not failed else 1


def print_checks(document: dict[str, Any], requested: set[tuple[Config, str]], gpu: bool) -> bool:
    """The acceptance lines; True when every check that applies here meets."""
    print("\nacceptance:")
    ok, any_shown = True, False
    document["checks"] = []
    for check in CHECKS:
        outcome = evaluate(check, document["results"], requested, gpu)
        if outcome is None:
            continue
        any_shown = True
        print(f"  {describe_check(check)}: {outcome['text']}")
        document["checks"].append({"check": asdict(check), **outcome})
        ok &= outcome["verdict"] in ("meets", "n/a")
    if not any_shown:
        print("  none applies: they need gpt2-small@16 and resnet50@256 (224 px) in bf16")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=None, metavar="MODEL",
                        help=f"groups ({', '.join(MODEL_GROUPS)}) or PRESET:BATCH; default {' '.join(GPU_MODELS)} "
                             f"on a GPU, {' '.join(CPU_MODELS)} on a CPU")
    parser.add_argument("--frameworks", nargs="+", choices=tuple(LINEUPS), default=list(LINEUPS))
    parser.add_argument("--programs", nargs="+", default=None, metavar="PATTERN",
                        help="time only programs whose names match (fnmatch, or a substring: 'cudnn', "
                             "'jax plain*'); the reference minimal loop always runs; see --list")
    parser.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default=None,
                        help="override every configuration's precision (the checks then do not apply)")
    parser.add_argument("--image", type=int, default=None, help="CNN image size, e.g. 32 for a CPU")
    parser.add_argument("--platform", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"interleaved windows per program (default {ROUNDS}; --quick {QUICK_ROUNDS})")
    parser.add_argument("--window-s", type=float, default=None,
                        help=f"seconds per window, about (default {WINDOW_S:g}; --quick {QUICK_WINDOW_S:g})")
    parser.add_argument("--warmup", type=int, default=None,
                        help=f"untimed steps after the first call (default {WARMUP}; --quick {QUICK_WARMUP})")
    parser.add_argument("--samples", type=int, default=None,
                        help="rows of data (default: 512, the MLPs 4096; at least two global batches)")
    parser.add_argument("--dp", action="store_true", help="also xbench's data-parallel program on one device")
    parser.add_argument("--deadline-s", type=float, default=DEFAULT_DEADLINE_S,
                        help=f"skip what would end later than this after the start (default {DEFAULT_DEADLINE_S:g}; "
                             "0: none)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: CPU-sized models, fewer and shorter windows")
    parser.add_argument("--list", action="store_true", help="print the programs of each framework and exit")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here too")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if args.list:
        print_lineups()
        return 0
    defaults = (QUICK_ROUNDS, QUICK_WINDOW_S, QUICK_WARMUP) if args.quick else (ROUNDS, WINDOW_S, WARMUP)
    args.rounds, args.window_s, args.warmup = (given if given is not None else default for given, default
                                               in zip((args.rounds, args.window_s, args.warmup), defaults))
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    for model in args.models or ():
        try:
            parse_model(model)
        except argparse.ArgumentTypeError as err:
            parser.error(str(err))
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
