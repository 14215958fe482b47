"""The transformer (GPT-2-style decoder) of the jax backends as Flax NNX writes it:
`nnx.Embed` token and position embeddings, pre-LayerNorm blocks of `nnx.LayerNorm`,
`nnx.Linear` (a fused qkv projection, the attention projection, the MLP) and GELU (tanh), a
final `nnx.LayerNorm` and the LM head tied to the token embedding (`Embed.attend`).

Layout: the core's, as is: `nnx.Linear` kernels are [in, out], the qkv kernel's columns q,
then k, then v, each split into heads in order (what reshaping [.., width] to [.., heads, hw]
gives); embeddings [rows, width]; LayerNorm scale and bias.

Attention: `jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=...)`:
None (jax's choice: XLA's einsum-softmax-einsum on the GPUs measured) as written, "cudnn"
(cuDNN's fused kernel: bf16/fp16 on NVIDIA GPUs only) in the `cudnn` variant; written out
in float64 for "fp64" (jax's softmaxes in float32 whatever the inputs).

The `remat` variant (and `fsdp-remat`, the sharded program's) calls each block through
`nnx.remat` (a lifted `jax.checkpoint`, `prevent_cse=True`): the backward pass recomputes the
block's forward from its input, the same operations on the same values. The blocks draw no
random numbers (this decoder has no dropout); were they to, the key would be an input of the
checkpointed function, so the recomputation would draw the same masks.
"""

from __future__ import annotations

from xbench.contract import Trial, Work
from xbench_backends.jax.layers import compute_dtype, parameter_dtype, softmax_cross_entropy
from xbench_backends.jax.transformer import GELU_APPROXIMATE, LAYER_NORM_EPSILON, float64_attention
from xbench_backends.recompute import RECOMPUTING

CUDNN = "cudnn"  # the variant whose attention runs cuDNN's fused kernel
FSDP_CUDNN = "fsdp-cudnn"  # the sharded program (`fsdp`) with cudnn's attention
FUSED_ATTENTION = (CUDNN, FSDP_CUDNN)  # the variants whose attention is cuDNN's
# The attention every program computes; tests set a classic slip here and verify must see it.
CAUSAL = True
SCALE = None  # None: 1/sqrt(head width), jax's default and the core's


def attention_implementation(variant: str) -> str | None:
    return "cudnn" if variant in FUSED_ATTENTION else None


def constructor(trial: Trial, work: Work, variant: str):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    dims = work.model.shape
    width, heads = dims["width"], dims["heads"]
    dtype, param_dtype = compute_dtype(trial), parameter_dtype(trial)
    layer = dict(dtype=dtype, param_dtype=param_dtype)
    implementation = attention_implementation(variant)

    def call(block, h):
        return block(h)

    run_block = nnx.remat(call) if variant in RECOMPUTING else call

    def attention(q, k, v):
        if q.dtype == jnp.float64:
            return float64_attention(q, k, v)
        return jax.nn.dot_product_attention(q, k, v, scale=SCALE, is_causal=CAUSAL, implementation=implementation)

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.ln1 = nnx.LayerNorm(width, epsilon=LAYER_NORM_EPSILON, rngs=rngs, **layer)
            self.qkv = nnx.Linear(width, 3 * width, rngs=rngs, **layer)
            self.proj = nnx.Linear(width, width, rngs=rngs, **layer)
            self.ln2 = nnx.LayerNorm(width, epsilon=LAYER_NORM_EPSILON, rngs=rngs, **layer)
            self.fc = nnx.Linear(width, 4 * width, rngs=rngs, **layer)
            self.mlp_proj = nnx.Linear(4 * width, width, rngs=rngs, **layer)

        def __call__(self, x):
            batch, context, _ = x.shape
            q, k, v = (a.reshape(batch, context, heads, width // heads)
                       for a in jnp.split(self.qkv(self.ln1(x)), 3, axis=-1))
            x = x + self.proj(attention(q, k, v).reshape(batch, context, width))
            return x + self.mlp_proj(nnx.gelu(self.fc(self.ln2(x)), approximate=GELU_APPROXIMATE))

    class GPT(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.wte = nnx.Embed(dims["vocab"], width, rngs=rngs, **layer)
            self.wpe = nnx.Embed(dims["context"], width, rngs=rngs, **layer)
            self.blocks = nnx.List([Block(rngs) for _ in range(dims["layers"])])
            self.lnf = nnx.LayerNorm(width, epsilon=LAYER_NORM_EPSILON, rngs=rngs, **layer)

        def __call__(self, tokens, rngs=None):
            h = self.wte(tokens) + self.wpe(jnp.arange(tokens.shape[1]))
            for block in self.blocks:
                h = run_block(block, h)
            return self.wte.attend(self.lnf(h))  # the tied head: h @ wte.T

    return lambda: GPT(nnx.Rngs(0))


def paths(dims) -> list[tuple]:
    found = [("wte", "embedding"), ("wpe", "embedding")]
    for b in range(dims["layers"]):
        block = ("blocks", b)
        found += [(*block, "ln1", "scale"), (*block, "ln1", "bias"), (*block, "qkv", "kernel"), (*block, "qkv", "bias"),
                  (*block, "proj", "kernel"), (*block, "proj", "bias"), (*block, "ln2", "scale"),
                  (*block, "ln2", "bias"), (*block, "fc", "kernel"), (*block, "fc", "bias"),
                  (*block, "mlp_proj", "kernel"), (*block, "mlp_proj", "bias")]
    return found + [("lnf", "scale"), ("lnf", "bias")]


def objective(logits, tokens):
    return softmax_cross_entropy(logits, tokens)


def cudnn_refusal(trial: Trial, work: Work, device) -> str | None:
    """Why cuDNN's fused attention cannot run this trial here, or None: asked of jax itself,
    by compiling one layer's attention and its gradient for `device` (jax checks dtype and
    shape, cuDNN's version and the GPU)."""
    import jax

    if device.platform != "gpu":
        return f"cuDNN fused attention needs an NVIDIA GPU; this trial runs on {device.platform}"
    if trial.precision != "bf16":
        return f"cuDNN fused attention takes bf16 or fp16; this trial is {trial.precision}"
    dims = work.model.shape
    shape = (2, dims["context"], dims["heads"], dims["width"] // dims["heads"])
    q = jax.ShapeDtypeStruct(shape, compute_dtype(trial), sharding=jax.sharding.SingleDeviceSharding(device))
    fn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn"))
    try:
        jax.jit(jax.grad(lambda q, k, v: fn(q, k, v).astype("float32").sum())).lower(q, q, q).compile()
    except Exception as err:  # jax's own words: which of platform, dtype or shape it refuses
        return f"cuDNN fused attention refused this shape: {type(err).__name__}: {str(err).splitlines()[0]}"
    return None


def notes(trial: Trial, work: Work, device, variant: str) -> tuple[str, ...]:
    from xbench_backends.jax.transformer import attention_kernel

    if attention_implementation(variant) == "cudnn":
        kernel = ("attention: jax.nn.dot_product_attention(is_causal=True, implementation='cudnn'): "
                  "cuDNN fused attention")
    else:
        kernel = attention_kernel(trial, work, device)
    remat = ((f"remat: each of the {work.model.shape['layers']} blocks called through nnx.remat "
              "(jax.checkpoint, prevent_cse=True): its activations recomputed from its input in the backward pass",)
             if variant in RECOMPUTING else ())
    return (kernel, f"LayerNorm epsilon {LAYER_NORM_EPSILON} (nnx.LayerNorm), GELU "
                    f"{'tanh' if GELU_APPROXIMATE else 'erf'}; no dropout", *remat)
