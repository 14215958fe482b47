"""The stacked LSTM of the torch backend (the core's `lstm` family): nn.LSTM(batch_first=True,
num_layers=layers), then a dense head on the top layer's last hidden state.

Layout conversions per layer l: the kernel [in, 4 hidden] becomes weight_ih_l{l} [4 hidden,
in] (transposed), the recurrent kernel [hidden, 4 hidden] weight_hh_l{l} (transposed), the
one bias [4 hidden] bias_ih_l{l}. torch's gate order i, f, g, o is the core's, so the gate
blocks keep their places (`GATE_ORDER`). torch adds a second bias, bias_hh_l{l}: it is held at
zero and frozen (requires_grad=False), so that the cell computes the core's x W + h U + b,
Adam never moves it, DDP does not all-reduce it, and the trainable parameter count equals the
core's. The head's kernel [hidden, outputs] becomes nn.Linear's weight (transposed).

Imported by `families.build` only (inside `prepare`), so torch is imported at the top.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xbench.contract import Work
from xbench_backends.torch.families import (
    Built,
    Slot,
    at_least_float32,
    canonical_reader,
    load,
    slots_in_order,
    transposed,
)

# torch's gate block g holds the core's gate GATE_ORDER[g] (i, f, g, o both: the identity).
# Tests patch it (i <-> f) to prove verify fails.
GATE_ORDER = (0, 1, 2, 3)


def build(work: Work, device, compute_dtype=None, param_dtype=None) -> Built:
    dims = work.model.shape
    with torch.device("meta"):  # no initialisation of its own: the core's arrays are loaded next
        model = LstmRegressor(dims["inputs"], dims["hidden"], dims["layers"], dims["outputs"])
    slots = slots_in_order(work, _slots(dims["layers"]))
    zero_second_bias = {f"lstm.bias_hh_l{layer}": torch.zeros(4 * dims["hidden"]) for layer in range(dims["layers"])}
    load(model, work, slots, device, extra=zero_second_bias, param_dtype=param_dtype)
    for layer in range(dims["layers"]):
        model.lstm.get_parameter(f"bias_hh_l{layer}").requires_grad_(False)
    if device.type == "cuda":
        model.lstm.flatten_parameters()  # cuDNN wants one contiguous weight buffer
    return Built(model=model, canonical=canonical_reader(model, slots), loss=loss, notes=_notes(device))


def loss(pred, target):
    """Mean squared error in float32 (float64 in fp64), the mean over this rank's batch and outputs."""
    return F.mse_loss(at_least_float32(pred), target)


def _reorder(gates, order):
    """Gate blocks along the last axis, rearranged: block g of the result is block order[g]."""
    blocks = gates.chunk(4, dim=-1)
    return torch.cat([blocks[g] for g in order], dim=-1)


def _inverse(order) -> tuple[int, ...]:
    return tuple(sorted(range(len(order)), key=lambda g: order[g]))


def gate_kernel(name: str) -> Slot:
    """A kernel [in, 4 hidden] -> torch's [4 hidden, in], gate blocks placed by GATE_ORDER
    (read when the slot is made, so a patched order applies both ways)."""
    order = GATE_ORDER
    return Slot(name, lambda t: _reorder(t, order).T, lambda t: _reorder(t.T, _inverse(order)))


def gate_bias(name: str) -> Slot:
    order = GATE_ORDER
    return Slot(name, lambda t: _reorder(t, order), lambda t: _reorder(t, _inverse(order)))


def _slots(layers: int) -> dict[str, Slot]:
    """Canonical name -> where it lives in `LstmRegressor`, with the layout conversion."""
    slots = {}
    for layer in range(layers):
        slots[f"lstm{layer}.kernel"] = gate_kernel(f"lstm.weight_ih_l{layer}")
        slots[f"lstm{layer}.recurrent"] = gate_kernel(f"lstm.weight_hh_l{layer}")
        slots[f"lstm{layer}.bias"] = gate_bias(f"lstm.bias_ih_l{layer}")
    return {**slots, "head.kernel": transposed("head.weight"), "head.bias": Slot("head.bias")}


class LstmRegressor(nn.Module):
    def __init__(self, inputs: int, hidden: int, layers: int, outputs: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(inputs, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, outputs)

    def forward(self, x):
        sequence, _ = self.lstm(x)  # h and c start at zero
        return self.head(sequence[:, -1])


def _notes(device) -> tuple[str, ...]:
    if device.type == "cuda" and torch.backends.cudnn.enabled:
        kernel = f"cuDNN LSTM (cuDNN {torch.backends.cudnn.version()})"
    elif device.type == "cuda":
        kernel = "torch's native CUDA LSTM (cuDNN disabled)"
    else:
        kernel = "aten's native CPU LSTM (no cuDNN)"
    return (f"nn.LSTM: {kernel}; bias_hh held at zero and frozen (requires_grad=False)",)
