"""PNG plots of a run, drawn with matplotlib (imported only when a plot is drawn).

How a series is drawn, the same in every figure of a model: its colour is its framework's
(jax, torch, tf, ...), its marker tells the programs of one framework apart ("jax",
"jax plain", "jax-shardmap+fused"), its line style is its device count (in the scaling plot,
its global batch). Every estimate carries its 95 % interval as an error bar, taken from the
row as the tables give it (never recomputed here), clipped to the axis; an open marker has no
interval (a single replicate). Series sharing an x value are nudged apart by a few points so
that their bars stay visible; the data keep their exact x. Reference lines (1×, ideal) are
drawn and named inside the axes, and the legend sits outside them. Figures have an opaque
white background so they read the same in light and dark viewers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from xbench.contract import ALL_REDUCE
from xbench.report.drawing import (
    CLIPPED,
    COLOURS,
    DEVICE_DASHES,
    LEGEND_NEAR,
    LINEAR_STRETCH,
    REFERENCE,
    Key,
    Points,
    Style,
    all_estimates,
    all_values,
    axis_limits,
    batch_axis,
    devices_name,
    draw_every_series,
    frameworks_of,
    interval_bars,
    interval_notes,
    legend_outside,
    log_y_axis,
    new_figure,
    nudged,
    reference_line,
    series_slots,
    si,
    style_of,
)
from xbench.results.allreduce import TITLES, AllReduceResult, bus_factor
from xbench.results.summary import Row


def _measured(rows: Sequence[Row]) -> list[Row]:
    return [row for row in rows if row.throughput is not None]


def _row_style(rows: Sequence[Row]) -> Style:
    """The style of a model's figures, from all its measured rows: the same in each figure."""
    measured = _measured(rows)
    return style_of(frameworks_of(measured), [r.devices for r in measured], DEVICE_DASHES)


def _series(rows: Sequence[Row]) -> dict[Key, list[Row]]:
    """Measured rows grouped by (label, devices), each sorted by global batch."""
    groups: dict[Key, list[Row]] = {}
    for row in _measured(rows):
        groups.setdefault((row.label, row.devices), []).append(row)
    return {key: sorted(group, key=lambda r: r.global_batch) for key, group in sorted(groups.items())}


def _throughput_points(group: Sequence[Row]) -> Points:
    k = group[0].units_per_sample
    return Points([r.global_batch for r in group], [r.measured.mean * k for r in group],
                  [r.measured.ci_low * k for r in group], [r.measured.ci_high * k for r in group])


def throughput_figure(rows: Sequence[Row], model: str):
    """Samples/s against global batch, log-log, one line per program and device count, each
    mean with its 95 % interval; None when nothing was measured."""
    series = {key: _throughput_points(group) for key, group in _series(rows).items()}
    if not series:
        return None
    unit = rows[0].unit
    fig, ax = new_figure(f"Throughput, model {model}", "global batch (samples per step)",
                         f"throughput ({unit}/s, mean, log scale)")
    batch_axis(ax, [int(x) for p in series.values() for x in p.x])
    log_y_axis(ax, *axis_limits(all_values(series), log=True, estimates=all_estimates(series)), si)
    style = _row_style(rows)
    clipped = draw_every_series(fig, ax, series, style, lambda label, devices: f"{label}, {devices_name(devices)}")
    if len({x for p in series.values() for x in p.x}) == 1:
        _name_device_counts(fig, ax, series)
    legend_outside(ax, style, [k[0] for k in series], [k[1] for k in series], devices_name,
                   interval_notes(series.values(), clipped), x=LEGEND_NEAR)
    return fig


def _name_device_counts(fig, ax, series: dict[Key, Points]) -> None:
    """At a single batch size line styles cannot show: name each device count's cluster of
    points beside it."""
    from matplotlib.transforms import offset_copy

    counts = sorted({devices for _, devices in series})
    last, count = max(series_slots(series).values())
    beside = offset_copy(nudged(fig, ax, last, count), fig=fig, x=8, y=0, units="points")
    for devices in counts:
        values = [v for (_, d), p in series.items() if d == devices for v in p.y]
        middle = math.exp(sum(math.log(v) for v in values) / len(values))
        ax.text(series[next(k for k in series if k[1] == devices)].x[0], middle, devices_name(devices),
                transform=beside, va="center", ha="left", fontsize="small", color=REFERENCE)


def _speedup_points(group: Sequence[Row]) -> Points:
    scaled = [(r.global_batch, r.scaling) for r in group if r.scaling is not None]
    return Points([b for b, _ in scaled], [s.speedup for _, s in scaled], [s.ci_low for _, s in scaled],
                  [s.ci_high for _, s in scaled])


def speedup_figure(rows: Sequence[Row], model: str):
    """Speedup over the same backend on 1 device against global batch, with its 95 % interval,
    the 1× line and the ideal line of each device count; None without a multi-device result."""
    series = {key: _speedup_points(group) for key, group in _series(rows).items() if key[1] > 1}
    series = {key: points for key, points in series.items() if points.x}
    if not series:
        return None
    fig, ax = new_figure(f"Speedup over 1 device, model {model}", "global batch (samples per step)",
                         "speedup (× the 1-device throughput)")
    counts = sorted({devices for _, devices in series})
    batch_axis(ax, [int(x) for p in series.values() for x in p.x])
    ax.set_ylim(*axis_limits(all_values(series), log=False, floor=0.0, include=max(counts),
                             estimates=all_estimates(series), stretch=LINEAR_STRETCH))
    style = _row_style(rows)
    reference_line(ax, 1.0, "1×\nno gain", "1.0: no gain", color="black")
    for devices in counts:
        reference_line(ax, devices, f"{devices}×\nideal", f"ideal on {devices} devices", style.dashes[devices])
    clipped = draw_every_series(fig, ax, series, style, lambda label, devices: f"{label}, {devices} devices")
    legend_outside(ax, style, [k[0] for k in series], counts, devices_name, interval_notes(series.values(), clipped))
    return fig


def _scaling_series(rows: Sequence[Row]) -> dict[Key, list[Row]]:
    """Multi-device rows with a speedup, by (label, global batch), sorted by device count."""
    series: dict[Key, list[Row]] = {}
    for row in rows:
        if row.scaling is not None and row.devices > 1:
            series.setdefault((row.label, row.global_batch), []).append(row)
    return {key: sorted(group, key=lambda r: r.devices) for key, group in sorted(series.items())}


def _scaling_points(group: Sequence[Row], efficiency: bool) -> Points:
    """Speedup (or efficiency: speedup / devices) against devices, from (1, 1.0): the baseline
    itself, exact by definition."""
    scale = [r.devices if efficiency else 1 for r in group]
    scaled = [(r.devices, r.scaling, n) for r, n in zip(group, scale) if r.scaling is not None]
    return Points([1, *(d for d, _, _ in scaled)], [1.0, *(s.speedup / n for _, s, n in scaled)],
                  [1.0, *(s.ci_low / n for _, s, n in scaled)], [1.0, *(s.ci_high / n for _, s, n in scaled)])


def scaling_figure(rows: Sequence[Row], model: str):
    """Speedup and scaling efficiency against device count, one line per program and global
    batch, with their 95 % intervals, the ideal and the no-gain lines; None unless at least
    two multi-device counts were measured."""
    series = _scaling_series(rows)
    counts = sorted({r.devices for group in series.values() for r in group})
    if len(counts) < 2:
        return None
    fig, (ax, eff) = new_figure(f"Scaling with device count, model {model}", "devices", "", panels=2)
    ax.set_ylabel("speedup (× the 1-device throughput)")
    eff.set_ylabel("scaling efficiency (speedup / devices)")
    style = style_of(frameworks_of(r for group in series.values() for r in group), [k[1] for k in series])
    speed = {key: _scaling_points(group, efficiency=False) for key, group in series.items()}
    share = {key: _scaling_points(group, efficiency=True) for key, group in series.items()}
    clipped = _speedup_panel(fig, ax, speed, style, [1, *counts])
    clipped = _efficiency_panel(fig, eff, share, style, [1, *counts]) or clipped
    legend_outside(eff, style, [k[0] for k in series], [k[1] for k in series],
                   lambda b: "global batch" if b == 0 else f"batch {b:,}", interval_notes(speed.values(), clipped))
    return fig


def _scaling_slots(series: dict[Key, Points]) -> dict[Key, tuple[int, int]]:
    """A slot per series: the batch sizes of one program are apart too."""
    return {key: (i, len(series)) for i, key in enumerate(series)}


def _devices_axis(ax, counts: Sequence[int]) -> None:
    ax.set_xticks(counts)
    ax.set_xlim(counts[0] - 0.06 * (counts[-1] - counts[0]) - 0.2, counts[-1] + 0.06 * (counts[-1] - counts[0]) + 0.2)


def _speedup_panel(fig, ax, series: dict[Key, Points], style: Style, counts: Sequence[int]) -> bool:
    _devices_axis(ax, counts)
    ax.set_ylim(*axis_limits(all_values(series), log=False, floor=0.0, include=counts[-1],
                             estimates=all_estimates(series), stretch=LINEAR_STRETCH))
    ax.plot(counts, counts, color=REFERENCE, linewidth=1.0, linestyle=":", label="ideal (speedup = devices)", zorder=1)
    ax.annotate("ideal", (counts[-1], counts[-1]), xytext=(-4, 4), textcoords="offset points", ha="right",
                va="bottom", fontsize="small", color=REFERENCE)
    reference_line(ax, 1.0, "1×", "1.0: no gain", color="black")
    return draw_every_series(fig, ax, series, style, lambda label, batch: f"{label}, batch {batch}",
                             _scaling_slots(series))


def _efficiency_panel(fig, ax, series: dict[Key, Points], style: Style, counts: Sequence[int]) -> bool:
    _devices_axis(ax, counts)
    ax.set_ylim(*axis_limits(all_values(series), log=False, floor=0.0, include=1.0, estimates=all_estimates(series),
                         stretch=LINEAR_STRETCH))
    reference_line(ax, 1.0, "ideal", "ideal efficiency", linestyle=":")
    ax.plot(counts, [1 / n for n in counts], color="black", linewidth=1.0, label="no gain (1 / devices)", zorder=1)
    ax.annotate("no gain", (counts[-1], 1 / counts[-1]), xytext=(-4, 4), textcoords="offset points", ha="right",
                va="bottom", fontsize="small", color="black")
    return draw_every_series(fig, ax, series, style, lambda label, batch: f"{label}, batch {batch}, efficiency",
                             _scaling_slots(series))


def breakdown_figure(rows: Sequence[Row], model: str):
    """Stacked bars per multi-device trial in its framework's colour: compute-only step time,
    then the exposed communication (hatched) on top (drawn from zero when the difference is
    within noise); the bar carries the 95 % interval of the full step time."""
    measured = [(r, r.breakdown) for r in rows if r.breakdown is not None]
    if not measured:
        return None
    fig, ax = new_figure(f"Where a step's time goes, model {model}", "program, devices, global batch",
                         "time per step (ms, at the median throughput)")
    style = _row_style(rows)
    labels = [f"{r.label}\n{r.devices} dev, b{r.global_batch:,}" for r, _ in measured]
    colours = [style.colours.get(r.label, COLOURS[-1]) for r, _ in measured]
    compute = [b.compute_ms for _, b in measured]
    comm = [max(b.comm_ms, 0.0) for _, b in measured]
    ax.bar(labels, compute, color=colours, alpha=0.85, label="compute (step without the all-reduce)")
    ax.bar(labels, comm, bottom=compute, color="white", edgecolor=colours, hatch="///", linewidth=1.0,
           label="exposed communication")
    steps = _step_points([r for r, _ in measured])
    tops = [c + m for c, m in zip(compute, comm)]
    ax.set_ylim(*axis_limits((*tops, *steps.low, *steps.high), log=False, floor=0.0, estimates=tops,
                         stretch=LINEAR_STRETCH))
    shown = steps.bars()
    if shown:
        ax.plot([steps.x[i] for i in shown], [steps.y[i] for i in shown], linestyle="none", marker="_",
                markersize=12, color="black", label="_full step")
    _breakdown_legend(ax, interval_bars(ax, steps, "black", ax.transData), bool(shown))
    return fig


def _step_points(rows: Sequence[Row]) -> Points:
    """Each full step's time (ms) at its mean throughput with the 95 % interval, from the row's
    throughput interval (at bar positions 0, 1, ...)."""
    def ms(row: Row, rate: str) -> float:
        value = getattr(row.throughput, rate) if row.throughput else math.nan
        return row.global_batch / value * 1e3 if value > 0 else math.inf if value <= 0 else math.nan

    return Points(list(range(len(rows))), [ms(r, "mean") for r in rows], [ms(r, "ci_high") for r in rows],
                  [ms(r, "ci_low") for r in rows])


def _breakdown_legend(ax, clipped: bool, whiskers: bool) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [Patch(facecolor="#888888", alpha=0.85, label="compute (step without the all-reduce)"),
                          Patch(facecolor="white", edgecolor="#888888", hatch="///", label="exposed communication")]
    if whiskers:
        handles.append(Line2D([], [], color="black", marker="_", markersize=12,
                              label="full step: mean, 95% interval" + (CLIPPED if clipped else "")))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small",
              frameon=False, title="colour: framework", title_fontsize="small")


def _busbw_points(group: Sequence[AllReduceResult]) -> Points:
    """Bus bandwidth (GB/s) at the median time, with the median's 95 % interval (the one the
    table prints; nan, no bar, where too few windows gave none)."""
    def gbps(r: AllReduceResult, seconds: float) -> float:
        return r.nbytes * bus_factor(r.devices, r.collective) / seconds / 1e9 if seconds > 0 else math.inf

    def bound(r: AllReduceResult, end: int) -> float:
        return math.nan if r.median_ci is None else gbps(r, r.median_ci[end])

    return Points([r.nbytes for r in group], [r.busbw / 1e9 for r in group],
                  [bound(r, 1) for r in group], [bound(r, 0) for r in group])


def busbw_figure(results: Sequence[AllReduceResult], collective: str = ALL_REDUCE):
    """One collective's bus bandwidth (all-reduce unless named) against message size, one line
    per backend and device count, with the interval of the time behind it."""
    groups: dict[Key, list[AllReduceResult]] = {}
    for r in results:
        if r.devices > 1 and r.collective == collective:
            groups.setdefault((r.label, r.devices), []).append(r)
    if not groups:
        return None
    series = {key: _busbw_points(sorted(group, key=lambda r: r.nbytes)) for key, group in sorted(groups.items())}
    size = "message size per device (bytes)" if collective == ALL_REDUCE else "size, nccl-tests' (bytes)"
    fig, ax = new_figure(f"{TITLES[collective].capitalize()} bus bandwidth", size, "busbw (GB/s, median time)")
    _size_axis(ax, [r.nbytes for group in groups.values() for r in group])
    log_y_axis(ax, *axis_limits(all_values(series), log=True, estimates=all_estimates(series)), lambda v: f"{v:g}")
    # All-reduce records name no framework: a colour per backend.
    style = style_of({r.label: r.backend for group in groups.values() for r in group}, [k[1] for k in series],
                     DEVICE_DASHES)
    clipped = draw_every_series(fig, ax, series, style, lambda label, devices: f"{label}, {devices} devices")
    notes = ["bars: the median time's 95% interval" + (CLIPPED if clipped else "")] \
        if any(p.bars() for p in series.values()) else []
    legend_outside(ax, style, [k[0] for k in series], [k[1] for k in series], devices_name, notes, x=LEGEND_NEAR)
    return fig


def _size_axis(ax, sizes: Sequence[int]) -> None:
    """Log-2 x axis with ticks at powers of 4 labelled as KiB/MiB/GiB."""
    from matplotlib.ticker import FixedLocator, NullLocator

    from xbench.results.allreduce import format_size

    ax.set_xscale("log", base=2)
    low, high = min(sizes).bit_length() - 1, max(sizes).bit_length()
    ticks = [2**k for k in range(low - low % 2, high + 1, 2)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([format_size(t) for t in ticks], rotation=30)
    ax.set_xlim(min(sizes) / 1.5, max(sizes) * 1.5)
