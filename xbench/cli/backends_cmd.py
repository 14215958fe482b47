"""`xbench backends`: which backend plugins exist, their versions and devices, or why not."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from xbench.cli.consoles import data_console, status_console
from xbench.cli.layout import table_or_stacked
from xbench.cli.options import Platform
from xbench.contract import launchers_of, programs_of, variants_of
from xbench.run import probes
from xbench.run.registry import BackendEntry, discover

AUTO = Platform("auto")  # GPUs when present, else the CPU


def backends(
    devices: Annotated[bool, typer.Option(help="Start each installed backend briefly to list its devices.")] = True,
    platform: Annotated[Platform, typer.Option(help="Platform to look for devices on.")] = AUTO,
) -> int:
    """List the backends: version, programs, variants, devices, or why one is unavailable.

    Programs are what --single-device chooses between (data-parallel, plain); variants are what
    --variants BACKEND:VARIANT turns on."""
    lines: list[tuple[str, ...]] = []
    entries = list(discover().values())
    seen = _all_devices([e for e in entries if e.usable], platform.value) if devices else {}
    for entry in entries:
        if not entry.usable:
            lines.append((entry.name, "[red]unavailable[/]", "", "", "", "",
                          escape(entry.availability.reason or ""), entry.target))
            continue
        lines.append((entry.name, "[green]available[/]", entry.availability.version or "",
                      ", ".join(launchers_of(entry.backend)), ", ".join(programs_of(entry.backend)),
                      ", ".join(variants_of(entry.backend)) or "—", seen.get(entry.name, "(not probed)"), entry.target))
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


def _all_devices(entries: list[BackendEntry], platform: str) -> dict[str, str]:
    """Each backend's devices, or why it cannot start: one short worker per backend, all started
    at once, so the command waits for the slowest start, not for their sum."""
    with tempfile.TemporaryDirectory() as tmp, status_console().status("starting each backend to find its devices…"):
        answers = probes.describe_all([(e.target, Path(tmp) / f"describe-{e.name}.log") for e in entries], platform)
    return {e.name: _devices(answer, launchers_of(e.backend)) for e, answer in zip(entries, answers)}


def _devices(answer: dict[str, Any], launchers: tuple[str, ...]) -> str:
    if "reason" in answer:
        return f"[red]{escape(answer['reason'])}[/]"
    info = answer["device_info"]
    if info["simulated"]:
        what = "processes" if "subprocess" not in launchers else "simulated devices"
        return f"CPU, up to {info['available']} {what} (no GPU found)"
    names = sorted(set(n.split(" ", 1)[-1] for n in info["device_names"]))
    return f"{info['available']} {info['platform'].upper()}(s): {', '.join(names)}"
