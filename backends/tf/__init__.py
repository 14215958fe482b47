"""The tf backend: `tf` (MirroredStrategy, MultiWorkerMirroredStrategy, and the plain program)
in `mirrored`; the Keras models, one module per family (`mlp`, `transformer`, `cnn`, `lstm`),
dispatched by `models`."""
