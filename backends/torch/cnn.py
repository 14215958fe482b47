"""The ResNet v1.5 of the torch backend (the core's `cnn` family), built convolution by
convolution from the core's own list (`xbench.models.cnn.convolutions`), so both agree on
every shape, stride and order.

Layout conversions: convolution kernels HWIO [kh, kw, in, out] become torch's OIHW
(`permute(3, 2, 0, 1)`; read back with `permute(2, 3, 1, 0)`); the head's kernel [in, out]
becomes nn.Linear's weight [out, in]; BatchNorm scale and bias are its weight and bias. Images
NHWC (the core's) are permuted to NCHW once, when the data is placed on the device, outside
the timed step; activations stay in torch's default (contiguous NCHW) memory format.

With `channels_last` (the tuned variants) the shapes stay NCHW/OIHW but the memory is laid out
channels last, as `model.to(memory_format=torch.channels_last)` does: the convolution kernels
are stored OHWI, and the images are placed as the core's NHWC array viewed as NCHW (no copy),
so that each batch is channels-last contiguous and the convolutions and activations follow.
Shapes, values and the canonical readback (a permuted view, copied out) are unchanged.

Padding is explicit and symmetric, as the core fixes it: 3 on every side for the 7x7 stem,
1 for 3x3 convolutions and the max pool, none for 1x1. BatchNorm2d in training mode with
eps 1e-5 and momentum 0.1 (torch's convention, the core's); each rank normalises with its own
batch's statistics (no SyncBatchNorm) and keeps its own running statistics, both in the
parameters' dtype (float64 in fp64).

Imported by `families.build` only (inside `prepare`), so torch is imported at the top.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from xbench.contract import Work
from xbench.contract import cnn as core_cnn
from xbench_backends.torch.families import (
    Built,
    Slot,
    at_least_float32,
    canonical_reader,
    load,
    slots_in_order,
    transposed,
)

# The core's fixed choices, as module names that tests patch to prove verify fails.
BATCH_NORM_EPSILON = core_cnn.BATCH_NORM_EPSILON
BATCH_NORM_MOMENTUM = core_cnn.BATCH_NORM_MOMENTUM
MAX_POOL_PADDING = 1


def build(work: Work, device, compute_dtype=None, param_dtype=None, channels_last: bool = False) -> Built:
    dims = work.model.shape
    convs = list(core_cnn.convolutions(dims))
    with torch.device("meta"):  # no initialisation of its own: the core's arrays are loaded next
        model = ResNet(convs, core_cnn.final_features(dims), dims["classes"])
    slots = slots_in_order(work, _slots(convs))
    load(model, work, slots, device, extra=_running_statistics(model), param_dtype=param_dtype)
    if channels_last:
        # Before DDP and Adam see the parameters: DDP lays its gradient buckets out with each
        # parameter's strides, and Adam's state copies them (the parameters stay the same objects).
        model.to(memory_format=torch.channels_last)
    return Built(model=model, canonical=canonical_reader(model, slots), loss=loss,
                 place_inputs=_nchw_channels_last if channels_last else _nchw,
                 place_targets=lambda labels: labels.long(),
                 notes=_notes(device, param_dtype or torch.float32, channels_last))


def loss(logits, labels):
    """Softmax cross-entropy in float32 (float64 in fp64), the mean over this rank's images."""
    return F.cross_entropy(at_least_float32(logits), labels)


def _nchw(images):
    """[..., H, W, C] -> [..., C, H, W], contiguous (a copy, once, at placement)."""
    return images.movedim(-1, -3).contiguous()


def _nchw_channels_last(images):
    """[batches, N, H, W, C] -> [batches, N, C, H, W] as a view of the NHWC memory: each
    batch [N, C, H, W] is then channels-last contiguous (torch.channels_last is defined for
    4-d tensors only, so the stack of batches cannot be converted with it)."""
    return images.contiguous().movedim(-1, -3)


def hwio_to_oihw(kernel):
    return kernel.permute(3, 2, 0, 1)


def oihw_to_hwio(weight):
    return weight.permute(2, 3, 1, 0)


def _module_path(conv_name: str) -> str:
    """Where the core's convolution lives in `ResNet`: "stem.conv" -> "stem",
    "s1.b0.conv2" -> "blocks.s1_b0.main.conv2", "s1.b0.down.conv" -> "blocks.s1_b0.down"."""
    if conv_name == "stem.conv":
        return "stem"
    stage, block, role = conv_name.split(".", 2)
    return f"blocks.{stage}_{block}." + ("down" if role == "down.conv" else f"main.{role}")


def _slots(convs: list[core_cnn.Conv]) -> dict[str, Slot]:
    """Canonical name -> where it lives in `ResNet`, with the layout conversion."""
    slots = {}
    for conv in convs:
        path = _module_path(conv.name)
        slots[f"{conv.name}.kernel"] = Slot(f"{path}.conv.weight", hwio_to_oihw, oihw_to_hwio)
        slots[f"{conv.bn}.scale"] = Slot(f"{path}.bn.weight")
        slots[f"{conv.bn}.bias"] = Slot(f"{path}.bn.bias")
    return {**slots, "head.kernel": transposed("head.weight"), "head.bias": Slot("head.bias")}


def _running_statistics(model) -> dict[str, torch.Tensor]:
    """BatchNorm's fresh buffers (mean 0, variance 1, no batches seen): state without a
    canonical array."""
    state = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            state[f"{name}.running_mean"] = torch.zeros(module.num_features)
            state[f"{name}.running_var"] = torch.ones(module.num_features)
            state[f"{name}.num_batches_tracked"] = torch.tensor(0, dtype=torch.long)
    return state


class ConvBn(nn.Module):
    """A convolution without bias (symmetric padding kernel // 2), then its BatchNorm."""

    def __init__(self, conv: core_cnn.Conv) -> None:
        super().__init__()
        self.conv = nn.Conv2d(conv.inputs, conv.outputs, conv.kernel, stride=conv.stride, padding=conv.padding,
                              bias=False)
        self.bn = nn.BatchNorm2d(conv.outputs, eps=BATCH_NORM_EPSILON, momentum=BATCH_NORM_MOMENTUM)

    def forward(self, x):
        return self.bn(self.conv(x))


class Block(nn.Module):
    """Basic (conv1, conv2) or bottleneck (conv1, conv2, conv3) block: ReLU between its
    convolutions, the shortcut (the projection `down` where the shape changes) added, ReLU."""

    def __init__(self, main: list[core_cnn.Conv], down: core_cnn.Conv | None) -> None:
        super().__init__()
        self.main = nn.ModuleDict(OrderedDict((c.name.rsplit(".", 1)[1], ConvBn(c)) for c in main))
        self.down = None if down is None else ConvBn(down)

    def forward(self, x):
        out = x
        for i, layer in enumerate(self.main.values()):
            out = layer(out) if i == 0 else layer(F.relu(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, convs: list[core_cnn.Conv], features: int, classes: int) -> None:
        super().__init__()
        stem, rest = convs[0], convs[1:]
        self.stem = ConvBn(stem)
        self.pool = nn.MaxPool2d(3, stride=2, padding=MAX_POOL_PADDING)
        blocks: dict[str, dict[str, list[core_cnn.Conv]]] = {}
        for conv in rest:
            stage, block, role = conv.name.split(".", 2)
            parts = blocks.setdefault(f"{stage}_{block}", {"main": [], "down": []})
            parts["down" if role == "down.conv" else "main"].append(conv)
        self.blocks = nn.Sequential(OrderedDict(
            (tag, Block(parts["main"], parts["down"][0] if parts["down"] else None)) for tag, parts in blocks.items()))
        self.head = nn.Linear(features, classes)

    def forward(self, images):
        x = self.pool(F.relu(self.stem(images)))
        x = self.blocks(x).mean(dim=(2, 3))  # global average pool
        return self.head(x)


def _notes(device, param_dtype, channels_last: bool) -> tuple[str, ...]:
    memory_format = ("channels-last memory format (NCHW shapes, NHWC strides)" if channels_last
                     else "NCHW contiguous memory format")
    if device.type == "cuda":
        convolutions_note = (f"convolutions: cuDNN {torch.backends.cudnn.version()} (enabled="
                             f"{torch.backends.cudnn.enabled}, benchmark={torch.backends.cudnn.benchmark}), "
                             + memory_format)
        if channels_last and param_dtype == torch.float64:
            # torch asks cuDNN for NHWC only below float64 (cudnn_conv_suggest_memory_format).
            convolutions_note += "; float64 convolutions run NCHW all the same"
    else:
        # oneDNN has no float64 convolution: torch runs those with its own kernels.
        onednn = (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
                  and param_dtype != torch.float64)
        convolutions_note = ("convolutions: " + ("oneDNN (mkldnn)" if onednn else "aten's native CPU kernels")
                             + ", " + memory_format)
    return (convolutions_note,
            f"BatchNorm2d(eps={BATCH_NORM_EPSILON:g}, momentum={BATCH_NORM_MOMENTUM:g}) in training mode: each "
            "rank's own batch statistics (no SyncBatchNorm), running statistics kept per rank (not broadcast)")
