"""The tf backend: `tf` (MirroredStrategy, MultiWorkerMirroredStrategy, and the plain program)
in `mirrored`; the Keras model in `mlp`."""
