"""The torch backend: `torch` (DistributedDataParallel, and the plain program) in `ddp`; the
nn.Sequential model in `mlp`."""
