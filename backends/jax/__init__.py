"""The jax backends: `jax` (pmap, and the plain single-device program) in `pmap`, `jax-shardmap`
and `jax-auto` in `shardmap`, the sharded variants (`fsdp`, `fsdp-remat`, `fsdp-cudnn`:
parameters and Adam's state split over the devices) in `sharded`; the step programs they
share in `steps`. The models: as written,
Flax NNX modules (`nnx_mlp`, `nnx_transformer`, `nnx_cnn`, `nnx_lstm`, their shared pieces in
`nnx_common`, the plain NNX program in `nnx_program`); the `jnp` variant's jax.numpy builders
(`mlp`, `transformer`, `cnn`, `lstm`, with `layers`); `families` picks one per trial."""
