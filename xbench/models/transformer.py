"""`transformer`: a GPT-2-style decoder. Token and position embeddings, `layers` pre-LayerNorm
blocks (causal multi-head self-attention, then a GELU MLP of 4 x width, each added back to
the residual stream), a final LayerNorm and an LM head tied to the token embedding;
next-token cross-entropy, the mean over every position of the batch.

Fixed choices every backend follows (docs/model-families.md says where frameworks differ): LayerNorm
epsilon 1e-5 with a scale and a bias; GELU in its tanh approximation (GPT-2's own); attention
scores scaled by 1/sqrt(head width), causal mask, softmax in float32; dropout only where the
spec asks (the presets: none). Canonical layout (kernels [in, out]):

    wte [vocab, width], wpe [context, width],
    per block b: h{b}.ln1.scale, h{b}.ln1.bias [width],
                 h{b}.attn.qkv.kernel [width, 3 width] (columns: q, then k, then v; head h
                 takes columns h*hw .. (h+1)*hw - 1 of each), h{b}.attn.qkv.bias [3 width],
                 h{b}.attn.proj.kernel [width, width], h{b}.attn.proj.bias,
                 h{b}.ln2.scale, h{b}.ln2.bias,
                 h{b}.mlp.fc.kernel [width, 4 width], h{b}.mlp.fc.bias,
                 h{b}.mlp.proj.kernel [4 width, width], h{b}.mlp.proj.bias,
    lnf.scale, lnf.bias.

Data: uniform random tokens; inputs [samples, context] and targets the same sequences
shifted by one, both int32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from xbench.models import Dim, Param, normal, training_flops

LAYER_NORM_EPSILON = 1e-5
INIT_STD = 0.02  # GPT-2's: every kernel and embedding; residual projections scaled down


class Transformer:
    name: ClassVar[str] = "transformer"
    unit: ClassVar[str] = "tokens"
    loss: ClassVar[str] = "next-token cross-entropy, the mean over every position"
    batch_statistics: ClassVar[bool] = False
    # Verify trains a 2-block instance on 64 tokens at full width and vocabulary (the same
    # kernels, a tenth of the work of 12 x 1,024), then probes the full model once.
    verification_dims: ClassVar[Mapping[str, int]] = {"layers": 2, "context": 64}
    dims: ClassVar[Mapping[str, Dim]] = {
        "layers": Dim(1, 1_000, None, "decoder blocks"),
        "heads": Dim(1, 1_000, None, "attention heads (must divide width)"),
        "width": Dim(1, 1_000_000, None, "model width (embedding size)"),
        "context": Dim(2, 1_000_000, None, "sequence length of each sample, in tokens"),
        "vocab": Dim(2, 100_000_000, None, "vocabulary size"),
    }
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        # Verifies in seconds on a CPU.
        "transformer-tiny": {"layers": 2, "heads": 4, "width": 128, "context": 64, "vocab": 1024,
                             "batch_sizes": (8, 32)},
        # GPT-2 small (124 M parameters with the tied head); vocab padded to 50,304 as nanoGPT does.
        "gpt2-small": {"layers": 12, "heads": 12, "width": 768, "context": 1024, "vocab": 50304,
                       "batch_sizes": (8, 16)},
        # The larger GPT-2 shapes (355 M, 774 M, 1.5 B published with vocab 50,257; a few more
        # here with the padded vocabulary) and two of the GPT-3 paper's, at its 2,048-token
        # context (6.7 B and 13 B by the paper's names: 6.66 B and 12.85 B counted, vocab 50,257;
        # heads of width 128). With Adam and fp32 master weights (16 bytes a parameter before
        # activations, `xbench.models.memory`) the GPT-3 shapes need their state sharded.
        "gpt2-medium": {"layers": 24, "heads": 16, "width": 1024, "context": 1024, "vocab": 50304,
                        "batch_sizes": (8, 16)},
        "gpt2-large": {"layers": 36, "heads": 20, "width": 1280, "context": 1024, "vocab": 50304,
                       "batch_sizes": (4, 8)},
        "gpt2-xl": {"layers": 48, "heads": 25, "width": 1600, "context": 1024, "vocab": 50304,
                    "batch_sizes": (4, 8)},
        "gpt3-6.7b": {"layers": 32, "heads": 32, "width": 4096, "context": 2048, "vocab": 50304,
                      "batch_sizes": (2, 4)},
        "gpt3-13b": {"layers": 40, "heads": 40, "width": 5120, "context": 2048, "vocab": 50304,
                     "batch_sizes": (2, 4)},
    }

    def check(self, dims: Mapping[str, Any]) -> None:
        if dims["width"] % dims["heads"]:
            raise ValueError(f"heads ({dims['heads']}) must divide width ({dims['width']}); "
                             "choose a width that is a multiple of heads")

    def parameters(self, dims: Mapping[str, Any]) -> list[Param]:
        d, v, t = dims["width"], dims["vocab"], dims["context"]
        params = [Param("wte", (v, d)), Param("wpe", (t, d))]
        for b in range(dims["layers"]):
            params += [
                Param(f"h{b}.ln1.scale", (d,)), Param(f"h{b}.ln1.bias", (d,)),
                Param(f"h{b}.attn.qkv.kernel", (d, 3 * d)), Param(f"h{b}.attn.qkv.bias", (3 * d,)),
                Param(f"h{b}.attn.proj.kernel", (d, d)), Param(f"h{b}.attn.proj.bias", (d,)),
                Param(f"h{b}.ln2.scale", (d,)), Param(f"h{b}.ln2.bias", (d,)),
                Param(f"h{b}.mlp.fc.kernel", (d, 4 * d)), Param(f"h{b}.mlp.fc.bias", (4 * d,)),
                Param(f"h{b}.mlp.proj.kernel", (4 * d, d)), Param(f"h{b}.mlp.proj.bias", (d,)),
            ]
        return params + [Param("lnf.scale", (d,)), Param("lnf.bias", (d,))]

    def init(self, dims: Mapping[str, Any], rng: np.random.Generator) -> list[np.ndarray]:
        """GPT-2's: normal(0, 0.02) kernels and embeddings, the two residual projections of
        each block with 0.02 / sqrt(2 layers); zero biases; LayerNorm scale 1, bias 0."""
        residual_std = INIT_STD / math.sqrt(2 * dims["layers"])
        arrays = []
        for param in self.parameters(dims):
            if param.name.endswith(".scale"):
                arrays.append(np.ones(param.shape, np.float32))
            elif param.name.endswith(".bias"):
                arrays.append(np.zeros(param.shape, np.float32))
            elif param.name.endswith("proj.kernel"):
                arrays.append(normal(rng, residual_std, param.shape))
            else:
                arrays.append(normal(rng, INIT_STD, param.shape))
        return arrays

    def data(self, dims: Mapping[str, Any], samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        tokens = rng.integers(0, dims["vocab"], size=(samples, dims["context"] + 1), dtype=np.int32)
        return np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])

    def flops_per_sample(self, dims: Mapping[str, Any]) -> int:
        """Per sequence: every matmul of a block (q, k, v, the projection, the MLP), the two
        attention matmuls over the full context (as PaLM's and nanoGPT's MFU count them,
        though the mask makes half of the scores unused), and the LM head; all need their
        input gradients (the first matmul's input is the embedding, which trains). Per token
        this is 6 N + 12 layers x context x width, N the non-embedding parameters plus the
        head (the usual formula)."""
        d, t, v = dims["width"], dims["context"], dims["vocab"]
        per_block = [2 * t * d * 3 * d, 2 * t * t * d, 2 * t * t * d, 2 * t * d * d, 2 * t * d * 4 * d,
                     2 * t * 4 * d * d]
        return training_flops(per_block * dims["layers"] + [2 * t * d * v], first_needs_input_grad=True)

    def largest_activation(self, dims: Mapping[str, Any]) -> tuple[int, str]:
        d, t = dims["width"], dims["context"]
        return max(t * dims["vocab"], dims["heads"] * t * t, t * 4 * d), "logits or attention scores"

    def units_per_sample(self, dims: Mapping[str, Any]) -> int:
        return dims["context"]
