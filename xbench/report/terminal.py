"""Tables for people: rich renderables built from result rows; the caller prints them."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from xbench.contract import ALL_GATHER, ALL_REDUCE, PLAIN
from xbench.models.memory import COMPUTE_BYTES
from xbench.models.traffic import step_traffic
from xbench.report.bottom_line import ModelBottomLine
from xbench.report.words import (
    BREAKDOWN_NOTE,
    INTERVAL_HEADER,
    NUMERIC_COLUMNS,
    RESULT_HEADERS,
    TELEMETRY_NOTE,
    TIED,
    TRAFFIC_NOTE,
    USABLE_SPAN,
    both_kinds,
    brief_notes,
    fastest_cells,
    fastest_headers,
    floor_span,
    interval_text,
    model_facts,
    rate_header,
    rate_text,
    replicates_text,
    result_cells,
    result_headers,
    speedup_text,
    vs_plain_text,
)
from xbench.results.allreduce import format_size, ok_results, result_from_record
from xbench.results.conditions import energy_mj_per_sample, gpu_util_pct, memory_gib, memory_is_bound
from xbench.results.fit import DOES_NOT_FIT, does_not_fit
from xbench.results.records import AllReduceRecord
from xbench.results.summary import (
    BENEFICIAL_SPEEDUP,
    SINGLE_PREFERRED_BELOW,
    Row,
    fastest_rows,
    full_rows,
    geomean_rate,
    verdict,
)

Busbw = Mapping[tuple[str, int, int], float]  # (backend, devices, bytes) -> busbw in bytes/s


def busbw_by_size(allreduce_records: Sequence[AllReduceRecord]) -> dict[tuple[str, int, int], float]:
    return {(r.backend, r.devices, r.nbytes): r.busbw for r in ok_results(allreduce_records)
            if r.collective == ALL_REDUCE}


ALLREDUCE_HEADERS = ("backend", "devices on", "dev", "size", "time µs", "95% CI µs", "algbw GB/s", "busbw GB/s")
ALLREDUCE_NOTE = ("time: median per operation over one worker's windows, outliers removed; 95% CI: distribution-free "
                  "interval of that median (order statistics; -: under 6 windows); algbw = bytes / time; "
                  "busbw = algbw × 2(n−1)/n (nccl-tests)")


def collective_note(collective: str) -> str:
    """ALLREDUCE_NOTE for `collective`: nccl-tests' size and busbw factor of that collective."""
    if collective == ALL_REDUCE:
        return ALLREDUCE_NOTE
    size = "the gathered output" if collective == ALL_GATHER else "the input on each device"
    return ALLREDUCE_NOTE.replace("bytes / time; busbw = algbw × 2(n−1)/n",
                                  f"size / time, the size being {size}; busbw = algbw × (n−1)/n")


def allreduce_rows(records: Sequence[AllReduceRecord]) -> list[tuple[str, ...]]:
    """One line per all-reduce record, for the terminal and the report."""
    lines: list[tuple[str, ...]] = []
    for record in records:
        head = (record["backend"], str(record.get("platform") or ""), str(record["devices"]),
                format_size(record["nbytes"]))
        if record["status"] != "ok":
            lines.append((*head, record["status"], "", "", ""))
            continue
        r = result_from_record(record)
        interval = "-" if r.median_ci is None else "–".join(f"{t * 1e6:,.1f}" for t in r.median_ci)
        lines.append((*head, f"{r.time.median * 1e6:,.1f}", interval, f"{r.algbw / 1e9:,.2f}", f"{r.busbw / 1e9:,.2f}"))
    return lines


def model_tables(rows: Sequence[Row], busbw: Busbw | None = None, wide: bool = False,
                 width: int = 120) -> list[Table | Group]:
    """Per model, the throughput table and, when measured, a second table of where the time
    goes: compute-only twins, exposed communication, all-reduce busbw, GPU telemetry. The
    default fits a terminal `width` wide, down to 80 columns; `wide` shows every column and the
    full caption."""
    tables: list[Table | Group] = []
    for model in dict.fromkeys(row.model for row in rows):
        mine = [r for r in rows if r.model == model]
        tables.append(_model_table(model, mine) if wide else _compact_table(model, mine, width))
        costs = _cost_table(model, mine, busbw or {}, compact=not wide)
        if costs is not None:
            tables.append(costs)
        fastest = _fastest_table(model, mine) if wide else _compact_fastest_table(model, mine, width)
        if fastest is not None:
            tables.append(fastest)
    return tables


# Spaces between columns, a rule under the header: eight columns fit 80 characters.
COMPACT_STYLE: dict[str, Any] = {"box": box.SIMPLE_HEAD, "pad_edge": False, "collapse_padding": True,
                                 "show_edge": False}
COMPACT_HEADERS = ("program", "dev", "batch", "samples/s", "speedup (95%)", "vs plain", "verdict", "reps", "notes")
PLAIN_HEADER = "vs plain"  # shown where some backend's plain program ran
COMPACT_VERDICTS = {"multi-device beneficial": "beneficial", "single device preferred": "single better",
                    "baseline": ""}
COMPACT_NOTE = ("samples/s: the geometric mean over fresh worker processes (every ratio divides it), with its 95% "
                "interval (± where nearly symmetric, else its bounds; \"too few reps\": the bounds lie more than "
                f"{USABLE_SPAN:g}× apart); speedup: over the same program "
                "on 1 device (\"vs plain\" in it: over the plain program, another program); vs plain: over the "
                "plain single-device program (\"plain\" rows), program and devices together (--wide: its "
                "interval); verdict: the zone "
                "holding the whole speedup interval (beneficial ≥ "
                f"{BENEFICIAL_SPEEDUP:.2f}, single better ≤ {SINGLE_PREFERRED_BELOW:.2f}, about even between, "
                "inconclusive across one); --wide adds step ms, 1st call, efficiency and MFU; the report explains "
                "every column")


# The program names a row and never wraps or shrinks: where the columns do not fit, the notes,
# then "vs plain", the verdict and the speedup move under the table, one line per row, in that order.
MOVABLE = (PLAIN_HEADER, "verdict", "speedup (95%)")
NOTES_MIN_WIDTH = 20  # the notes column, wrapped, is no narrower than this (else the notes go below)


def bottom_line_text(found: Sequence[ModelBottomLine]) -> Group:
    """The bottom line as the terminal shows it: a heading, then per model a bullet per sentence,
    each wrapped under its own first word."""
    parts: list[Any] = [Text("Bottom line", style="bold")]
    for item in found:
        bullets = Table.grid(padding=(0, 1))
        bullets.add_column(no_wrap=True)
        bullets.add_column()
        for sentence in item.sentences:
            bullets.add_row(" •", escape(sentence))
        parts += [Text(f"model {item.model}", style="bold"), bullets]
    return Group(*parts)


def _compact_table(model: str, rows: list[Row], width: int) -> Group:
    """Eight or nine short columns; the program column keeps every name whole on one line, and
    only the notes wrap. Columns that do not fit `width` (`compact_columns`) are said under the
    table, row by row. The title and those lines take the terminal's width, not the table's."""
    headers = compact_headers(rows)
    cells = [_compact_cells(row) for row in full_rows(rows)]
    shown = compact_columns(rows, headers, cells, width)
    below = tuple(h for h in headers if h not in shown)
    facts = model_facts(rows, brief=True)
    table = Table(**COMPACT_STYLE)
    for header in shown:
        _add_compact_column(table, header, rows)
    for cell in cells:
        table.add_row(*[cell[h] for h in shown])
    title = Text(f"model {model}" + (f" — {facts}" if facts else ""), style="italic")
    return Group(title, table, Text.from_markup(_compact_caption(rows, below), style="dim"))


def _add_compact_column(table: Table, header: str, rows: Sequence[Row]) -> None:
    shown = rate_header(rows) if header == "samples/s" else header
    numeric = header in ("dev", "batch", "samples/s", "speedup (95%)", PLAIN_HEADER, "reps")
    notes = header == "notes"
    table.add_column(shown, justify="right" if numeric else "left", no_wrap=not notes,
                     min_width=NOTES_MIN_WIDTH if notes else len(shown), overflow="fold" if notes else "ellipsis")


def compact_columns(rows: Sequence[Row], headers: Sequence[str], cells: Sequence[dict[str, str]],
                    width: int) -> tuple[str, ...]:
    """The columns of `headers` that fit `width` whole: the notes where at least NOTES_MIN_WIDTH
    of them fit beside the rest, then the MOVABLE ones in turn left out until the others fit.
    Every other column (the program's name among them) always stays."""
    columns = [h for h in headers if h != "notes"]
    for movable in MOVABLE:
        if _natural_width(rows, columns, cells) <= width:
            break
        if movable in columns:
            columns.remove(movable)
    if "notes" in headers and _natural_width(rows, [*columns, "notes"], cells, notes=NOTES_MIN_WIDTH) <= width:
        columns.append("notes")
    return tuple(columns)


def _natural_width(rows: Sequence[Row], columns: Sequence[str], cells: Sequence[dict[str, str]],
                   notes: int = 0) -> int:
    """The width the compact table takes with these columns, none wrapped (the notes `notes` wide)."""
    table = Table(**COMPACT_STYLE)
    for header in columns:
        _add_compact_column(table, header, rows)
    for cell in cells:
        table.add_row(*["x" * notes if h == "notes" else cell[h] for h in columns])
    return Measurement.get(_MEASURING, _MEASURING.options, table).maximum


_MEASURING = Console(width=10_000, file=io.StringIO())


def compact_headers(rows: Sequence[Row]) -> tuple[str, ...]:
    """COMPACT_HEADERS, without "vs plain" where no plain program ran (it would be empty)."""
    plain = any(r.program == PLAIN for r in rows)
    return tuple(h for h in COMPACT_HEADERS if plain or h != PLAIN_HEADER)


def _compact_cells(row: Row) -> dict[str, str]:
    cells = dict.fromkeys(COMPACT_HEADERS, "")
    cells.update({"program": escape(row.label), "dev": str(row.devices), "batch": f"{row.global_batch:,}"})
    if row.throughput is None:
        cells["samples/s"] = status_cell(row)
        return cells
    said = verdict(row)
    shown = COMPACT_VERDICTS.get(said, said)
    style = VERDICT_STYLE.get(said)
    note = ", ".join(brief_notes(row))
    cells.update({"samples/s": rate_with_interval(row), "speedup (95%)": speedup_text(row),
                  PLAIN_HEADER: vs_plain_text(row, interval=False),
                  "verdict": f"[{style}]{shown}[/]" if style else escape(shown), "reps": replicates_text(row),
                  "notes": f"[yellow]{escape(note)}[/]" if row.unstable or row.throttled else escape(note)})
    return cells


def _said_below(row: Row, below: Sequence[str]) -> list[str]:
    """What a row's columns that moved under the table say: its verdict, its ratio to the plain
    program, its notes."""
    said = []
    if "speedup (95%)" in below and (speedup := speedup_text(row)) and row.devices > 1:
        said.append(f"speedup {speedup}")
    if "verdict" in below and row.devices > 1:
        said.append(verdict(row))
    if PLAIN_HEADER in below and row.program != PLAIN and (vs_plain := vs_plain_text(row, interval=False)):
        said.append(f"vs plain {vs_plain}")
    return said + (brief_notes(row) if "notes" in below else [])


def rate_with_interval(row: Row) -> str:
    """e.g. "30,806 ±10%", "2.471M (1.91M–3.2M)" or "13,388 (too few reps)": the throughput the
    ratios divide (`rate_cells`) and its 95 % interval as `interval_text` shows it."""
    t, k = row.measured, row.units_per_sample
    mean = geomean_rate(row) * k
    said = interval_text(mean, t.ci_low * k, t.ci_high * k, floor_span(row), bound_text)
    return f"{rate_text(mean)} {said}" if said else rate_text(mean)


def bound_text(rate: float) -> str:
    """An interval's end, in three digits: "780k", "1.2M"."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g}{unit}"
    return f"{rate:.3g}"


def _compact_caption(rows: list[Row], below: Sequence[str] = ()) -> str:
    """What the columns `below` say of each row (where they moved under the table), the columns'
    meaning and the rows that failed."""
    lines = [f"{row.label} d{row.devices} b{row.global_batch}: {escape(', '.join(said))}"
             for row in full_rows(rows) if row.throughput is not None and (said := _said_below(row, below))]
    lines += [f"links: {said}" for said in sorted({r.links for r in rows if r.links})]
    lines += [COMPACT_NOTE]
    lines += [unmeasured_line(r) for r in rows if r.throughput is None]
    return "\n".join(lines)


def _compact_fastest_table(model: str, rows: list[Row], width: int = 120) -> Group | None:
    """Per configuration, the fastest program and the rows not significantly slower; what
    tuning gained, when variants ran. Names stay whole: the rows not significantly slower wrap
    between names, or go under the table where even their longest name does not fit. Where
    plain and data-parallel programs are both ranked, each kind has a table of its own, titled
    (a column would cost the names their room at 80 columns)."""
    found = fastest_rows(rows)
    if not found:
        return None
    tuned = any(f.gain is not None for f in found)
    headers = ("dev", "batch", "fastest", rate_header(rows), *(("tuned gain",) if tuned else ()))
    lines = [(*(escape(c) for c in (cells[0], f"{f.global_batch:,}", cells[2], rate_with_interval(f.best))),
              *((escape(cells[8]),) if tuned else ()), escape(cells[9]))
             for f in found if (cells := fastest_cells(f))]
    longest = max((len(name) for f in found for name in (*f.tied, *f.untested)), default=0)

    def build(tied: bool, chosen: Sequence[tuple[str, ...]]) -> Table:
        table = Table(**COMPACT_STYLE)
        for header in headers:
            table.add_column(header, justify="left" if header == "fastest" else "right", no_wrap=True)
        if tied:
            table.add_column(TIED, no_wrap=False, min_width=max(longest, 9), overflow="fold")
        for line in chosen:
            table.add_row(*(line if tied else line[:-1]))
        return table

    tied_fits = Measurement.get(_MEASURING, _MEASURING.options, build(False, lines)).maximum + 2 + max(longest, 9) \
        <= width
    titled = both_kinds(found)
    parts: list[Any] = []
    for kind in dict.fromkeys(f.kind for f in found):  # in reading order: plain first
        chosen = [line for line, f in zip(lines, found) if f.kind == kind]
        title = f"model {model}: fastest per configuration" + (f", {kind} programs" if titled else "")
        below = [] if tied_fits else [f"d{line[0]} b{line[1].replace(',', '')}: {TIED} {line[-1]}"
                                      for line in chosen if line[-1]]
        parts += [Text(title, style="italic"), build(tied_fits, chosen),
                  *(Text.from_markup(line, style="dim") for line in below)]
    return Group(*parts)


def _fastest_table(model: str, rows: list[Row]) -> Table | None:
    """Per configuration, the fastest backend/variant/program and the fastest as written;
    None when no configuration has two measured rows."""
    found = fastest_rows(rows)
    if not found:
        return None
    table = Table(title=f"model {model}: fastest per configuration", title_justify="left")
    rate = rate_header(rows)
    kinds = both_kinds(found)
    for header in fastest_headers(rows, kinds):
        table.add_column(header, justify="right" if header in ("dev", "batch", rate, INTERVAL_HEADER, "tuned gain")
                         else "left", no_wrap=header != "not significantly slower")
    for f in found:
        table.add_row(*(escape(cell) for cell in fastest_cells(f, kinds)))
    return table


@dataclass(frozen=True)
class CostColumns:
    """The 'where the time goes' table as plain strings, for the terminal and the report."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...]


def cost_columns(rows: Sequence[Row], busbw: Busbw) -> CostColumns | None:
    """None when neither a breakdown nor telemetry was measured."""
    breakdown = any(r.breakdown for r in rows)
    telemetry = any(gpu_util_pct(r) is not None or memory_gib(r) is not None for r in rows)
    if not (breakdown or telemetry):
        return None
    headers = ["program", "dev", "batch", "step ms"]
    headers += ["compute ms", "comm ms", "comm %", "busbw GB/s", "moved/step"] if breakdown else []
    headers += ["GPU util %", "mem GiB", "est. GiB", "mJ/sample"] if telemetry else []
    cells = []
    for row in full_rows(rows):
        if row.throughput is None:
            continue
        line = [row.label, str(row.devices), str(row.global_batch), f"{row.step_ms:.3f}"]
        line += [*_breakdown_cells(row), _busbw_cell(row, busbw), traffic_cell(row)] if breakdown else []
        line += _telemetry_cells(row) if telemetry else []
        cells.append(tuple(line))
    notes = (BREAKDOWN_NOTE, TRAFFIC_NOTE) * breakdown + (TELEMETRY_NOTE,) * telemetry
    return CostColumns(tuple(headers), tuple(cells), notes)


def _cost_table(model: str, rows: list[Row], busbw: Busbw, compact: bool = False) -> Table | None:
    columns = cost_columns(rows, busbw)
    if columns is None:
        return None
    table = Table(title=f"model {model}: where the time goes", title_justify="left",
                  caption="\n".join(columns.notes), caption_justify="left", **(COMPACT_STYLE if compact else {}))
    for header in columns.headers:
        table.add_column(header, justify="left" if header == "program" else "right", no_wrap=True)
    for line in columns.rows:
        table.add_row(*line)
    return table


def _model_table(model: str, rows: list[Row]) -> Table:
    facts = model_facts(rows)
    title = f"model {model}" + (f" — {facts}" if facts else "")
    # A column of nothing but "unknown" (every CPU run) would only squeeze the notes; the
    # caption says why it is missing, and the report keeps it.
    shown = [i for i, header in enumerate(RESULT_HEADERS) if header != "MFU" or any(r.peak for r in rows)]
    caption = _caption(rows) + ("" if len(shown) == len(RESULT_HEADERS)
                                else "\nMFU: unknown here (no peak for these devices; CPUs never have one)")
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    headers = result_headers(rows)
    for index in shown:
        table.add_column(headers[index], justify="right" if index in NUMERIC_COLUMNS else "left",
                         no_wrap=RESULT_HEADERS[index] not in ("program", "notes"))
    for row in full_rows(rows):
        cells = _cells(row)
        table.add_row(*(cells[i] for i in shown))
    return table


def _telemetry_cells(row: Row) -> list[str]:
    util, mem, energy = gpu_util_pct(row), memory_gib(row), energy_mj_per_sample(row)
    estimated = row.memory_estimate_gib
    bound = "≤" if memory_is_bound(row) else ""
    return ["" if util is None else f"{util:.0f}", "" if mem is None else f"{bound}{mem:.2f}",
            "" if estimated is None else f"{estimated:.2f}", "" if energy is None else f"{energy:.3g}"]


def traffic_cell(row: Row) -> str:
    """What one step of a multi-device row moves (`xbench.models.traffic`), e.g. "AR 7.7 MiB"
    or "AG 2×3.9 MiB + RS 7.7 MiB"; "" on one device or where the model or precision is unknown."""
    if row.devices < 2 or not row.params or row.precision not in COMPUTE_BYTES:
        return ""
    moved = step_traffic(row.params, row.precision, row.sharded, row.devices)
    if not row.sharded:
        return f"AR {_mib(moved.all_reduce)}"
    return f"AG {moved.gathers}×{_mib(moved.all_gather // moved.gathers)} + RS {_mib(moved.reduce_scatter)}"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.3g} MiB"


def _busbw_cell(row: Row, busbw: Busbw) -> str:
    value = busbw.get((row.backend, row.devices, 4 * row.params)) if row.params else None
    return f"{value / 1e9:.2f}" if value is not None and row.devices > 1 else ""


def _breakdown_cells(row: Row) -> list[str]:
    b = row.breakdown
    if b is None:
        return ["", "", ""] if row.devices > 1 else [f"{row.step_ms:.3f}" if row.step_ms else "", "0", "0%"]
    return [f"{b.compute_ms:.3f}", f"{b.comm_ms:.3f}", f"{b.comm_fraction:.0%}"]


VERDICT_STYLE = {"multi-device beneficial": "green", "single device preferred": "red"}


def _cells(row: Row) -> list[str]:
    if row.throughput is None:
        head = [row.label, str(row.devices), str(row.global_batch)]
        return [*head, status_cell(row), *[""] * (len(RESULT_HEADERS) - 4)]
    cells = [escape(cell) for cell in result_cells(row, brief=True)]
    verdict_at, notes_at = RESULT_HEADERS.index("verdict"), RESULT_HEADERS.index("notes")
    style = VERDICT_STYLE.get(cells[verdict_at])
    if style:
        cells[verdict_at] = f"[{style}]{cells[verdict_at]}[/]"
    if row.unstable or row.throttled:
        cells[notes_at] = f"[yellow]{cells[notes_at]}[/]"
    return cells


def status_cell(row: Row) -> str:
    """What an unmeasured row shows in place of its throughput."""
    return f"[yellow]{DOES_NOT_FIT}[/]" if does_not_fit(row) else f"[red]{row.status}[/]"


def unmeasured_line(row: Row) -> str:
    """An unmeasured row under the table: its id and why (a does-not-fit reason says so itself)."""
    said = row.reason if does_not_fit(row) else f"{row.status}: {row.reason}"
    return f"{row.trial_id}: {escape(str(said))}"


def format_p(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def _caption(rows: list[Row]) -> str:
    modes = " and ".join(sorted({r.scaling_mode for r in rows}))
    lines = [
        f"{modes} scaling; samples/s: geometric mean of the replicates' means, which every ratio divides (reps: "
        "replicates, each a fresh worker process); 95% interval: of that mean, ± where nearly symmetric, else its "
        "bounds, in words where they lie more than 2× apart, the spread pooled over the backend's configurations; "
        "speedup (95% interval) over the same program on 1 device (\"vs plain\" in it: "
        "over the plain program, another program, as --single-device plain asks); vs plain: over the backend's plain "
        "single-device program, program and devices together; verdict: the zone "
        f"that holds the whole speedup interval (beneficial ≥ {BENEFICIAL_SPEEDUP:.2f}, single device ≤ "
        f"{SINGLE_PREFERRED_BELOW:.2f}, about even between; inconclusive: it spans one); wide: the throughput's 95% "
        "interval is wider than its target; unstable: replicates disagree beyond "
        "their windows; host-bound: the step measures dispatch, not arithmetic; MFU: model FLOPs utilisation "
        "against the devices' dense peak at this precision (details in the report)",
    ]
    lines += [f"links: {said}" for said in sorted({r.links for r in rows if r.links})]
    lines += [unmeasured_line(r) for r in rows if r.throughput is None]
    return "\n".join(lines)


def devices_line(backend: str, info: Mapping[str, Any], launcher: str = "subprocess") -> str:
    """What a backend runs on, e.g. 'jax (jax 0.10.2): simulated CPU devices ...'."""
    version = f"{info['framework']} {info['framework_version']}"
    how = "one process per device" if launcher == "spmd" else "one process drives all devices"
    if info["simulated"]:
        kind = "CPU processes" if launcher == "spmd" else "simulated CPU devices (one CPU split into"
        limit = f"up to {info['available']}" + ("" if launcher == "spmd" else ")")
        return f"{backend} ({version}, {how}): no GPU found; {kind} {limit}"
    names = ", ".join(dict.fromkeys(n.split(" ", 1)[-1] for n in info["device_names"]))
    return f"{backend} ({version}, {how}): {info['available']} {info['platform'].upper()}(s): {names}"
