"""`xbench allreduce`: each backend's own all-reduce, timed like a training step."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from xbench.cli.consoles import data_console, status_console
from xbench.cli.options import LauncherOption, Platform, backend_options, integers, names, value
from xbench.errors import XbenchError
from xbench.experiment import load_spec
from xbench.report.terminal import ALLREDUCE_HEADERS, ALLREDUCE_NOTE, allreduce_rows
from xbench.results.allreduce import format_size, parse_size, result_from_record
from xbench.results.records import AllReduceRecord, write_atomic
from xbench.run import compare as comparison
from xbench.run.cluster import resolve_launch
from xbench.run.environment import host_environment

DEFAULT_SIZES = ("4KiB", "256KiB", "16MiB")


def allreduce(
    backends: Annotated[Optional[list[str]], typer.Option(help="Backends to measure, e.g. --backends jax tf.")] = None,
    devices: Annotated[Optional[list[str]], typer.Option(help="Device counts (default 2).")] = None,
    sizes: Annotated[Optional[list[str]], typer.Option(help="Buffer sizes per device, e.g. 4KiB 64MiB 1GiB.")] = None,
    platform: Annotated[Optional[Platform], typer.Option(
        help="auto: GPUs when present, else simulated CPU devices.")] = None,
    option: Annotated[Optional[list[str]], typer.Option(help="Backend option BACKEND.KEY=VALUE.")] = None,
    json_out: Annotated[Optional[Path], typer.Option(
        "--json", help="Also write the results to this JSON file.")] = None,
    launcher: LauncherOption = None,
) -> int:
    """Time the framework's own all-reduce: time per operation, algbw and busbw (nccl-tests' definitions)."""
    try:
        nbytes = [parse_size(s) for s in (names(sizes) or DEFAULT_SIZES)]
    except ValueError as problem:
        raise XbenchError(f"--sizes: {problem}") from None
    counts = integers(devices, "--devices") or [2]
    launch = resolve_launch(value(launcher) or "auto")
    # Only backends, devices, platform and options matter here; a batch every count divides
    # keeps the spec's model checks quiet (and a count below 1 is left for the spec to name).
    batch = math.lcm(*counts) if min(counts) > 0 else 1
    spec = load_spec(None, {"backends": names(backends), "devices": counts, "platform": value(platform),
                            "options": backend_options(option), "batch_sizes": [batch],
                            "samples": max(batch, 4096)})
    if json_out is not None:
        check_writable(json_out)
    err = status_console()
    with tempfile.TemporaryDirectory(prefix="xbench-allreduce-") as tmp:
        with err.status("finding devices for each backend…"):
            ready = comparison.ready_backends(spec, Path(tmp), launch=launch)
        with err.status("timing all-reduces…"):
            records = comparison.measure_allreduce(ready.entries, spec.devices, spec.platform, nbytes, spec.options,
                                                   Path(tmp), host_environment(), devices=ready.devices,
                                                   launchers=ready.launchers, launch=launch)
    data_console().print(allreduce_table(records))
    if json_out is not None:
        write_atomic(json_out, (json.dumps(_as_json(records), indent=2) + "\n").encode("utf-8"))
    bad = [r for r in records if r["status"] != "ok"]
    for record in bad:
        err.print(escape(f"{record['backend']} d{record['devices']} {format_size(record['nbytes'])}: "
                         f"{record['status']}: {record['reason']}"))  # framework messages hold [brackets]
    return 1 if bad else 0


def allreduce_table(records: Sequence[AllReduceRecord]) -> Table:
    table = Table(title="all-reduce (float32 SUM, each framework's own collective)", title_justify="left",
                  caption=ALLREDUCE_NOTE, caption_justify="left")
    for header in ALLREDUCE_HEADERS:
        table.add_column(header, justify="left" if header in ("backend", "devices on") else "right")
    for line in allreduce_rows(records):
        table.add_row(*line)
    return table


def check_writable(path: Path) -> None:
    """Fail before a long measurement, not after it."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise XbenchError(f"cannot write {path}: {parent} is not a directory")


def _as_json(records: Sequence[AllReduceRecord]) -> list[dict[str, Any]]:
    out = []
    for record in records:
        row: dict[str, Any] = {"backend": record["backend"], "devices": record["devices"], "nbytes": record["nbytes"],
                               "status": record["status"], "reason": record["reason"]}
        if record["status"] == "ok":
            r = result_from_record(record)
            row.update(time_s_median=r.time.median, algbw_GBps=r.algbw / 1e9, busbw_GBps=r.busbw / 1e9)
        out.append(row)
    return out
