"""The MLP of the torch backend: an nn.Sequential built from the core's numpy weights (kernel
[in, out] and bias per layer; nn.Linear holds the kernel transposed), its loss, and its
weights (or gradients) read back in the core's layout. How a step runs (DDP, Adam,
torch.compile) is in `ddp`, autocast in `training_loss`; `build` is this family's entry in
`families`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xbench.contract import Work
from xbench_backends.torch.families import Built, at_least_float32


def build(work: Work, device, compute_dtype=None, param_dtype=None) -> Built:
    """The family entry (`families.build`): the nn.Sequential as tuned before the other
    families existed; inputs and targets as the core draws them (float32; the step program
    makes them `param_dtype` where that is float64)."""
    model, linears = build_model(work, device, param_dtype)
    return Built(model=model, canonical=lambda grad=False, lazily=False: layer_tensors(linears, grad), loss=loss)


def build_model(work: Work, device, param_dtype=None):
    """The nn.Sequential (Linear, ReLU, Dropout, ..., Linear) holding the work's initial
    weights on `device` as `param_dtype` (None: float32), in train mode, and its nn.Linear
    layers in order."""
    import torch
    from torch import nn

    layers: list[nn.Module] = []
    linears = []
    for i, (kernel, bias) in enumerate(work.weights):
        linear = nn.utils.skip_init(nn.Linear, kernel.shape[0], kernel.shape[1], device=device,
                                    dtype=param_dtype or torch.float32)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))  # converts to its dtype, exactly
            linear.bias.copy_(torch.from_numpy(bias))
        linears.append(linear)
        layers.append(linear)
        if i < len(work.weights) - 1:
            layers += [nn.ReLU(), nn.Dropout(work.model.dropout)]
    return nn.Sequential(*layers).train(), linears


def loss(pred, target):
    """Mean squared error in float32 (float64 in fp64), the mean over this rank's batch and outputs."""
    import torch.nn.functional as F

    return F.mse_loss(at_least_float32(pred), target)


def layer_tensors(linears, grad: bool = False) -> list[Any]:
    """Kernels (in, out) and biases in layer order, or their gradients: views on the device."""
    tensors = []
    for linear in linears:
        weight, bias = (linear.weight.grad, linear.bias.grad) if grad else (linear.weight, linear.bias)
        tensors += [weight.detach().T, bias.detach()]
    return tensors
