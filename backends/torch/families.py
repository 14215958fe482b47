"""What the step programs of `ddp` need from a model family, and the dispatch by family name.

Each family module (`mlp`, `transformer`, `cnn`, `lstm`) has `build(work, device,
compute_dtype, param_dtype) -> Built`: the nn.Module holding the core's initial arrays, converted
into torch's layout (and from float32 to `param_dtype`, float64 for the "fp64" precision), and the
means to read them (or their gradients) back in the core's canonical order and layout. The
non-MLP families describe where each canonical array lives with a `Slot`; the MLP keeps its own
tuned code path. The families with convolutions (`CONVOLUTIONAL`) also build in the
channels-last memory format (`channels_last=True`), as the tuned variants ask. No torch is
imported at import time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FAMILIES = ("mlp", "transformer", "cnn", "lstm")
CONVOLUTIONAL = ("cnn",)  # the families whose build takes channels_last (a memory format of convolutions)


def _same(tensor):
    return tensor


@dataclass(frozen=True)
class Built:
    """A family's model on the device and how the step program talks to it."""

    model: Any  # the nn.Module, in train mode
    canonical: Callable[..., Any]  # views of the weights (False) or gradients (True), canonical layout
    # The mean loss of this rank's batch (float32, float64 in fp64): loss(output, targets).
    loss: Callable[[Any, Any], Any]
    place_inputs: Callable[[Any], Any] = _same  # the inputs on the device -> the model's layout and dtype
    place_targets: Callable[[Any], Any] = _same
    notes: tuple[str, ...] = field(default=())  # which fused kernels torch picks, as far as can be read

    @property
    def trainable(self) -> list[Any]:
        """The parameters Adam updates and DDP all-reduces (frozen ones, such as the LSTM's
        second bias, left out); each shared one once (the tied embedding)."""
        return [p for p in self.model.parameters() if p.requires_grad]


@dataclass(frozen=True)
class Slot:
    """Where one canonical array lives in a torch model: the parameter's name there, and the
    layout conversions both ways (canonical -> torch when loading, torch -> canonical when
    reading weights or gradients back)."""

    name: str
    to_torch: Callable[[Any], Any] = _same
    to_canonical: Callable[[Any], Any] = _same


def transposed(name: str) -> Slot:
    """A dense kernel: canonical [in, out], nn.Linear's weight [out, in]."""
    return Slot(name, lambda t: t.T, lambda t: t.T)


def build(work, device, compute_dtype=None, param_dtype=None, channels_last: bool = False) -> Built:
    """The model of the work's family; ValueError for a family torch does not build.
    `compute_dtype`: autocast's (None: none); `param_dtype`: the parameters', buffers' and
    so the whole step's floating dtype (None: float32, the core's); `channels_last`: the
    model and its inputs in the channels-last memory format (`CONVOLUTIONAL` families only)."""
    family = work.model.family
    if family not in FAMILIES:
        raise ValueError(f"the torch backend builds the families {', '.join(FAMILIES)}, not {family!r}")
    module = importlib.import_module(f"{__package__}.{family}")
    if not channels_last:
        return module.build(work, device, compute_dtype, param_dtype)
    reason = channels_last_unsupported(family)
    if reason:
        raise ValueError(reason)
    return module.build(work, device, compute_dtype, param_dtype, channels_last=True)


def checkpoint_blocks(model) -> str:
    """The remat variant: each block of a built transformer under torch.utils.checkpoint;
    what it did, for the notes."""
    from xbench_backends.torch import transformer

    return transformer.checkpoint_blocks(model)


def channels_last_unsupported(family: str) -> str | None:
    """Why the channels-last memory format does nothing for `family`, or None where it applies."""
    if family in CONVOLUTIONAL:
        return None
    return f"channels-last changes only convolutions; the {family} family has none"


def at_least_float32(tensor):
    """The model's output as the loss takes it: bf16 (autocast) promoted to float32, float32
    and float64 as they are (`float()` would round a float64 output to float32)."""
    import torch

    return tensor if tensor.dtype == torch.float64 else tensor.float()


def load(model, work, slots: Sequence[Slot], device, extra: Mapping[str, Any] | None = None,
         param_dtype=None) -> None:
    """Fill `model` (built on the meta device: no initialisation of its own) on `device`:
    slot i receives the work's canonical array i in torch's layout; `extra` holds the state
    that has no canonical array (BatchNorm's running statistics, the LSTM's zero second bias).
    The floating parameters and buffers are made `param_dtype` first (None: float32): the
    core's float32 arrays are then copied into them, exactly (float32 -> float64 is exact).
    strict: every parameter and buffer must be given exactly once."""
    import torch

    if len(slots) != len(work.arrays):
        raise ValueError(f"{len(slots)} torch parameters for {len(work.arrays)} canonical arrays")
    state = dict(extra or {})
    for slot, array in zip(slots, work.arrays):
        state[slot.name] = slot.to_torch(torch.from_numpy(np.asarray(array)))
    model.to(dtype=param_dtype or torch.float32)  # on the meta device: no data moves; integer buffers stay
    model.to_empty(device=device)
    with torch.no_grad():
        model.load_state_dict(state, strict=True)  # copy_ into each: converts to its dtype
    model.train()


def canonical_reader(model, slots: Sequence[Slot]) -> Callable[..., Any]:
    """`canonical(grad, lazily=False)`: the slots' parameters (or gradients) in canonical order
    and layout, as views on the device; `lazily`, an iterator that makes each as it is read."""
    params = [model.get_parameter(slot.name) for slot in slots]

    def canonical(grad: bool = False, lazily: bool = False) -> Any:
        found = (slot.to_canonical((p.grad if grad else p).detach()) for slot, p in zip(slots, params))
        return found if lazily else list(found)

    return canonical


def slots_in_order(work, by_name: Mapping[str, Slot]) -> list[Slot]:
    """The slots in the work's canonical order; KeyError names a canonical array the torch
    model has no place for (the two descriptions disagree)."""
    return [by_name[param.name] for param in work.parameters]
