"""The torch backend: `torch` (DistributedDataParallel, and the plain program) in `ddp`; each
family's model in its module (`mlp`, `transformer`, `cnn`, `lstm`, dispatched by `families`);
the model and its loss as the one module every program runs in `training_loss`."""
