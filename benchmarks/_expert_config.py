"""expert_loops.py's shared pieces: the mark of the children's record lines, the settings of
the work and the models (seed, learning rates, normalisation, the ResNet's stages), the
configurations (a preset at a global batch, in a precision), the types of its programs (xbench's,
and the minimal loops with what they are built from), and the MLP loops' check."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MARK = "EXPERT-LOOPS-JSON "  # the children's record lines start with this
SEED = 0
LAYER_NORM_EPSILON = 1e-5
BATCH_NORM_EPSILON = 1e-5
BATCH_NORM_MOMENTUM = 0.1  # the weight of the new batch (torch's convention; flax's 0.9 is the old one's)
# The learning rate of configs/families.toml for the models teams train; the MLPs keep
# xbench's default (and overhead.py's minimal loops').
LEARNING_RATE = {"mlp": 1e-3}
DEFAULT_LEARNING_RATE = 1e-4
RESNET_STAGES = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
RESNET_WIDTHS = (64, 128, 256, 512)


# -- configurations ------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """One configuration: a preset of any family at a global batch, in a precision."""

    preset: str
    batch: int
    precision: str
    image: int | None = None  # the cnn's image size where not the preset's (--image)

    @property
    def label(self) -> str:
        return f"{self.preset}@{self.batch}" + (f" {self.image}px" if self.image else "")

    def model(self):
        from xbench.models.model_spec import preset_model

        changes = {"image": self.image} if self.image else {}
        return preset_model(self.preset, batch_sizes=(self.batch,), **changes)


MODEL_GROUPS: dict[str, tuple[Config, ...]] = {
    "gpt2-small": (Config("gpt2-small", 16, "bf16"),),
    "resnet50": (Config("resnet50", 256, "bf16"),),
    "mlp": (Config("medium", 128, "tf32"), Config("large", 65536, "tf32")),
    "medium": (Config("medium", 128, "tf32"),),
    "large": (Config("large", 65536, "tf32"),),
    # CPU-sized, for the smoke test: the tiny transformer, ResNet-18 at 32 x 32 (8 images a step)
    "transformer-tiny": (Config("transformer-tiny", 8, "bf16"),),
    "resnet18": (Config("resnet18", 8, "bf16"),),
}
GPU_MODELS = ("gpt2-small", "resnet50", "mlp")
CPU_MODELS = ("transformer-tiny", "resnet18", "medium")
DEFAULT_PRECISION = {"transformer": "bf16", "cnn": "bf16"}  # others: tf32 (a PRESET:BATCH model)


def parse_model(text: str) -> tuple[str, tuple[Config, ...]]:
    """A group of MODEL_GROUPS, or PRESET:BATCH for any preset (bf16 for transformers and
    CNNs, tf32 otherwise)."""
    from xbench.models import presets

    if text in MODEL_GROUPS:
        return text, MODEL_GROUPS[text]
    preset, _, batch = text.partition(":")
    if preset not in presets() or not batch.isdigit() or int(batch) < 1:
        raise argparse.ArgumentTypeError(f"model {text!r}: one of {', '.join(MODEL_GROUPS)}, or PRESET:BATCH "
                                         f"with PRESET one of {', '.join(presets())}")
    family = presets()[preset][0]
    return text, (Config(preset, int(batch), DEFAULT_PRECISION.get(family, "tf32")),)


def overridden(config: Config, precision: str | None, image: int | None) -> Config:
    """The configuration with --precision and (for a CNN) --image applied; the preset's own
    image size is no change (the acceptance checks still apply)."""
    from xbench.models import presets

    family, keys = presets()[config.preset]
    image = image if image and family == "cnn" else config.image
    return Config(config.preset, config.batch, precision or config.precision,
                  None if image == keys.get("image") else image)


def default_samples(family: str, batch: int) -> int:
    """Rows of data: overhead.py's 4096 for the MLPs, families.toml's 512 otherwise, and at
    least two global batches (xbench.contract.work caps what does not fit its memory budget)."""
    return max(4096 if family == "mlp" else 512, 2 * batch)


# -- the programs --------------------------------------------------------------------------

@dataclass(frozen=True)
class XbenchProgram:
    """One of xbench's programs: a backend variant, single-device ("plain") by default."""

    variant: str
    program: str = "plain"
    families: tuple[str, ...] | None = None  # in the default lineup only for these (None: all)
    compiles: bool = True  # its first call compiles (decides the deadline's estimate)
    slow_on_cpu: bool = False  # torch.compile takes minutes on a small CPU host: off there by default

    def name(self, backend: str) -> str:
        """xbench's name for it ("jax plain+cudnn"), the data-parallel program said outright
        (xbench calls it plain "jax")."""
        from xbench.contract import DATA_PARALLEL, implementation

        name = implementation(backend, self.variant, self.program)
        return f"{name} (data-parallel, 1 device)" if self.program == DATA_PARALLEL else name


@dataclass(frozen=True)
class Loop:
    """A minimal loop, built: `run(steps)` returns after the device finished them."""

    run: Callable[[int], None]
    params: int
    notes: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    last_loss: Callable[[], float] | None = None  # the loss of the last step run (reads the device)


@dataclass(frozen=True)
class LoopContext:
    """What a minimal loop is built from: the core's work and the configuration."""

    work: Any
    batch: int
    precision: str
    learning_rate: float
    device: Any  # a jax Device or a torch.device
    platform: str  # "gpu" or "cpu"


@dataclass(frozen=True)
class MinimalProgram:
    name: str
    family: str
    build: Callable[[LoopContext], Loop]
    compiles: bool = True
    slow_on_cpu: bool = False
    gpu_only: bool = False


class Unavailable(Exception):
    """A minimal loop that cannot run here (cuDNN attention on a CPU, ...): the reason."""


def check_mlp_loop(ctx: LoopContext, overhead) -> None:
    if ctx.precision not in overhead.JAX_PRECISION:
        raise Unavailable(f"overhead.py's minimal MLP loops run in {', '.join(overhead.JAX_PRECISION)}, "
                          f"not {ctx.precision}")
    if ctx.learning_rate != overhead.LEARNING_RATE:
        raise ValueError(f"overhead.py's loops use learning rate {overhead.LEARNING_RATE}, not {ctx.learning_rate}")
