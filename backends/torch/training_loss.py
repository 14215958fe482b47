"""The step's forward as one module: a family's model and its loss, `TrainingLoss(batch,
target) -> the scalar loss`. It is what every program runs (eager, or DDP around it) and what
the compiled variants hand to torch.compile, so that the loss (for the transformer the
cross-entropy over every position's logits, upcast to float32) is fused with the forward
instead of running eagerly after it, as the programs experts write compile it.

Imported inside `prepare` only, so torch is imported at the top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class TrainingLoss(nn.Module):
    """forward(batch, target): the mean loss of this rank's batch (float32; float64 in fp64).

    Autocast (bf16) covers the model only, inside this module: the program as written
    computes its loss outside autocast, and so does this one, compiled or not. The loss
    upcasts the output to float32 itself (`families.at_least_float32`), so under autocast too
    it would be the same arithmetic (cross_entropy and mse_loss are on autocast's float32
    list); keeping autocast inside also means the compiled graph does not depend on an
    autocast state set by the caller."""

    def __init__(self, model: nn.Module, loss: Callable[[Any, Any], Any], autocast_dtype=None) -> None:
        super().__init__()
        self.model = model
        self.loss_of = loss
        self.autocast_dtype = autocast_dtype  # None: no autocast

    def forward(self, batch, target):
        if self.autocast_dtype is None:
            output = self.model(batch)
        else:
            with torch.autocast(batch.device.type, dtype=self.autocast_dtype):
                output = self.model(batch)
        return self.loss_of(output, target)
