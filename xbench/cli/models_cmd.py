"""`xbench models`: the model families and their presets, with what xbench counts of each."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from xbench.cli.consoles import data_console
from xbench.models import broken_families, families
from xbench.models.model_spec import preset_model
from xbench.report.words import flops_text


def models() -> int:
    """List model presets (use with --model): family, parameters, training FLOPs, shape."""
    table = Table(title="xbench model presets (families: entry-point group xbench.families)", title_justify="left")
    for column in ("preset", "family", "parameters", "FLOP per sample", "unit", "shape", "batch sizes"):
        table.add_column(column, justify="right" if column in ("parameters", "FLOP per sample") else "left")
    for name, fam in families().items():
        for preset in getattr(fam, "presets", {}):
            try:
                table.add_row(*_preset_row(name, preset))
            except Exception as err:  # a plugin family's bug is its row's reason, never a traceback
                table.add_row(preset, name, "", "", "", f"[red]{escape(f'{type(err).__name__}: {err}')}[/]", "")
    for name, why in broken_families().items():
        table.add_row("", f"[red]{escape(name)}[/]", "", "", "", f"[red]failed to load: {escape(why)}[/]", "")
    data_console().print(table)
    return 0


def _preset_row(family_name: str, preset: str) -> tuple[str, ...]:
    model = preset_model(preset)
    shape = ", ".join(f"{k}={'x'.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in model.shape.items())
    unit = model.unit if model.units_per_sample == 1 else f"{model.unit} ({model.units_per_sample}/sample)"
    return (preset, family_name, f"{model.params:,}", flops_text(model.training_flops_per_sample), unit, shape,
            ", ".join(map(str, model.batch_sizes)))
