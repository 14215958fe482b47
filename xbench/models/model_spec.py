"""`ModelSpec`: one model of a family and the batch sizes to time, as specs and records hold it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xbench.models import Family, family, params_count, presets, training_flops
from xbench.models.mlp import Mlp

# The seed study's two MLPs, kept here for code that names them; every family's presets
# (gpt2-small, resnet50, ...) are in `xbench.models`.
PRESETS: dict[str, dict[str, Any]] = {name: dict(keys) for name, keys in Mlp.presets.items()}


@dataclass(frozen=True)
class ModelSpec:
    """A model of a family (`xbench.models`) and the batch sizes to time. The MLP keeps its
    shape in named fields (inputs -> widths, ReLU and dropout -> outputs), as records have
    always stored it; other families keep theirs in `dims`, (key, value) pairs by key."""

    name: str
    widths: tuple[int, ...] = ()
    dropout: float = 0.0
    batch_sizes: tuple[int, ...] = ()
    inputs: int = 50
    outputs: int = 3
    family: str = "mlp"
    dims: tuple[tuple[str, int], ...] = ()

    @property
    def shape(self) -> dict[str, Any]:
        """The family's shape keys and their values."""
        if self.family == "mlp":
            return {"widths": self.widths, "inputs": self.inputs, "outputs": self.outputs}
        return dict(self.dims)

    @property
    def kind(self) -> Family:
        """The family object; KeyError when its plugin is not installed here."""
        return family(self.family)

    @property
    def layer_sizes(self) -> tuple[int, ...]:
        return (self.inputs, *self.widths, self.outputs)

    @property
    def params(self) -> int:
        return params_count(self.kind, self.shape)

    @property
    def training_flops_per_sample(self) -> int:
        return self.kind.flops_per_sample(self.shape)

    @property
    def unit(self) -> str:
        """What throughput is counted in: "samples", "tokens", "images"."""
        return self.kind.unit

    @property
    def units_per_sample(self) -> int:
        return self.kind.units_per_sample(self.shape)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ModelSpec:
        """The inverse of `asdict` (records store lists; older records lack family and dims)."""
        raw = dict(raw)
        raw["widths"] = tuple(raw.get("widths", ()))
        raw["batch_sizes"] = tuple(raw.get("batch_sizes", ()))
        raw["dims"] = tuple((str(k), int(v)) for k, v in raw.get("dims", ()))
        return cls(**raw)


def model_table(model: ModelSpec) -> dict[str, Any]:
    """The [[models]] table that `build_spec` turns back into `model` (run.json stores
    `asdict`, which --resume reads back through here)."""
    table: dict[str, Any] = {"name": model.name, "family": model.family, "batch_sizes": list(model.batch_sizes)}
    table.update({key: list(value) if isinstance(value, tuple) else value for key, value in model.shape.items()})
    if model.family == "mlp":
        table["dropout"] = model.dropout
    return table


def preset_model(name: str, **changes: Any) -> ModelSpec:
    """The ModelSpec of a preset of any family (e.g. "gpt2-small"), with `changes` applied to
    its keys (e.g. batch_sizes=(8,)); KeyError for an unknown preset."""
    family_name, keys = presets()[name]
    keys = {**keys, **changes}
    batch_sizes = tuple(keys.pop("batch_sizes", ()))
    dropout = float(keys.pop("dropout", 0.0))
    fam = family(family_name)
    dims: dict[str, Any] = {key: keys.get(key, dim.default) for key, dim in fam.dims.items()}
    if family_name == "mlp":
        return ModelSpec(name=name, widths=tuple(dims["widths"]), dropout=dropout, batch_sizes=batch_sizes,
                         inputs=dims["inputs"], outputs=dims["outputs"])
    return ModelSpec(name=name, batch_sizes=batch_sizes, dropout=dropout, family=family_name,
                     dims=tuple(sorted(dims.items())))


def training_flops_per_sample(layer_sizes: Sequence[int]) -> int:
    """The MLP's model FLOPs of one training step per sample (see `models.training_flops`)."""
    return training_flops([2 * a * b for a, b in zip(layer_sizes[:-1], layer_sizes[1:])])
