"""The GPT-2-style decoder of the torch backend (the core's `transformer` family).

Layout conversions from the canonical arrays: every dense kernel [in, out] becomes nn.Linear's
weight [out, in] (transposed; the qkv kernel's columns q, k, v become its rows, split in that
order and then into heads, as the core lays them out); embeddings, LayerNorm scales and biases
are taken as they are. The LM head is tied: logits = h @ wte.T with the embedding's own
weight, so that the parameter is counted, updated and read back once, and its gradient holds
both uses. Tokens (int32 in the core) are made int64 when placed on the device, outside the
timed step.

The `remat` variant sets `Decoder.checkpoint_blocks`: each block then runs under
`torch.utils.checkpoint.checkpoint(use_reentrant=False)`, its activations recomputed from its
input in the backward pass, with `preserve_rng_state=True` (the default) so that a block
drawing random numbers would draw the same ones again (this decoder has no dropout), and the
forward's autocast state restored for the recomputation.

Imported by `families.build` only (inside `prepare`), so torch is imported at the top.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from xbench.contract import Work
from xbench.contract import transformer as core_transformer
from xbench_backends.torch.families import (
    Built,
    Slot,
    at_least_float32,
    canonical_reader,
    load,
    slots_in_order,
    transposed,
)

# The core's fixed choices (xbench.models.transformer); tests patch them to prove verify fails.
LAYER_NORM_EPSILON = core_transformer.LAYER_NORM_EPSILON
GELU_APPROXIMATE = "tanh"  # GPT-2's own; torch's default would be the erf form ("none")


def build(work: Work, device, compute_dtype=None, param_dtype=None) -> Built:
    dims = work.model.shape
    with torch.device("meta"):  # no initialisation of its own: the core's arrays are loaded next
        model = Decoder(dims["layers"], dims["heads"], dims["width"], dims["context"], dims["vocab"])
    slots = slots_in_order(work, _slots(dims["layers"]))
    load(model, work, slots, device, param_dtype=param_dtype)
    return Built(model=model, canonical=canonical_reader(model, slots), loss=loss,
                 place_inputs=lambda tokens: tokens.long(), place_targets=lambda tokens: tokens.long(),
                 notes=(_attention_note(dims, device, compute_dtype or param_dtype),))


def loss(logits, targets):
    """Next-token cross-entropy in float32 (float64 in fp64), the mean over every position of
    this rank's batch."""
    return F.cross_entropy(at_least_float32(logits).flatten(0, 1), targets.flatten())


def _slots(layers: int) -> dict[str, Slot]:
    """Canonical name -> where it lives in `Decoder`."""
    slots = {"wte": Slot("wte.weight"), "wpe": Slot("wpe.weight"),
             "lnf.scale": Slot("lnf.weight"), "lnf.bias": Slot("lnf.bias")}
    for b in range(layers):
        for norm in ("ln1", "ln2"):
            slots[f"h{b}.{norm}.scale"] = Slot(f"blocks.{b}.{norm}.weight")
            slots[f"h{b}.{norm}.bias"] = Slot(f"blocks.{b}.{norm}.bias")
        for canonical, module in (("attn.qkv", "qkv"), ("attn.proj", "attn_proj"), ("mlp.fc", "fc"),
                                  ("mlp.proj", "mlp_proj")):
            slots[f"h{b}.{canonical}.kernel"] = transposed(f"blocks.{b}.{module}.weight")
            slots[f"h{b}.{canonical}.bias"] = Slot(f"blocks.{b}.{module}.bias")
    return slots


class Block(nn.Module):
    """Pre-LayerNorm: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width, eps=LAYER_NORM_EPSILON)
        self.qkv = nn.Linear(width, 3 * width)
        self.attn_proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width, eps=LAYER_NORM_EPSILON)
        self.fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        batch, context, width = x.shape
        head_width = width // self.heads
        q, k, v = (z.view(batch, context, self.heads, head_width).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(width, dim=-1))
        # Scaled by 1/sqrt(head width) inside; which kernel runs is recorded in the notes.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(batch, context, width))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate=GELU_APPROXIMATE))


class Decoder(nn.Module):
    def __init__(self, layers: int, heads: int, width: int, context: int, vocab: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(width, eps=LAYER_NORM_EPSILON)
        self.checkpoint_blocks = False  # the remat variant: each block's activations recomputed in backward

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=False, preserve_rng_state=True) if self.checkpoint_blocks \
                else block(h)
        return F.linear(self.lnf(h), self.wte.weight)  # the tied head: h @ wte.T


def _attention_note(dims, device, compute_dtype) -> str:
    """Which SDPA backend torch's dispatcher picks for one sequence of this shape and dtype
    (torch._fused_sdp_choice, the function F.scaled_dot_product_attention asks), and which
    backends are enabled on CUDA."""
    dtype = compute_dtype or torch.float32
    head_width = dims["width"] // dims["heads"]
    shape = (1, dims["heads"], dims["context"], head_width)
    try:
        from torch.nn.attention import SDPBackend

        q = torch.zeros(shape, dtype=dtype, device=device, requires_grad=True)
        choice = SDPBackend(torch._fused_sdp_choice(q, q, q, None, 0.0, True)).name
    except Exception as err:  # a private function: say what is unknown rather than fail the trial
        choice = f"unknown ({type(err).__name__})"
    enabled = ""
    if device.type == "cuda":
        flags = {"flash": torch.backends.cuda.flash_sdp_enabled(),
                 "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                 "cudnn": torch.backends.cuda.cudnn_sdp_enabled(), "math": torch.backends.cuda.math_sdp_enabled()}
        enabled = "; enabled: " + ", ".join(name for name, on in flags.items() if on)
    dtype_name = str(dtype).removeprefix("torch.")
    return (f"attention: F.scaled_dot_product_attention(is_causal=True), {choice} for "
            f"[batch, {dims['heads']}, {dims['context']}, {head_width}] {dtype_name} on {device.type}{enabled}")


def checkpoint_blocks(model) -> str:
    """Turn on the remat variant in a built Decoder; what it did, for the notes."""
    model.checkpoint_blocks = True
    return (f"remat: each of the {len(model.blocks)} blocks under torch.utils.checkpoint.checkpoint("
            "use_reentrant=False, preserve_rng_state=True): its activations recomputed from its input in the "
            "backward pass")
