"""`cnn`: ResNet v1.5 (the common reference implementations' and MLPerf's: a downsampling block strides on its 3x3
convolution, not on the first 1x1), NHWC, BatchNorm in training mode; softmax cross-entropy
over `classes` on random labels.

Fixed choices every backend follows (docs/model-families.md says where frameworks differ):
- Stem: 7x7 convolution, stride 2, padding 3 on every side; BatchNorm, ReLU; 3x3 max pool,
  stride 2, padding 1 on every side (explicit symmetric padding: "SAME" pads only the end
  for a stride of 2). Other convolutions: 3x3 with padding 1, 1x1 with none; no biases.
- Blocks: basic (two 3x3, depth 10, 18 and 34) or bottleneck (1x1, 3x3, 1x1 to 4x, depth 26,
  50, 101, 152); a projection shortcut (1x1 convolution with the block's stride, BatchNorm)
  where the shape changes; ReLU after the sum. Global average pool, then a dense head.
- BatchNorm: epsilon 1e-5, statistics of the batch each device holds (no cross-device
  synchronisation, as each framework does by default), running averages kept with
  momentum 0.1 as the weight of the new batch (0.9 as the weight of the old value, in the
  other convention); they do not change the
  training loss.

Canonical layout: convolution kernels HWIO [kh, kw, in, out]; in order: stem.conv.kernel,
stem.bn.scale, stem.bn.bias, then per block s{stage}.b{block}: conv1.kernel, bn1.scale,
bn1.bias, conv2..., bn2..., (bottleneck: conv3..., bn3...), (projection: down.conv.kernel,
down.bn.scale, down.bn.bias); head.kernel [features, classes], head.bias.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from xbench.models import Dim, Param, glorot_uniform, training_flops

BATCH_NORM_EPSILON = 1e-5
BATCH_NORM_MOMENTUM = 0.1  # the weight of the new batch's statistics
STAGE_WIDTHS = (64, 128, 256, 512)
BLOCKS = {10: (1, 1, 1, 1), 18: (2, 2, 2, 2), 26: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3),
          152: (3, 8, 36, 3)}
BOTTLENECK_DEPTHS = (26, 50, 101, 152)
MIN_IMAGE = 32  # the stem and four stages divide the image by 32


@dataclass(frozen=True)
class Conv:
    """One convolution of the network, in order, with the spatial size of its output."""

    name: str  # e.g. "s1.b0.conv2", "stem.conv", "s2.b0.down.conv"
    kernel: int
    stride: int
    inputs: int
    outputs: int
    out_size: int
    bn: str  # the BatchNorm that follows it

    @property
    def padding(self) -> int:
        return self.kernel // 2


class ResNet:
    name: ClassVar[str] = "cnn"
    unit: ClassVar[str] = "images"
    loss: ClassVar[str] = "softmax cross-entropy over the classes"
    batch_statistics: ClassVar[bool] = True
    # verify runs it small: see xbench.results.checks.verification_model (the parameters are the same)
    verification_dims: ClassVar[Mapping[str, int]] = {"image": MIN_IMAGE}
    verification_per_device: ClassVar[int] = 8  # images per device: fewer, and 10 steps amplify rounding
    verification_precision: ClassVar[str] = "fp64"  # fp32 gradients are too ill-conditioned: xbench.results.checks
    dims: ClassVar[Mapping[str, Dim]] = {
        "depth": Dim(10, 152, None, f"ResNet depth, one of {', '.join(map(str, BLOCKS))}"),
        "image": Dim(1, 100_000, None, "image height and width in pixels"),
        "channels": Dim(1, 1_000, 3, "image channels"),
        "classes": Dim(2, 1_000_000, None, "classes of the head"),
    }
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "resnet18": {"depth": 18, "image": 32, "classes": 10, "batch_sizes": (32, 128)},  # CIFAR-sized
        "resnet50": {"depth": 50, "image": 224, "classes": 1000, "batch_sizes": (64, 256)},  # ImageNet-sized
    }

    def verification_reduce(self, dims: Mapping[str, int]) -> dict[str, int]:
        """Two blocks a stage, of the model's kind (each stage's second block has no
        projection): depth 26 for a bottleneck network, 18 for a basic one. Compiling
        ResNet-50's step at full depth (a compiled variant, float64) took about a minute a run
        on an H200; the full-size probe runs every block."""
        return {**dims, "depth": min(dims["depth"], 26 if bottleneck(dims) else 18)}

    def check(self, dims: Mapping[str, Any]) -> None:
        if dims["depth"] not in BLOCKS:
            raise ValueError(f"depth {dims['depth']} is not a ResNet depth; choose one of "
                             f"{', '.join(map(str, BLOCKS))}")
        if dims["image"] < MIN_IMAGE:
            raise ValueError(f"image {dims['image']} is too small for the ResNet stem and its four stages, "
                             f"which divide it by 32; use image >= {MIN_IMAGE}")

    def parameters(self, dims: Mapping[str, Any]) -> list[Param]:
        params = []
        for conv in convolutions(dims):
            params += [Param(f"{conv.name}.kernel", (conv.kernel, conv.kernel, conv.inputs, conv.outputs)),
                       Param(f"{conv.bn}.scale", (conv.outputs,)), Param(f"{conv.bn}.bias", (conv.outputs,))]
        features = final_features(dims)
        return params + [Param("head.kernel", (features, dims["classes"])), Param("head.bias", (dims["classes"],))]

    def init(self, dims: Mapping[str, Any], rng: np.random.Generator) -> list[np.ndarray]:
        """The reference ResNet's: He-normal convolutions (fan-out), BatchNorm scale 1 and bias 0; the
        head Glorot-uniform with a zero bias."""
        arrays = []
        for param in self.parameters(dims):
            if param.name == "head.kernel":
                fan_in, fan_out = param.shape
                arrays.append(glorot_uniform(rng, fan_in, fan_out, param.shape))
            elif param.name.endswith(".kernel"):
                kh, kw, _, out = param.shape
                std = np.sqrt(2.0 / (kh * kw * out))
                arrays.append((rng.standard_normal(param.shape, dtype=np.float32) * np.float32(std)))
            elif param.name.endswith(".scale"):
                arrays.append(np.ones(param.shape, np.float32))
            else:
                arrays.append(np.zeros(param.shape, np.float32))
        return arrays

    def data(self, dims: Mapping[str, Any], samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        images = rng.standard_normal((samples, dims["image"], dims["image"], dims["channels"]), dtype=np.float32)
        labels = rng.integers(0, dims["classes"], size=samples, dtype=np.int32)
        return images, labels

    def flops_per_sample(self, dims: Mapping[str, Any]) -> int:
        """Every convolution (2 x output pixels x kernel area x in x out) and the head; the
        stem needs no input gradient."""
        forward = [2 * c.out_size ** 2 * c.kernel ** 2 * c.inputs * c.outputs for c in convolutions(dims)]
        return training_flops([*forward, 2 * final_features(dims) * dims["classes"]])

    def largest_activation(self, dims: Mapping[str, Any]) -> tuple[int, str]:
        stem = conv_out(dims["image"], 7, 2)
        return STAGE_WIDTHS[0] * stem * stem, "stem activations"

    def units_per_sample(self, dims: Mapping[str, Any]) -> int:
        return 1


def bottleneck(dims: Mapping[str, Any]) -> bool:
    return dims["depth"] in BOTTLENECK_DEPTHS


def final_features(dims: Mapping[str, Any]) -> int:
    return STAGE_WIDTHS[-1] * (4 if bottleneck(dims) else 1)


def conv_out(size: int, kernel: int, stride: int) -> int:
    return (size + 2 * (kernel // 2) - kernel) // stride + 1


def convolutions(dims: Mapping[str, Any]) -> Iterator[Conv]:
    """The network's convolutions in canonical order, with their shapes."""
    size = conv_out(dims["image"], 7, 2)
    yield Conv("stem.conv", 7, 2, dims["channels"], STAGE_WIDTHS[0], size, "stem.bn")
    size = conv_out(size, 3, 2)  # the max pool
    channels = STAGE_WIDTHS[0]
    expansion = 4 if bottleneck(dims) else 1
    for stage, (width, blocks) in enumerate(zip(STAGE_WIDTHS, BLOCKS[dims["depth"]])):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            tag = f"s{stage}.b{block}"
            out_size = conv_out(size, 3, stride)
            if expansion == 4:
                yield Conv(f"{tag}.conv1", 1, 1, channels, width, size, f"{tag}.bn1")
                yield Conv(f"{tag}.conv2", 3, stride, width, width, out_size, f"{tag}.bn2")
                yield Conv(f"{tag}.conv3", 1, 1, width, width * 4, out_size, f"{tag}.bn3")
            else:
                yield Conv(f"{tag}.conv1", 3, stride, channels, width, out_size, f"{tag}.bn1")
                yield Conv(f"{tag}.conv2", 3, 1, width, width, out_size, f"{tag}.bn2")
            if stride != 1 or channels != width * expansion:
                yield Conv(f"{tag}.down.conv", 1, stride, channels, width * expansion, out_size, f"{tag}.down.bn")
            channels, size = width * expansion, out_size
