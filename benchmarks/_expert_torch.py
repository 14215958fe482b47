"""expert_loops.py's minimal torch loops, as an expert writes them: a nanoGPT-style GPT-2 and a
torchvision-style ResNet v1.5 (channels-last), eager and torch.compile'd, and overhead.py's MLP
loop; autocast bf16, fused Adam, the core's weights loaded into each."""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from _expert_config import (
    BATCH_NORM_EPSILON,
    BATCH_NORM_MOMENTUM,
    LAYER_NORM_EPSILON,
    RESNET_STAGES,
    RESNET_WIDTHS,
    Loop,
    LoopContext,
    Unavailable,
    check_mlp_loop,
)

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
    run, last_loss = steps_loop(forward, optimizer, xs, ys, ctx.device, autocast)
    return run, fused, last_loss


def steps_loop(forward, optimizer, xs, ys, device, autocast=nullcontext) -> tuple[Callable[[int], None], Callable]:
    """run(steps): forward (the loss) under `autocast`, backward, Adam, zero_grad(set_to_none=True)
    over the resident batches `xs[i]`, `ys[i]` (a Python int index), then one device sync;
    and last_loss()."""
    import torch

    batches, cuda = xs.shape[0], device.type == "cuda"
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
            torch.cuda.synchronize(device)

    return run, lambda: float(last[0])


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


def torch_gpt2_built(ctx: LoopContext, compiled: bool):
    """The nanoGPT-style model on the device with the core's weights loaded, and its parameter
    count; Unavailable where `compiled` is asked and torch.compile cannot run here."""
    import torch

    if compiled and (reason := torch_compile_unavailable(ctx.device)):
        raise Unavailable(reason)
    torch_set_precision(ctx.precision, cudnn_benchmark=False)
    dims = ctx.work.model.shape
    with torch.device(ctx.device):
        model = torch_gpt_class()(dims["layers"], dims["heads"], dims["width"], dims["context"], dims["vocab"])
    return model, torch_load(model, ctx.work, gpt_place)


def torch_gpt2(ctx: LoopContext, compiled: bool) -> Loop:
    import torch

    model, count = torch_gpt2_built(ctx, compiled)
    dims = ctx.work.model.shape
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
