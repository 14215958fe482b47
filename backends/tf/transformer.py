"""The GPT-2-style decoder of the tf backend (`xbench.models.transformer`), a Keras 3 functional
model. Layouts: the core's kernels are [in, out], Keras Dense's layout, and LayerNorm's scale
and bias are Keras's gamma and beta, so every array loads as it is; the q, k, v columns of
the fused qkv kernel are split exactly as the core's docstring says.

What Keras would do differently by default, set here on purpose: LayerNormalization epsilon
1e-5 (Keras: 1e-3), GELU in its tanh approximation (Keras: erf), attention from plain ops
(scores scaled by 1/sqrt(head width), causal mask, softmax in float32, float64 in fp64) rather than
`keras.layers.MultiHeadAttention` (separate q, k, v kernels of another layout). The LM head
is tied: one layer holds `wte` and serves both the embedding lookup and the logits, so Keras
counts it once.

The `remat` variant (`build_model(..., remat=True)`) makes each block one Keras layer
(`_remat_block_class`) whose computation runs through `keras.remat` (TensorFlow's
`tf.recompute_grad`): the backward pass recomputes the block from its input. The block's
layers and operations are the as-written ones (its residual sums a plain add instead of an
`Add` layer: the same addition), so the arithmetic is the same.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from xbench.contract import Work

LAYER_NORM_EPSILON = 1e-5  # the core's; Keras's default is 1e-3
GELU_APPROXIMATE = True  # tanh, GPT-2's; Keras's default is erf
ATTENTION_NOTE = ("attention: plain ops (einsum scores scaled by 1/sqrt(head width), causal mask, softmax in "
                  "float32); no fused kernel")


REMAT_NOTE = ("remat: each of the {layers} blocks one Keras layer whose computation runs through keras.remat "
              "(tf.recompute_grad): its activations recomputed from its input in the backward pass")


def build_model(work: Work, jit_compile: bool = False, remat: bool = False) -> tuple[Any, dict[str, Any]]:
    """The Keras model (tokens [batch, context] int32 -> logits [batch, context, vocab]) and
    its trainable variables by canonical name; weights are loaded by the caller. `remat`:
    each block recomputed in the backward pass."""
    import keras

    dims = work.model.shape
    d, layers = dims["width"], dims["layers"]
    tokens = keras.Input(shape=(dims["context"],), dtype="int32", name="tokens")
    embedding = _tied_embedding_class()(dims["vocab"], dims["context"], d, name="embedding")
    h = embedding(tokens)
    named = {}
    for b in range(layers):
        block = _Block(b, d, dims["heads"])
        h = _remat_block_class()(block, name=f"h{b}.remat")(h) if remat else block(h)
        named.update(block.named())
    lnf = _layer_norm("lnf")
    logits = embedding(lnf(h), as_logits=True)
    model = keras.Model(tokens, logits, name="transformer")
    named.update({"wte": embedding.wte, "wpe": embedding.wpe, "lnf.scale": lnf.gamma, "lnf.bias": lnf.beta})
    return model, named


def per_example_loss(model, x, y):
    """Each sequence's mean next-token cross-entropy over its positions, from float32 logits
    (bf16 under mixed precision upcast; float64 in fp64); the mean over sequences is then the
    mean over every position of the batch, as every sequence has `context` tokens."""
    import tensorflow as tf

    from xbench_backends.tf.models import loss_dtype

    logits = model(x, training=True)
    logits = tf.cast(logits, loss_dtype(logits))
    per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
    return tf.reduce_mean(per_token, axis=-1)


def notes(model, jit_compile: bool) -> tuple[str, ...]:
    return (ATTENTION_NOTE, f"LayerNorm epsilon {LAYER_NORM_EPSILON:g}; GELU {'tanh' if GELU_APPROXIMATE else 'erf'}")


def to_framework(name: str, array):
    """Canonical -> Keras layout: the same for every transformer parameter."""
    return array


def to_canonical(name: str, array):
    return array


class _Block:
    """One pre-LayerNorm decoder block, applied to the residual stream with functional calls;
    holds its layers so that their variables can be named."""

    def __init__(self, index: int, width: int, heads: int) -> None:
        import keras

        tag = f"h{index}"
        self.tag = tag
        self.ln1, self.ln2 = _layer_norm(f"{tag}.ln1"), _layer_norm(f"{tag}.ln2")
        self.qkv = keras.layers.Dense(3 * width, name=f"{tag}.attn.qkv")
        self.attention = _attention_class()(heads, name=f"{tag}.attn.core")
        self.attn_proj = keras.layers.Dense(width, name=f"{tag}.attn.proj")
        self.fc = keras.layers.Dense(4 * width, name=f"{tag}.mlp.fc")
        self.gelu = keras.layers.Activation(functools.partial(_gelu, approximate=GELU_APPROXIMATE),
                                            name=f"{tag}.mlp.gelu")
        self.mlp_proj = keras.layers.Dense(width, name=f"{tag}.mlp.proj")

    def __call__(self, h):
        import keras

        attention = self.attn_proj(self.attention(self.qkv(self.ln1(h))))
        h = keras.layers.Add(name=f"{self.tag}.attn.residual")([h, attention])
        mlp = self.mlp_proj(self.gelu(self.fc(self.ln2(h))))
        return keras.layers.Add(name=f"{self.tag}.mlp.residual")([h, mlp])

    def layers(self) -> list[Any]:
        return [self.ln1, self.qkv, self.attention, self.attn_proj, self.ln2, self.fc, self.gelu, self.mlp_proj]

    def recomputable(self, h):
        """The block on a tensor, its residual sums as plain adds: what `keras.remat` wraps."""
        h = h + self.attn_proj(self.attention(self.qkv(self.ln1(h))))
        return h + self.mlp_proj(self.gelu(self.fc(self.ln2(h))))

    def named(self) -> dict[str, Any]:
        t = self.tag
        return {
            f"{t}.ln1.scale": self.ln1.gamma, f"{t}.ln1.bias": self.ln1.beta,
            f"{t}.attn.qkv.kernel": self.qkv.kernel, f"{t}.attn.qkv.bias": self.qkv.bias,
            f"{t}.attn.proj.kernel": self.attn_proj.kernel, f"{t}.attn.proj.bias": self.attn_proj.bias,
            f"{t}.ln2.scale": self.ln2.gamma, f"{t}.ln2.bias": self.ln2.beta,
            f"{t}.mlp.fc.kernel": self.fc.kernel, f"{t}.mlp.fc.bias": self.fc.bias,
            f"{t}.mlp.proj.kernel": self.mlp_proj.kernel, f"{t}.mlp.proj.bias": self.mlp_proj.bias,
        }


def _gelu(x, approximate: bool):
    """Keras's GELU, but in float64 the tanh form written out: tf.nn.gelu makes its 0.044715 a
    float32 constant (0.0447149985 in float64), a relative error of 3e-8 in the coefficient."""
    import keras

    if approximate and x.dtype == "float64":
        from keras import ops

        return 0.5 * x * (1.0 + ops.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))
    return keras.activations.gelu(x, approximate=approximate)


def _layer_norm(name: str):
    import keras

    return keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=name)


@functools.lru_cache(maxsize=None)
def _remat_block_class():
    import keras

    class RematBlock(keras.layers.Layer):
        """One `_Block` as a layer (which tracks the block's layers and their variables), its
        computation through `keras.remat`."""

        def __init__(self, block: _Block, **kwargs) -> None:
            super().__init__(**kwargs)
            self.block_layers = block.layers()
            self.recompute = keras.remat(block.recomputable)

        def call(self, h):
            return self.recompute(h)

    return RematBlock


@functools.lru_cache(maxsize=None)
def _tied_embedding_class():
    import keras
    from keras import ops

    class TiedEmbedding(keras.layers.Layer):
        """Token and position embeddings, and the tied LM head: called on tokens it returns
        wte[tokens] + wpe[positions]; with `as_logits` it returns h @ wte^T."""

        def __init__(self, vocab: int, context: int, width: int, **kwargs) -> None:
            super().__init__(**kwargs)
            self.vocab, self.context, self.width = vocab, context, width

        def build(self, input_shape) -> None:
            self.wte = self.add_weight(shape=(self.vocab, self.width), name="wte")
            self.wpe = self.add_weight(shape=(self.context, self.width), name="wpe")

        def call(self, inputs, as_logits: bool = False):
            wte = ops.cast(self.wte, self.compute_dtype)
            if as_logits:
                return ops.matmul(inputs, ops.transpose(wte))
            positions = ops.cast(self.wpe, self.compute_dtype)[: ops.shape(inputs)[1]]
            return ops.take(wte, inputs, axis=0) + positions

    return TiedEmbedding


@functools.lru_cache(maxsize=None)
def _attention_class():
    import keras

    class CausalAttention(keras.layers.Layer):
        """Multi-head causal self-attention on a fused qkv [batch, time, 3 width] (columns q,
        k, v; head h takes columns h*hw .. (h+1)*hw - 1 of each) -> [batch, time, width].
        No weights: the projections are Dense layers around it."""

        def __init__(self, heads: int, **kwargs) -> None:
            super().__init__(**kwargs)
            self.heads = heads

        def call(self, qkv):
            import tensorflow as tf

            batch, time, width = tf.shape(qkv)[0], tf.shape(qkv)[1], qkv.shape[-1] // 3
            head_width = width // self.heads

            def heads_first(part):  # [batch, time, width] -> [batch, heads, time, head width]
                return tf.transpose(tf.reshape(part, [batch, time, self.heads, head_width]), [0, 2, 1, 3])

            q, k, v = (heads_first(part) for part in tf.split(qkv, 3, axis=-1))
            softmax_dtype = tf.float64 if qkv.dtype == tf.float64 else tf.float32  # bf16 upcast
            scores = tf.cast(tf.einsum("bhqd,bhkd->bhqk", q, k), softmax_dtype) * (1.0 / math.sqrt(head_width))
            positions = tf.range(time)
            causal = positions[:, None] >= positions[None, :]  # [query, key]: key <= query
            scores = tf.where(causal, scores, tf.constant(-math.inf, softmax_dtype))
            probabilities = tf.cast(tf.nn.softmax(scores, axis=-1), v.dtype)
            out = tf.einsum("bhqk,bhkd->bhqd", probabilities, v)
            return tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [batch, time, width])

    return CausalAttention
