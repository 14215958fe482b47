"""`xbench backends`: which backend plugins exist, their versions and devices, or why not."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from xbench.cli.consoles import data_console, status_console
from xbench.cli.options import Platform
from xbench.contract import launchers_of, programs_of, variants_of
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
    table = Table(title="xbench backends (entry-point group xbench.backends)", title_justify="left")
    for column in ("backend", "status", "version", "launchers", "programs", "variants"):
        table.add_column(column)
    # The devices column holds the reason a backend cannot run: it keeps its width, and the
    # plugin's import path (long, and also in `pip show`) gives way.
    table.add_column("devices", min_width=34)
    table.add_column("plugin", overflow="fold")
    err = status_console()
    with tempfile.TemporaryDirectory() as tmp, err.status("starting each backend to find its devices…"):
        for entry in discover().values():
            if not entry.usable:
                table.add_row(entry.name, "[red]unavailable[/]", "", "", "", "",
                              escape(entry.availability.reason or ""), entry.target)
                continue
            how = launchers_of(entry.backend)
            seen = _devices(entry.target, platform.value, Path(tmp), how) if devices else "(not probed)"
            table.add_row(entry.name, "[green]available[/]", entry.availability.version or "", ", ".join(how),
                          ", ".join(programs_of(entry.backend)), ", ".join(variants_of(entry.backend)) or "—",
                          seen, entry.target)
    data_console().print(table)
    return 0


def _devices(target: str, platform: str, tmp: Path, launchers: tuple[str, ...]) -> str:
    answer = probes.describe(target, platform, tmp / "workers.log")
    if "reason" in answer:
        return f"[red]{escape(answer['reason'])}[/]"
    info = answer["device_info"]
    if info["simulated"]:
        what = "processes" if "subprocess" not in launchers else "simulated devices"
        return f"CPU, up to {info['available']} {what} (no GPU found)"
    names = sorted(set(n.split(" ", 1)[-1] for n in info["device_names"]))
    return f"{info['available']} {info['platform'].upper()}(s): {', '.join(names)}"
