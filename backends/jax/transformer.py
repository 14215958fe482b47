"""The transformer (GPT-2-style decoder) of the jax backends, in plain jax.numpy from the
core's arrays (`xbench.models.transformer`).

Layout: the core's, used as is. The params are a flat list in canonical order (wte, wpe,
then per block ln1, qkv, proj, ln2, fc, proj, then lnf), so `jax.tree.leaves` reads them
back in that order. Kernels are [in, out] as jax multiplies them; the qkv kernel's columns
are q, then k, then v, and head h takes columns h*hw .. (h+1)*hw - 1 of each, which is what
reshaping [.., width] to [.., heads, hw] gives. The LM head is the token embedding, tied.

Attention is `jax.nn.dot_product_attention(q, k, v, is_causal=True)` with
implementation=None (jax's choice; scores scaled by 1/sqrt(hw) and softmaxed in float32);
`attention_kernel` reads back which kernel that lowers to. In float64 ("fp64") it is written
out (einsum, causal mask, softmax, einsum, all float64), since jax's softmaxes in float32
whatever the inputs. No dropout.
"""

from __future__ import annotations

import numpy as np

from xbench.contract import Trial, Work
from xbench.contract import transformer as core_transformer
from xbench_backends.jax.layers import compute_dtype, dense, layer_norm, softmax_cross_entropy

LAYER_NORM_EPSILON = core_transformer.LAYER_NORM_EPSILON  # 1e-5 (Keras's default 1e-3 and Flax's 1e-6 differ)
GELU_APPROXIMATE = True  # GPT-2's tanh approximation; False is the erf GELU
PARAMS_PER_BLOCK = 12


def initial_params(work: Work) -> list[np.ndarray]:
    """The core's arrays in canonical order, unchanged."""
    return list(work.arrays)


def loss_function(trial: Trial, work: Work):
    """`loss_fn(params, x, y, rng)`: next-token cross-entropy in float32 (float64 in fp64),
    the mean over every position of this device's batch (so the mean over devices is the
    global mean); rng unused (no dropout)."""
    dims, dtype = work.model.shape, compute_dtype(trial)

    def loss_fn(params, x, y, rng):
        return softmax_cross_entropy(logits(params, x, dims, dtype), y)

    return loss_fn


def logits(params, tokens, dims, dtype):
    """[batch, context, vocab] logits of int32 tokens [batch, context]."""
    wte, wpe = params[0], params[1]
    h = (wte[tokens] + wpe[None, : tokens.shape[1]]).astype(dtype)
    for b in range(dims["layers"]):
        h = block(params[2 + PARAMS_PER_BLOCK * b: 2 + PARAMS_PER_BLOCK * (b + 1)], h, dims["heads"], dtype)
    h = layer_norm(h, params[-2], params[-1], LAYER_NORM_EPSILON, dtype)
    return h @ wte.astype(dtype).T


def block(p, h, heads: int, dtype):
    """One pre-LayerNorm block: h + attention(ln1(h)), then + MLP(ln2(.)), GELU tanh."""
    import jax

    ln1_s, ln1_b, qkv_k, qkv_b, proj_k, proj_b, ln2_s, ln2_b, fc_k, fc_b, mproj_k, mproj_b = p
    h = h + dense(attention(dense(layer_norm(h, ln1_s, ln1_b, LAYER_NORM_EPSILON, dtype), qkv_k, qkv_b, dtype),
                            heads), proj_k, proj_b, dtype)
    a = dense(layer_norm(h, ln2_s, ln2_b, LAYER_NORM_EPSILON, dtype), fc_k, fc_b, dtype)
    return h + dense(jax.nn.gelu(a, approximate=GELU_APPROXIMATE), mproj_k, mproj_b, dtype)


def attention(qkv, heads: int):
    """Causal multi-head self-attention of qkv [batch, context, 3 width] (q, k, v columns,
    each split into heads in order); returns [batch, context, width]."""
    import jax
    import jax.numpy as jnp

    batch, context, width3 = qkv.shape
    q, k, v = (a.reshape(batch, context, heads, width3 // 3 // heads) for a in jnp.split(qkv, 3, axis=-1))
    if qkv.dtype == jnp.float64:
        out = float64_attention(q, k, v)
    else:
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=None)
    return out.reshape(batch, context, width3 // 3)


def float64_attention(q, k, v):
    """Causal attention of q, k, v [batch, context, heads, hw] as jax's XLA implementation
    computes it (scores q.k / sqrt(hw), masked, softmax, weighted sum of v), every step in
    float64 (jax's softmaxes in float32)."""
    import jax
    import jax.numpy as jnp

    context, hw = q.shape[1], q.shape[-1]
    scores = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(hw)
    causal = jnp.tril(jnp.ones((context, context), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, axis=-1), v)


def attention_kernel(trial: Trial, work: Work, device) -> str:
    """Which kernel `jax.nn.dot_product_attention(implementation=None)` compiles to for one
    layer's shapes on `device`, read from the compiled HLO: cuDNN's fused attention (a
    `__cudnn$fmha` custom call) or XLA's own einsum-softmax-einsum."""
    import jax

    if trial.precision == "fp64":
        return "attention: written out in float64 (einsum, causal mask, softmax, einsum; no fused kernel)"
    dims = work.model.shape
    shape = (2, dims["context"], dims["heads"], dims["width"] // dims["heads"])
    q = jax.ShapeDtypeStruct(shape, compute_dtype(trial), sharding=jax.sharding.SingleDeviceSharding(device))
    fn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=None))
    text = fn.lower(q, q, q).compile().as_text()
    fused = "cudnn" in text.lower() and "fmha" in text.lower()
    kernel = "cuDNN fused attention" if fused else "XLA (einsum, float32 softmax, einsum; no fused kernel)"
    return f"attention: jax.nn.dot_product_attention(is_causal=True, implementation=None) runs {kernel}"


def notes(trial: Trial, work: Work, device) -> tuple[str, ...]:
    return (attention_kernel(trial, work, device),
            f"LayerNorm epsilon {LAYER_NORM_EPSILON}, GELU {'tanh' if GELU_APPROXIMATE else 'erf'}; no dropout")

