"""Memory per device of one training step, estimated in pure numpy arithmetic before anything
is launched: what every program holds (parameters, gradients, Adam's two moments) and what its
backward pass keeps (activations at the batch), replicated on every device or sharded over N.

The training state follows the programs xbench times: float32 master weights, float32
gradients and float32 Adam moments whatever the compute precision (bf16 mixed precision keeps
masters and reductions in float32; "fp64" holds everything in float64), so 16 bytes a
parameter replicated (32 in float64). Sharded over N devices (FSDP, ZeRO-3: `torch:fsdp`,
`jax:fsdp`) each device holds 1/N of the state, plus the parameters it gathers for the unit
it computes: the largest unit (a transformer block; the whole MLP, which is one unit) in the
compute dtype, twice (the unit computed and the next one prefetched), and that unit's full
float32 gradient before it is reduce-scattered.

Activations are what the backward pass needs, per sample, in the compute dtype:
- transformer, per block and token: the LayerNorm inputs (2 width), q, k and v with the
  attention's input and output and the projection's input (6 width), the MLP's input, its
  4-width hidden layer before and after GELU (9 width), and the attention probabilities
  (heads x context; a fused attention kernel keeps none: `fused_attention`; a softmax taken in
  float32 under a narrower compute dtype keeps its float32 output beside the compute-dtype copy:
  `float32_softmax`), after Korthikanti
  et al., "Reducing Activation Recomputation in Large Transformer Models" (2022), table 2,
  without dropout masks; then the final LayerNorm and the logits, with the float32 copy the
  loss takes and its gradient (the largest single tensor of a GPT-2 step);
  With each block's activations recomputed in the backward pass (activation checkpointing,
  `recompute`: `jax:remat`, `torch:remat`), the step keeps only each block's input (width per
  token) and, while one block is recomputed for its backward pass, that block's activations;
- MLP: each layer's input and its pre-activation;
- cnn, per image: the image, the max pool's output, and per convolution its output (which
  BatchNorm keeps) and BatchNorm's output after the ReLU (which the next convolution and the
  ReLU's backward keep; for a block's last convolution, the block's output after the sum and
  its ReLU; a projection shortcut's BatchNorm output goes only into the sum and is not kept).
  Measured on one H100 (ResNet-50 at 224 x 224, 256 images): framework peaks of 10.7 GiB (jax)
  and 11.4 GiB (torch) in bf16, where this model says 10.4, and 21.9-22.7 GiB in fp32, where
  it says 20.4-20.6 (6.1 GiB at 64 images: 5.3-5.5): the rest is the frameworks' workspace;
- lstm, and a plugin's families: unknown here (`activations` is None; the state alone is estimated).

The step's peak is not the sum of all of these: the backward pass frees each layer's
activations as it makes that layer's gradients, so activations and gradients peak at opposite
ends of it. The estimate takes the larger end: at the start of the backward pass, every kept
activation, the logits' transients and the parameters' copy in the compute dtype (bf16 mixed
precision casts the float32 masters once per step: torch's autocast cache, XLA's converts);
at its end, every gradient and what recomputation still holds (one block). Measured on one
H200 (gpt2-xl, bf16, 8 sequences of 1,024): torch 46.4 GiB eager, 42.9 compiled, 24.9 with
each block recomputed; this model says 44.1 and 25.8 GiB (a sum of everything said 65.8 and
29.1).

A replicated data-parallel program whose reduction keeps buffers of its own (a bucketed one's:
`reduction_buffers` gradient-sized copies) holds them throughout the step, on top of all this.

It is an estimate: allocator fragmentation, workspace of kernels and the framework's own
buffers (NCCL's, XLA's temporaries) come on top, so a framework's measured peak is the judge;
what it is for is saying before launching whether a configuration can fit at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xbench.models.cnn import STAGE_WIDTHS, conv_out, convolutions

GiB = 2**30
# The families the sharded programs build (the built-in backends' `fsdp` variant,
# backends/sharding.py's FSDP_FAMILIES): `xbench models` lists their sharded memory
SHARDED_FAMILIES = ("mlp", "transformer")
STATE_BYTES = 4  # float32 masters, gradients and each Adam moment (fp64: 8)
COMPUTE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp64": 8}
PREFETCHED_UNITS = 2  # the unit computed and the next one gathered ahead of it


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device holds at the peak of a training step. `activations` is None where the
    family's activations are not modelled here."""

    devices: int
    sharded: bool
    parameters: int
    gradients: int
    optimizer: int
    gathered: int  # sharded programs only: the gathered unit(s) and its unsharded gradient
    activations: int | None
    recompute: bool = False  # activations recomputed per block in the backward pass
    compute_copy: int = 0  # the parameters cast to the compute dtype for the step (bf16 over fp32 masters)
    backward_tail: int = 0  # activations still held when the last gradient is made (one recomputed block)
    reduction: int = 0  # the data-parallel reduction's own gradient-sized buffers, held throughout

    @property
    def state(self) -> int:
        """Parameters, gradients and Adam's moments (and, sharded, what is gathered; replicated,
        the reduction's buffers)."""
        return self.parameters + self.gradients + self.optimizer + self.gathered + self.reduction

    @property
    def total(self) -> int:
        """The step's peak: the state that lives throughout, then the larger end of the
        backward pass (every activation at its start, every gradient at its end)."""
        if self.activations is None:
            return self.state
        held = self.parameters + self.optimizer + self.gathered + self.reduction
        return held + max(self.activations + self.compute_copy, self.gradients + self.backward_tail)

    def fits(self, capacity_bytes: int) -> bool:
        return self.total <= capacity_bytes


def estimate(family: str, shape: Mapping[str, Any], params: int, per_device_batch: int, devices: int = 1,
             sharded: bool = False, precision: str = "fp32", fused_attention: bool = False,
             recompute: bool = False, reduction_buffers: int = 0, float32_softmax: bool = False) -> MemoryEstimate:
    """Per device: a model of `family` with `shape` (a ModelSpec's `shape`) and `params`
    parameters, `per_device_batch` samples on each device, its state replicated or `sharded`
    over `devices`, its blocks' activations kept or, `recompute`, recomputed in the backward
    pass; replicated, `reduction_buffers` gradient-sized buffers of its reduction besides."""
    if devices < 1 or per_device_batch < 0 or reduction_buffers < 0:
        raise ValueError(f"devices must be at least 1, the batch and the buffers not negative; got {devices}, "
                         f"{per_device_batch}, {reduction_buffers}")
    if precision not in COMPUTE_BYTES:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(COMPUTE_BYTES)}")
    state = 2 * STATE_BYTES if precision == "fp64" else STATE_BYTES
    compute = COMPUTE_BYTES[precision]
    share = shard_of(params, devices) if sharded else params
    gathered = 0
    if sharded and devices > 1:
        unit = largest_unit(family, shape, params)
        gathered = PREFETCHED_UNITS * unit * compute + unit * state
    per_sample = activations_per_sample(family, shape, compute, fused_attention, recompute, float32_softmax)
    # Sharded programs gather their units in the compute dtype already (counted in `gathered`).
    cast = share * compute if compute < state and not (sharded and devices > 1) else 0
    tail = recomputed_block(family, shape, compute, fused_attention, float32_softmax) * per_device_batch \
        if recompute else 0
    return MemoryEstimate(devices, sharded, parameters=share * state, gradients=share * state,
                          optimizer=2 * share * state, gathered=gathered,
                          activations=None if per_sample is None else per_sample * per_device_batch,
                          recompute=recompute, compute_copy=cast, backward_tail=tail,
                          reduction=0 if sharded else reduction_buffers * share * state)


def shard_of(count: int, devices: int) -> int:
    """The elements one device holds of `count` split over `devices` (the last ones pad)."""
    return -(-count // devices)


def largest_unit(family: str, shape: Mapping[str, Any], params: int) -> int:
    """The parameters of the largest unit a sharded program gathers at once: a transformer
    block, or the token embedding with the tied head, whichever is larger; the whole model
    for the other families (sharded at their root only)."""
    if family != "transformer":
        return params
    d = shape["width"]
    return max(12 * d * d + 13 * d, shape["vocab"] * d)


def activations_per_sample(family: str, shape: Mapping[str, Any], compute_bytes: int,
                           fused_attention: bool = False, recompute: bool = False,
                           float32_softmax: bool = False) -> int | None:
    """Bytes the backward pass keeps per sample (see the module's docstring), or None.
    `recompute` changes the transformer's blocks only (the other families have none)."""
    if family == "transformer":
        d, t, layers = shape["width"], shape["context"], shape["layers"]
        per_block = recomputed_block(family, shape, compute_bytes, fused_attention, float32_softmax)
        head = t * (2 * d) * compute_bytes + t * shape["vocab"] * (compute_bytes + 2 * 4)  # logits, f32 copy, grad
        if recompute:  # every block's input kept, one block's activations rebuilt at a time
            return layers * t * d * compute_bytes + per_block + head
        return layers * per_block + head
    if family == "mlp":
        sizes: Sequence[int] = (shape["inputs"], *shape["widths"], shape["outputs"])
        return sum(sizes[:-1]) * compute_bytes + sum(sizes[1:]) * compute_bytes
    if family == "cnn":
        return cnn_activations(shape) * compute_bytes
    return None


def cnn_activations(shape: Mapping[str, Any]) -> int:
    """Elements the ResNet's backward pass keeps per image (see the module's docstring)."""
    pooled = conv_out(conv_out(shape["image"], 7, 2), 3, 2)
    kept = shape["image"] ** 2 * shape["channels"] + STAGE_WIDTHS[0] * pooled ** 2
    # A projection's BatchNorm output goes only into the block's sum, whose ReLU output is counted
    # with the block's last convolution.
    return kept + sum((1 if conv.name.endswith(".down.conv") else 2) * conv.out_size ** 2 * conv.outputs
                      for conv in convolutions(shape))


def recomputed_block(family: str, shape: Mapping[str, Any], compute_bytes: int, fused_attention: bool,
                     float32_softmax: bool = False) -> int:
    """One transformer block's activations per sample (0 for the other families)."""
    if family != "transformer":
        return 0
    t = shape["context"]
    probability_bytes = compute_bytes + (4 if float32_softmax and compute_bytes < 4 else 0)
    scores = 0 if fused_attention else shape["heads"] * t * probability_bytes
    return t * (17 * shape["width"] * compute_bytes + scores)


def per_device_table(family: str, shape: Mapping[str, Any], params: int, per_device_batch: int,
                     device_counts: Sequence[int] = (2, 4, 8), precision: str = "fp32"
                     ) -> dict[str, MemoryEstimate]:
    """What `xbench models` lists: one device replicated ("replicated"), and sharded over each
    of `device_counts` ("sharded over N"), at `per_device_batch` samples per device."""
    rows = {"replicated": estimate(family, shape, params, per_device_batch, 1, False, precision)}
    for n in device_counts:
        rows[f"sharded over {n}"] = estimate(family, shape, params, per_device_batch, n, True, precision)
    return rows
