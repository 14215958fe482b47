"""`xbench backends`: which backend plugins exist, their versions and devices, or why not."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from xbench.cli.consoles import data_console, status_console
from xbench.cli.layout import table_or_stacked
from xbench.cli.options import Platform
from xbench.contract import launchers_of, programs_of, variants_of
from xbench.results.schema import LOG_FILE
from xbench.run import probes
from xbench.run.registry import discover

AUTO = Platform("auto")  # GPUs when present, else the CPU


def backends(
    devices: Annotated[bool, typer.Option(help="Start each installed backend briefly to list its devices.")] = True,
    platform: Annotated[Platform, typer.Option(help="Platform to look for devices on.")] = AUTO,
) -> int:
    """List the backends: version, programs, variants, devices, or why one is unavailable.

    Programs are what --single-device chooses between (data-parallel, plain); variants are what
    --variants BACKEND:VARIANT turns on."""
    lines: list[tuple[str, ...]] = []
    err = status_console()
    with tempfile.TemporaryDirectory() as tmp, err.status("starting each backend to find its devices…"):
        for entry in discover().values():
            if not entry.usable:
                lines.append((entry.name, "[red]unavailable[/]", "", "", "", "",
                              escape(entry.availability.reason or ""), entry.target))
                continue
            how = launchers_of(entry.backend)
            seen = _devices(entry.target, platform.value, Path(tmp), how) if devices else "(not probed)"
            lines.append((entry.name, "[green]available[/]", entry.availability.version or "", ", ".join(how),
                          ", ".join(programs_of(entry.backend)), ", ".join(variants_of(entry.backend)) or "—",
                          seen, entry.target))
    console = data_console()
    console.print(backends_table(lines, console.width))
    return 0


COLUMNS = ("backend", "status", "version", "launchers", "programs", "variants", "devices", "plugin")
IDENTIFYING = ("backend", "plugin")  # never wrapped nor cut: a user copies them


def backends_table(lines: list[tuple[str, ...]], width: int) -> RenderableType:
    """The backends as a table where every cell fits whole at `width` columns, else one block
    per backend: its name, status and version on one line, the other columns under it (the
    plugin's import path on a line of its own)."""
    table = Table(title="xbench backends (entry-point group xbench.backends)", title_justify="left")
    for column in COLUMNS:
        table.add_column(column, no_wrap=column in IDENTIFYING)
    for line in lines:
        table.add_row(*line)
    blocks = [("  ".join([f"[bold]{escape(line[0])}[/]", *(part for part in line[1:3] if part)]), _details(line))
              for line in lines]
    return table_or_stacked(table, width, blocks)


def _details(line: tuple[str, ...]) -> list[str]:
    _, _, _, launchers, programs, variants, devices, plugin = line
    said = [f"{name}: {value}" for name, value in (("launchers", launchers), ("programs", programs),
                                                     ("variants", variants), ("devices", devices)) if value]
    return [*said, f"plugin: {plugin}"]


def _devices(target: str, platform: str, tmp: Path, launchers: tuple[str, ...]) -> str:
    answer = probes.describe(target, platform, tmp / LOG_FILE)
    if "reason" in answer:
        return f"[red]{escape(answer['reason'])}[/]"
    info = answer["device_info"]
    if info["simulated"]:
        what = "processes" if "subprocess" not in launchers else "simulated devices"
        return f"CPU, up to {info['available']} {what} (no GPU found)"
    names = sorted(set(n.split(" ", 1)[-1] for n in info["device_names"]))
    return f"{info['available']} {info['platform'].upper()}(s): {', '.join(names)}"
