"""`xbench allreduce`: each backend's own all-reduce (and, asked, all-gather and
reduce-scatter), timed like a training step."""

from __future__ import annotations

import json
import math
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from xbench.cli.consoles import data_console, status_console
from xbench.cli.options import Launcher, Platform, backend_options, integers, names, p2p_list, value
from xbench.contract import ALL_REDUCE, COLLECTIVES
from xbench.errors import XbenchError, brief
from xbench.experiment import load_spec
from xbench.report.terminal import ALLREDUCE_HEADERS, allreduce_rows, collective_note, devices_line
from xbench.results.allreduce import (
    NCCL_PROGRAMS,
    REDOPS,
    TITLES,
    AllReduceResult,
    bus_factor,
    collective_of,
    element_count,
    format_size,
    parse_size,
    result_from_record,
)
from xbench.results.links import links_record, notes, short
from xbench.results.records import AllReduceRecord, write_atomic
from xbench.run import links
from xbench.run.allreduce_phase import measure_allreduce
from xbench.run.cluster import resolve_launch
from xbench.run.environment import host_environment
from xbench.run.readiness import ready_with_fork_servers

DEFAULT_SIZES = ("4KiB", "256KiB", "16MiB")


def allreduce(
    backends: Annotated[Optional[list[str]], typer.Option(
        metavar="NAME...", help="Backends to measure, e.g. jax tf (default: every backend that runs here).")] = None,
    devices: Annotated[Optional[list[str]], typer.Option(
        metavar="INT...", help="Device counts, e.g. 2 4 8 (default: 2).")] = None,
    sizes: Annotated[Optional[list[str]], typer.Option(
        metavar="SIZE...", help=f"float32 buffer as nccl-tests sizes it (all-reduce: per device; all-gather: the "
                                f"gathered output; reduce-scatter: the input): 4KiB, 64MiB, 1GiB or bytes "
                                f"(default: {' '.join(DEFAULT_SIZES)}).")] = None,
    collectives: Annotated[Optional[list[str]], typer.Option(
        metavar="NAME...", help=f"Collectives to time, each in its nccl-tests columns: {', '.join(COLLECTIVES)} "
                                f"(default: {ALL_REDUCE}).")] = None,
    platform: Annotated[Optional[Platform], typer.Option(
        help="auto: GPUs when present, else simulated CPU devices (default: auto).")] = None,
    option: Annotated[Optional[list[str]], typer.Option(
        metavar="BACKEND.KEY=VALUE", help="Backend option; repeat for more (default: none).")] = None,
    json_out: Annotated[Optional[Path], typer.Option(
        "--json", metavar="PATH", help="Also write the results to this JSON file (default: none).")] = None,
    launcher: Annotated[Optional[Launcher], typer.Option(
        help="subprocess: one process drives all devices; spmd: one process per device; auto: each backend's "
             "own choice (default: auto).")] = None,
    table: Annotated[bool, typer.Option(
        "--table", help="A box table instead of nccl-tests' all_reduce_perf lines (default: off).")] = False,
    p2p: Annotated[Optional[list[str]], typer.Option(
        metavar="on|off...", help="GPU-to-GPU links: on, the machine's own (NVLink, PCIe peer-to-peer); off, NCCL "
                                  "stages the traffic through host memory (NCCL_P2P_DISABLE=1, NCCL_NVLS_ENABLE=0), "
                                  "as on a PCIe machine without peer-to-peer; --p2p on off measures both and "
                                  "prints their busbw side by side (default: on).")] = None,
) -> int:
    """Time each framework's own all-reduce; prints nccl-tests' all_reduce_perf columns.

    Lines as all_reduce_perf prints them (size, count, type, redop, root, time, algbw, busbw,
    #wrong; awk '{print $8}' is busbw), one block per collective, backend and device count, each
    closed by '# Avg bus bandwidth'. --collectives allgather reducescatter adds blocks in
    all_gather_perf's and reduce_scatter_perf's columns (busbw = algbw × (n-1)/n). time: median
    per operation; the comment line under each size gives that median's distribution-free 95%
    interval. #wrong is N/A: the results are not checked.
    """
    try:
        nbytes = [parse_size(s) for s in (names(sizes) or DEFAULT_SIZES)]
    except ValueError as problem:
        raise XbenchError(f"--sizes: {problem}") from None
    chosen = collective_names(collectives)
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
    topologies = p2p_list(p2p)
    err, environment = status_console(), host_environment()
    records: list[AllReduceRecord] = []
    with tempfile.TemporaryDirectory(prefix="xbench-allreduce-") as tmp:
        with err.status("finding devices for each backend…"):
            ready, servers = ready_with_fork_servers(spec, Path(tmp), launch=launch, p2p=topologies[0])
        try:  # the workers fork from the servers that found the devices
            for on in topologies:
                with links.applied(on) as nccl:  # every worker of this topology inherits NCCL's variables
                    mine = {**environment, "links": links_record(on, nccl, ready.devices, spec.devices)}
                    for line in notes(mine["links"]):
                        err.print(escape(line), soft_wrap=True)
                    what = "all-reduces" if chosen == [ALL_REDUCE] else "collectives"
                    with err.status(f"timing {what} (P2P {'on' if on else 'off'})…"):
                        records += measure_allreduce(ready.entries, spec.devices, spec.platform, nbytes,
                                                     spec.options, Path(tmp), mine, devices=ready.devices,
                                                     launchers=ready.launchers, launch=launch, collectives=chosen,
                                                     servers=servers)
        finally:
            if servers is not None:
                servers.close()
    if table:
        for group in _by_links(records).values():
            for same in _by_collective(group).values():
                data_console().print(allreduce_table(same))
    else:
        sys.stdout.write(nccl_tests_text(records, ready.devices, ready.launchers, environment))
    if json_out is not None:
        write_atomic(json_out, (json.dumps(_as_json(records), indent=2) + "\n").encode("utf-8"))
    bad = [r for r in records if r["status"] != "ok"]
    for record in bad:
        err.print(escape(f"{_said(record)}{record['backend']} d{record['devices']} {format_size(record['nbytes'])}: "
                         f"{record['status']}: {record['reason']}"))  # framework messages hold [brackets]
    return 1 if bad else 0


def collective_names(values: list[str] | None) -> list[str]:
    """`--collectives allreduce allgather` (or comma-separated), each once, in the order given."""
    chosen = list(dict.fromkeys(names(values) or [ALL_REDUCE]))
    unknown = [name for name in chosen if name not in COLLECTIVES]
    if unknown:
        raise XbenchError(f"--collectives: unknown collective {brief(unknown[0])}; known: {', '.join(COLLECTIVES)}")
    return chosen


def _said(record: AllReduceRecord) -> str:
    """The collective's name where a message needs it (not for an all-reduce, as before)."""
    collective = collective_of(record)
    return "" if collective == ALL_REDUCE else f"{collective} "


def _by_collective(records: Sequence[AllReduceRecord]) -> dict[str, list[AllReduceRecord]]:
    groups: dict[str, list[AllReduceRecord]] = {}
    for record in records:
        groups.setdefault(collective_of(record), []).append(record)
    return groups


def _links_of(record: AllReduceRecord) -> dict[str, Any]:
    return record["environment"].get("links") or {}


def _p2p_of(record: AllReduceRecord) -> str:
    """"on" or "off": the links a record's all-reduce used ("on" for a record before the switch)."""
    return _links_of(record).get("p2p", "on")


def _by_links(records: Sequence[AllReduceRecord]) -> dict[str, list[AllReduceRecord]]:
    groups: dict[str, list[AllReduceRecord]] = {}
    for record in records:
        groups.setdefault(_p2p_of(record), []).append(record)
    return groups


def allreduce_table(records: Sequence[AllReduceRecord]) -> Table:
    """One collective's records (of one topology) as a box table, titled by the collective."""
    said = short(_links_of(records[0])) if records else ""
    collective = collective_of(records[0]) if records else ALL_REDUCE
    what = "float32 SUM" if REDOPS[collective] == "sum" else "float32"
    title = f"{TITLES[collective]} ({what}, each framework's own collective)" + (f" — {said}" if said else "")
    table = Table(title=title, title_justify="left",
                  caption=collective_note(collective), caption_justify="left")
    for header in ALLREDUCE_HEADERS:
        table.add_column(header, justify="left" if header in ("backend", "devices on") else "right")
    for line in allreduce_rows(records):
        table.add_row(*line)
    return table


# nccl-tests' all_reduce_perf prints one result (its out-of-place half) as
# printf("%12li  %12li  %8s  %6s  %6i  %7s  %6.2f  %6.2f  %5s"), under these two header lines.
NCCL_HEADERS = ("#       size         count      type   redop    root     time   algbw   busbw #wrong",
                "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)")


def nccl_tests_text(records: Sequence[AllReduceRecord], devices: Mapping[str, Mapping[str, Any]],
                    launchers: Mapping[str, str], environment: Mapping[str, Any]) -> str:
    """The records as all_reduce_perf prints its results: '#' lines around fixed-width data
    lines, one block per backend and device count, so grep and awk read them alike."""
    kinds = list(dict.fromkeys(map(collective_of, records))) or [ALL_REDUCE]
    lines = _preamble(records, environment, kinds)
    groups: dict[tuple[str, str, int, str], list[AllReduceRecord]] = {}
    for record in records:
        key = (collective_of(record), record["backend"], record["devices"], _p2p_of(record))
        groups.setdefault(key, []).append(record)
    both = len({p2p for *_, p2p in groups}) > 1
    for (collective, backend, count, _), group in groups.items():
        lines += _block_head(backend, count, group[0], devices.get(backend), launchers.get(backend, "subprocess"),
                             both, collective if kinds != [ALL_REDUCE] else None)
        lines += [_nccl_line(r) for r in group]
        lines += _block_foot([result_from_record(r) for r in group if r["status"] == "ok"], collective)
    if both:
        lines += side_by_side(records)
    return "\n".join(lines) + "\n"


def side_by_side(records: Sequence[AllReduceRecord]) -> list[str]:
    """'#' lines (awk's data lines stay the blocks' own): per backend, devices and size, busbw
    with P2P on and off and their ratio."""
    busbw: dict[tuple[str, str, int, int], dict[str, float]] = {}
    for record in records:
        if record["status"] == "ok" and record["timing"]:
            key = (collective_of(record), record["backend"], record["devices"], record["nbytes"])
            busbw.setdefault(key, {})[_p2p_of(record)] = result_from_record(record).busbw / 1e9
    said = next((short(_links_of(r)) for r in records if _p2p_of(r) == "off"), "")
    mixed = {c for c, *_ in busbw} - {ALL_REDUCE}
    lines = ["#", f"# busbw (GB/s) side by side: P2P on = the machine's own links; {said}",
             f"# {'backend':<16s} {'devices':>7s} {'size (B)':>12s} {'P2P on':>8s} {'P2P off':>8s} {'off/on':>7s}"
             + ("  collective" if mixed else "")]
    for (collective, backend, count, nbytes), found in busbw.items():
        on, off = found.get("on"), found.get("off")
        cells = [f"{v:8.2f}" if v is not None else f"{'-':>8s}" for v in (on, off)]
        ratio = f"{off / on:7.3f}" if on and off is not None else f"{'-':>7s}"
        lines.append(f"# {backend:<16s} {count:>7d} {nbytes:>12d} {cells[0]} {cells[1]} {ratio}"
                     + (f"  {collective}" if mixed else ""))
    return lines


INTERVAL_LINE = "# the comment line under each size: the median's distribution-free 95% interval ('-': under 6 windows)"


def _preamble(records: Sequence[AllReduceRecord], environment: Mapping[str, Any],
              kinds: Sequence[str] = (ALL_REDUCE,)) -> list[str]:
    sizes = [r["nbytes"] for r in records] or [0]
    host = f"# host {environment.get('host')}  python {environment.get('python')}  " \
           f"minBytes {min(sizes)}  maxBytes {max(sizes)}  type float"
    if list(kinds) == [ALL_REDUCE]:
        return [f"# xbench {environment.get('xbench')} allreduce: each framework's own all-reduce, in nccl-tests' "
                "all_reduce_perf columns",
                f"{host}  redop sum  validation: 0",
                "# time: median per all-reduce over one worker's windows (outliers removed)",
                INTERVAL_LINE,
                "# only the out-of-place columns: xbench times one all-reduce kind, so $10-$13 are absent",
                "# algbw = size / time; busbw = algbw * 2(n-1)/n; Avg bus bandwidth: mean busbw over a block's sizes",
                "# #wrong N/A: xbench does not check the reduced values (as nccl-tests -c 0)"]
    programs = ", ".join(f"{NCCL_PROGRAMS[k]} ({k})" for k in kinds)
    return [f"# xbench {environment.get('xbench')} allreduce: each framework's own collectives, in nccl-tests' "
            f"columns of {programs}",
            f"{host}  validation: 0",
            "# size: as nccl-tests counts it: all-reduce's buffer, all-gather's output, reduce-scatter's input; "
            "count: all-reduce's elements, each device's share for the others",
            "# time: median per operation over one worker's windows (outliers removed)",
            INTERVAL_LINE,
            "# only the out-of-place columns: xbench times one kind of each collective, so $10-$13 are absent",
            "# algbw = size / time; busbw = algbw * 2(n-1)/n for all-reduce, * (n-1)/n for all-gather and "
            "reduce-scatter; Avg bus bandwidth: mean busbw over a block's sizes",
            "# #wrong N/A: xbench does not check the results (as nccl-tests -c 0)"]


def _block_head(backend: str, count: int, first: AllReduceRecord, info: Mapping[str, Any] | None,
                launcher: str, both: bool = False, collective: str | None = None) -> list[str]:
    """A block's '#' lines; `collective` names the block's collective (None: all-reduce alone)."""
    where = f"# {devices_line(backend, info, launcher)}" if info else f"# {backend}"
    said = notes(_links_of(first))
    if both and not said:
        said = ["P2P on: the machine's own GPU-to-GPU links"]
    named = [f"# {TITLES[collective]}: {NCCL_PROGRAMS[collective]}'s columns, busbw = algbw * "
             f"{'2(n-1)/n' if collective == ALL_REDUCE else '(n-1)/n'} = algbw * "
             f"{bus_factor(count, collective):g}"] if collective else []
    return ["#", *named, where,
            f"# Using {count} device(s) on {first.get('platform') or 'unknown platform'}, launcher {launcher}",
            *(f"# {line}" for line in said), "#", *NCCL_HEADERS]


def _nccl_line(record: AllReduceRecord) -> str:
    nbytes, collective = record["nbytes"], collective_of(record)
    count = element_count(collective, nbytes, record["devices"])
    head = f"{nbytes:12d}  {count:12d}  {'float':>8s}  {REDOPS[collective]:>6s}  {-1:6d}"
    if record["status"] != "ok" or not record["timing"]:
        return f"# {head.lstrip()}  {record['status']}: {record['reason'] or ''}".rstrip()
    r = result_from_record(record)
    places = _places(r.time.median * 1e6)
    interval = "-" if r.median_ci is None else "-".join(f"{t * 1e6:.{places}f}" for t in r.median_ci) + " us"
    # The interval goes on a comment line of its own: tools that read all_reduce_perf's
    # in-place columns ($10-$13) then find no data there rather than the interval's words.
    return (f"{head}  {r.time.median * 1e6:7.{places}f}  {r.algbw / 1e9:6.2f}  {r.busbw / 1e9:6.2f}  {'N/A':>5s}\n"
            f"#{'':>50s}95% CI of the time {interval}, {len(record['timing']['window_s'])} windows")


def _places(us: float) -> int:
    """Decimals all_reduce_perf gives a time in µs (7 wide): fewer as it grows."""
    return 0 if us >= 10000 else 1 if us >= 100 else 2


def _block_foot(results: Sequence[AllReduceResult], collective: str = ALL_REDUCE) -> list[str]:
    average = f"{sum(r.busbw for r in results) / len(results) / 1e9:g}" if results else "N/A"
    checked = "reduced values" if collective == ALL_REDUCE else "results"
    return [f"# Out of bounds values : N/A ({checked} not checked)", f"# Avg bus bandwidth    : {average}"]


def check_writable(path: Path) -> None:
    """Fail before a long measurement, not after it."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise XbenchError(f"cannot write {path}: {parent} is not a directory")


def _as_json(records: Sequence[AllReduceRecord]) -> list[dict[str, Any]]:
    out = []
    for record in records:
        row: dict[str, Any] = {"collective": collective_of(record), "backend": record["backend"],
                               "devices": record["devices"], "nbytes": record["nbytes"],
                               "p2p": _p2p_of(record), "links": _links_of(record),
                               "status": record["status"], "reason": record["reason"]}
        if record["status"] == "ok":
            r = result_from_record(record)
            row.update(time_s_median=r.time.median, time_s_median_ci95=list(r.median_ci) if r.median_ci else None,
                       algbw_GBps=r.algbw / 1e9, busbw_GBps=r.busbw / 1e9)
        out.append(row)
    return out
