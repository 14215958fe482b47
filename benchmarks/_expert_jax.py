"""expert_loops.py's minimal jax loops, as an expert writes them: GPT-2 in plain jax.numpy
(attention by XLA or cuDNN), a flax.linen ResNet v1.5, and overhead.py's MLP loop, each one
jitted step with its state donated."""

from __future__ import annotations

import functools
from collections.abc import Callable
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
from _interleave import describe

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
    """GPT-2 in plain jax.numpy on one device (`jax_gpt2_model`), one jitted step."""
    import jax

    params, loss_fn, note = jax_gpt2_model(ctx, attention)
    run, count, last_loss = jax_training_loop(ctx, params, (), loss_fn)
    return Loop(run, count, (note,), {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision},
                last_loss)


def jax_gpt2_model(ctx: LoopContext, attention: str | None) -> tuple[dict, Callable, str]:
    """GPT-2 in plain jax.numpy: pre-LayerNorm blocks, bf16 activations with float32
    statistics and loss, float32 params cast where used, the head tied to wte. Returns the
    core's weights as a pytree, `loss_fn(params, aux, tokens, targets) -> (loss, aux)` and a
    note on the attention kernel; sets the matmul precision as xbench does."""
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

    note = ("attention: dot_product_attention(implementation='cudnn')" if attention == "cudnn"
            else attention_kernel_note(ctx, heads, width // heads, context))
    return params, loss_fn, note


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
