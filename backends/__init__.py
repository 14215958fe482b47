"""xbench's built-in backend plugins, installed as the package `xbench_backends`.

One subpackage per framework (`jax`, `tf`, `torch`): each model family in its own module
(`mlp`: what the model is, built from the core's weights) and each way of running a step in
another (`jax.pmap`, `jax.shardmap`, `tf.mirrored`, `torch.ddp`). Each backend class registers
through the `xbench.backends` entry-point group in pyproject.toml, exactly as a third-party
plugin would, and imports its framework only inside functions and methods (absolute imports:
`import jax` in `xbench_backends.jax.pmap` is the real jax, never this package's `jax`).
"""
