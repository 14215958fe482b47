"""`xbench models`: the model families and their presets, with what xbench counts of each."""

from __future__ import annotations

from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from xbench.cli.consoles import data_console
from xbench.cli.layout import table_or_stacked
from xbench.models import broken_families, families
from xbench.models.memory import SHARDED_FAMILIES, GiB, per_device_table
from xbench.models.model_spec import ModelSpec, preset_model
from xbench.report.words import flops_text

COLUMNS = ("preset", "family", "parameters", "FLOP per sample", "unit", "shape", "batch sizes", "memory per device")
# Memory per device (`xbench.models.memory`): training state and activations in bf16 at one
# sample per device, replicated on 1 device, then sharded (fsdp) over 2, 4 and 8.
MEMORY_PRECISION, MEMORY_PER_DEVICE_BATCH, MEMORY_SHARDED_OVER = "bf16", 1, (2, 4, 8)
IDENTIFYING = ("preset", "family")  # never wrapped nor cut: a user copies them into --model


def models() -> int:
    """List model presets (use with --model): family, parameters, training FLOPs, shape."""
    console = data_console()
    console.print(models_table(preset_rows(), console.width))
    return 0


def preset_rows() -> list[tuple[str, ...]]:
    """One row of COLUMNS per preset of every family, and one per family that failed to load."""
    found = []
    for name, fam in families().items():
        for preset in getattr(fam, "presets", {}):
            try:
                found.append(_preset_row(name, preset))
            except Exception as err:  # a plugin family's bug is its row's reason, never a traceback
                found.append((preset, name, "", "", "", f"[red]{escape(f'{type(err).__name__}: {err}')}[/]", "", ""))
    for name, why in broken_families().items():
        found.append(("", f"[red]{escape(name)}[/]", "", "", "", f"[red]failed to load: {escape(why)}[/]", "", ""))
    return found


def models_table(rows: list[tuple[str, ...]], width: int) -> RenderableType:
    """The presets as a table where their names fit whole at `width` columns, else one block per
    preset: its name and family on one line, the other columns under it."""
    table = Table(title="xbench model presets (families: entry-point group xbench.families); memory per device: "
                        "an estimate of bf16 training at 1 sample per device, replicated, then sharded (fsdp) "
                        "over 2, 4 and 8 devices", title_justify="left")
    for column in COLUMNS:
        table.add_column(column, justify="right" if column in ("parameters", "FLOP per sample") else "left",
                         no_wrap=column in IDENTIFYING)
    for row in rows:
        table.add_row(*row)
    blocks = [(f"[bold]{escape(row[0])}[/] ({row[1]})" if row[0] else row[1], _details(row)) for row in rows]
    return table_or_stacked(table, width, blocks)


def _details(row: tuple[str, ...]) -> list[str]:
    _, _, params, flops, unit, shape, batches, memory = row
    facts = ", ".join(part for part in (params and f"{params} parameters", flops and f"{flops} per sample",
                                        unit and f"throughput in {unit}") if part)
    return [line for line in (facts, shape and f"shape: {shape}", batches and f"batch sizes: {batches}",
                              memory and f"memory per device (bf16, 1 sample each): {memory}")
            if line]


def _preset_row(family_name: str, preset: str) -> tuple[str, ...]:
    model = preset_model(preset)
    shape = ", ".join(f"{k}={'x'.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in model.shape.items())
    unit = model.unit if model.units_per_sample == 1 else f"{model.unit} ({model.units_per_sample}/sample)"
    return (preset, family_name, f"{model.params:,}", flops_text(model.training_flops_per_sample), unit, shape,
            ", ".join(map(str, model.batch_sizes)), memory_text(model))


def memory_text(model: ModelSpec) -> str:
    """Memory per device at the MEMORY_ settings above: "28.5 GiB; fsdp 2/4/8: 17.5/11.7/8.8 GiB"; replicated
    only for a family the sharded programs do not build; the state alone for a family whose
    activations are not modelled."""
    table = per_device_table(model.family, model.shape, model.params, MEMORY_PER_DEVICE_BATCH,
                             MEMORY_SHARDED_OVER, MEMORY_PRECISION)
    first, *sharded = table.values()
    if first.activations is None:
        return f"{_size(first.state)} (state only)"
    if model.family not in SHARDED_FAMILIES:
        return f"{_size(first.total)} (replicated)"
    unit = "GiB" if first.total >= GiB / 10 else "MiB"
    return f"{_size(first.total)}; fsdp 2/4/8: " + "/".join(_size(e.total, unit) for e in sharded) + f" {unit}"


def _size(nbytes: int, unit: str | None = None) -> str:
    """In GiB, or MiB under a tenth of one; with its unit unless `unit` names the one to use."""
    chosen = unit or ("GiB" if nbytes >= GiB / 10 else "MiB")
    value = f"{nbytes / (GiB if chosen == 'GiB' else 2**20):.1f}"
    return value if unit else f"{value} {chosen}"
