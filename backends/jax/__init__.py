"""The jax backends: `jax` (pmap, and the plain single-device program) in `pmap`, `jax-shardmap`
and `jax-auto` in `shardmap`; the step programs they share in `steps`, the model in `mlp`."""
