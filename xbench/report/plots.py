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
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xbench.contract import backend_of_implementation
from xbench.results.allreduce import AllReduceResult, bus_factor
from xbench.results.records import write_atomic
from xbench.results.summary import Row

DPI = 110
FIGSIZE = (7.2, 4.4)  # inches, the axes and labels; the legend adds its width on the right
FRAMEWORK_COLOURS = {"jax": "#0072B2", "torch": "#D55E00", "tf": "#009E73"}  # Okabe-Ito
SPARE_COLOURS = ("#CC79A7", "#E69F00", "#56B4E9", "#882255", "#444444")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h", "<", ">")
DEVICE_DASHES: dict[int, Any] = {1: "-", 2: "--", 4: "-.", 8: ":"}
SPARE_DASHES: tuple[Any, ...] = ((0, (6, 2, 1, 2, 1, 2)), (0, (10, 3)), (0, (1, 2)), (0, (4, 1, 4, 4)))
REFERENCE = "#555555"  # the 1× and ideal lines, and the device-count legend entries
STRETCH = 10.0  # how far beyond the estimates an interval may stretch a log axis (times)
LINEAR_STRETCH = 1.6  # and a linear one (times the largest estimate or reference line)
NUDGE_PT = 5.0  # points between series at one x value
LEGEND_X = 1.12  # axes fractions: the legend's left edge, right of the reference lines' names
LEGEND_NEAR = 1.03  # where no reference line is named
INTERVAL = "bars: 95% interval"
CLIPPED = ",\n  cut at the frame when wider"
NO_INTERVAL = "open marker: no interval (1 replicate)"

Key = tuple[str, int]  # a series: (label, devices) or, in the scaling plot, (label, global batch)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def framework(label: str) -> str:
    """The framework of a series label: "jax-shardmap plain+fused" -> "jax", "torch (spmd)" -> "torch"."""
    return backend_of_implementation(label).split("-")[0].split("_")[0]


@dataclass(frozen=True)
class Style:
    """Colour and marker per series label, line style per level (device count or batch)."""

    colours: dict[str, str]
    markers: dict[str, str]
    dashes: dict[int, Any]

    def line(self, label: str, level: int) -> dict[str, Any]:
        return {"color": self.colours[label], "marker": self.markers[label], "linestyle": self.dashes[level],
                "linewidth": 1.5, "markersize": 6}


def style_of(labels: Iterable[str], levels: Iterable[int], fixed: dict[int, Any] | None = None) -> Style:
    """One colour per framework, one marker per label within its framework, one line style
    per level (`fixed` ones first: a device count keeps its style from figure to figure)."""
    names = sorted(set(labels))
    frameworks = sorted({framework(name) for name in names})
    spare = iter(SPARE_COLOURS)
    by_framework = {f: FRAMEWORK_COLOURS.get(f) or next(spare, SPARE_COLOURS[-1]) for f in frameworks}
    markers: dict[str, str] = {}
    for f in frameworks:
        mine = [name for name in names if framework(name) == f]
        markers.update({name: MARKERS[i % len(MARKERS)] for i, name in enumerate(mine)})
    return Style({name: by_framework[framework(name)] for name in names}, markers, _dashes(levels, fixed or {}))


def _dashes(levels: Iterable[int], fixed: dict[int, Any]) -> dict[int, Any]:
    dashes = {level: fixed[level] for level in set(levels) if level in fixed}
    spare = [d for d in ("-", "--", "-.", ":", *SPARE_DASHES) if d not in dashes.values()]
    for i, level in enumerate(sorted(set(levels) - set(dashes))):
        dashes[level] = spare[i % len(spare)]
    return dashes


def _measured(rows: Sequence[Row]) -> list[Row]:
    return [row for row in rows if row.throughput is not None]


def _row_style(rows: Sequence[Row]) -> Style:
    """The style of a model's figures, from all its measured rows: the same in each figure."""
    measured = _measured(rows)
    return style_of([r.label for r in measured], [r.devices for r in measured], DEVICE_DASHES)


def _series(rows: Sequence[Row]) -> dict[Key, list[Row]]:
    """Measured rows grouped by (label, devices), each sorted by global batch."""
    groups: dict[Key, list[Row]] = {}
    for row in _measured(rows):
        groups.setdefault((row.label, row.devices), []).append(row)
    return {key: sorted(group, key=lambda r: r.global_batch) for key, group in sorted(groups.items())}


def _figure(title: str, xlabel: str, ylabel: str, panels: int = 1):
    width = FIGSIZE[0] if panels == 1 else FIGSIZE[0] * 0.75 * panels
    fig, axes = _pyplot().subplots(1, panels, figsize=(width, FIGSIZE[1]), dpi=DPI, facecolor="white",
                                   squeeze=False)
    for ax in axes[0]:
        ax.set_facecolor("white")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    if panels == 1:
        axes[0][0].set_title(title)
        return fig, axes[0][0]
    fig.suptitle(title)
    fig.subplots_adjust(wspace=0.42)  # room for the reference lines' names between the panels
    return fig, list(axes[0])


def _slots(keys: Collection[Key]) -> dict[Key, tuple[int, int]]:
    """Each series' sideways slot and the number of slots: one per label, so that a program's
    points line up across device counts."""
    labels = sorted({label for label, _ in keys})
    return {key: (labels.index(key[0]), len(labels)) for key in keys}


def _nudge(fig, ax, index: int, count: int):
    """ax's data transform shifted sideways by the index-th of `count` slots, in points."""
    from matplotlib.transforms import ScaledTranslation

    step = min(NUDGE_PT, 40.0 / max(count, 1))
    return ax.transData + ScaledTranslation((index - (count - 1) / 2) * step / 72, 0, fig.dpi_scale_trans)


@dataclass(frozen=True)
class Points:
    """One series' estimates with their intervals (nan: none)."""

    x: list[float]
    y: list[float]
    low: list[float]
    high: list[float]

    def with_interval(self) -> list[int]:
        """The points with an interval (a point of zero width is exact: the 1-device baseline)."""
        return [i for i, (lo, hi) in enumerate(zip(self.low, self.high)) if not (math.isnan(lo) or math.isnan(hi))]

    def bars(self) -> list[int]:
        return [i for i in self.with_interval() if self.high[i] > self.low[i]]

    def estimated(self) -> list[int]:
        """The points that are estimates (not exact): those that get a marker."""
        return [i for i in range(len(self.x)) if not self.low[i] == self.high[i] == self.y[i]]


def _draw(ax, points: Points, label: str, look: dict[str, Any], transform) -> bool:
    """The series' line, its interval bars (clipped to the y limits already set) and open
    markers where it has no interval; whether a bar was cut at the frame."""
    ax.plot(points.x, points.y, label=label, transform=transform, markevery=points.estimated(), **look)
    clipped = _bars(ax, points, look["color"], transform)
    known = points.with_interval()
    bare = [i for i in range(len(points.x)) if i not in known]
    if bare:
        ax.plot([points.x[i] for i in bare], [points.y[i] for i in bare], linestyle="none", marker=look["marker"],
                markersize=look["markersize"], color=look["color"], markerfacecolor="white", transform=transform,
                label="_no interval")
    return clipped


def _draw_all(fig, ax, series: dict[Key, Points], style: Style, name: Callable[[str, int], str],
              slots: dict[Key, tuple[int, int]] | None = None) -> bool:
    """Each (label, level) series, nudged sideways in its slot (by default its label's);
    whether a bar was cut at the frame."""
    slots = slots or _slots(series)
    return any([_draw(ax, points, name(label, level), style.line(label, level), _nudge(fig, ax, *slots[label, level]))
                for (label, level), points in series.items()])


def _bars(ax, points: Points, colour: str, transform) -> bool:
    """Error bars from each point's interval, clipped to the axis's y limits; whether one was."""
    bottom, top = ax.get_ylim()
    shown = points.bars()
    if not shown:
        return False
    y = [points.y[i] for i in shown]
    below = [max(v - max(points.low[i], bottom), 0.0) for i, v in zip(shown, y)]
    above = [max(min(points.high[i], top) - v, 0.0) for i, v in zip(shown, y)]
    ax.errorbar([points.x[i] for i in shown], y, yerr=[below, above], fmt="none", ecolor=colour, elinewidth=1.3,
                capsize=3, capthick=1.3, transform=transform)
    return any(points.low[i] < bottom or points.high[i] > top for i in shown)


def _limits(values: Iterable[float], log: bool, floor: float | None = None, include: float = math.nan,
            estimates: Iterable[float] = (), stretch: float = STRETCH) -> tuple[float, float]:
    """Y limits around the finite (on a log axis, positive) values with a margin, so that
    nothing sits on the border; `floor` fixes the bottom, `include` is a value to show. With
    `estimates` given, `values` (their intervals) stretch the axis at most `stretch` times beyond
    them: a wider bar is cut at the frame."""
    finite = [v for v in (*values, include) if math.isfinite(v) and (v > 0 if log else True)]
    low, high = min(finite), max(finite)
    points = [v for v in (*estimates, include) if math.isfinite(v) and (v > 0 if log else True)]
    if points:
        low = max(low, min(points) / stretch) if log else low
        high = min(high, max(points) * stretch)
    if log:
        pad = max(high / low, 1.05) ** 0.08
        return low / pad, high * pad
    span = (high - (floor if floor is not None else low)) or abs(high) or 1.0
    return (floor if floor is not None else low - 0.08 * span), high + 0.1 * span


def _values(series: dict[Key, Points]) -> list[float]:
    """Every estimate and interval end of the series (nan and inf included: `_limits` drops them)."""
    return [v for p in series.values() for v in (*p.y, *p.low, *p.high)]


def _estimates(series: dict[Key, Points]) -> list[float]:
    return [v for p in series.values() for v in p.y]


def _log_y(ax, low: float, high: float, format_value: Callable[[float], str]) -> None:
    """A log y axis from low to high with labelled ticks, dense enough for a narrow range."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.set_ylim(low, high)
    span = high / low
    subs = tuple(range(1, 10)) if span < 12 else (1.0, 2.0, 5.0) if span < 1000 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v)))
    ax.yaxis.set_minor_formatter(NullFormatter())


def si(value: float) -> str:
    """3200000 -> "3.2M", 45000 -> "45k", 120 -> "120"."""
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def _batch_axis(ax, batches: Sequence[int]) -> None:
    """Log-2 x axis labelled with the batch sizes themselves, with room at both ends."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ticks = sorted(set(batches))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{b:,}" for b in ticks], rotation=30 if len(ticks) > 6 else 0)
    pad = 2 ** max(0.5, 0.1 * math.log2(ticks[-1] / ticks[0]))
    ax.set_xlim(ticks[0] / pad, ticks[-1] * pad)


def _reference(ax, y: float, text: str, label: str, linestyle: Any = "-", color: str = REFERENCE) -> None:
    """A horizontal reference line, named in the margin right of the axes (never over data)."""
    ax.axhline(y, color=color, linewidth=1.0, linestyle=linestyle, label=label, zorder=1)
    ax.annotate(text, (1.0, y), xycoords=("axes fraction", "data"), xytext=(4, 0), textcoords="offset points",
                ha="left", va="center", fontsize="small", color=color, annotation_clip=False)


def _legend(ax, style: Style, labels: Iterable[str], levels: Iterable[int], level_name: Callable[[int], str],
            notes: Sequence[str] = (), x: float = LEGEND_X) -> None:
    """The legend right of the axes (from `x`, in axes fractions): programs (colour and
    marker), levels (line style), notes."""
    from matplotlib.lines import Line2D

    def heading(text: str) -> Line2D:
        return Line2D([], [], linestyle="none", label=text)

    headings = [heading("program"), heading(level_name(0))]
    handles = [headings[0]]
    handles += [Line2D([], [], color=style.colours[n], marker=style.markers[n], linestyle="none", label=n)
                for n in sorted(set(labels))]
    handles += [headings[1]]
    handles += [Line2D([], [], color=REFERENCE, linestyle=style.dashes[v], label=level_name(v))
                for v in sorted(set(levels))]
    handles += [Line2D([], [], linestyle="none", label=note) for note in notes]
    legend = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(x, 1.0), borderaxespad=0.0,
                       fontsize="small", frameon=False, handlelength=2.6)
    for text, handle in zip(legend.get_texts(), handles):
        if handle in headings:
            text.set_fontweight("bold")
        elif handle.get_label() in notes:
            text.set_fontstyle("italic")


def _notes(all_points: Iterable[Points], clipped: bool = False) -> list[str]:
    points = list(all_points)
    notes = [INTERVAL + (CLIPPED if clipped else "")] if any(p.bars() for p in points) else []
    return notes + ([NO_INTERVAL] if any(len(p.with_interval()) < len(p.x) for p in points) else [])


def _devices_name(n: int) -> str:
    return "devices" if n == 0 else f"{n} device{'s' if n > 1 else ''}"


def save(fig, path: Path) -> Path:
    """Write a figure as PNG (the legend outside the axes included) and free it."""
    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", facecolor="white", bbox_inches="tight",
                                                   pad_inches=0.12))
    finally:
        _pyplot().close(fig)
    return path


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
    fig, ax = _figure(f"Throughput, model {model}", "global batch (samples per step)",
                      f"throughput ({unit}/s, mean, log scale)")
    _batch_axis(ax, [int(x) for p in series.values() for x in p.x])
    _log_y(ax, *_limits(_values(series), log=True, estimates=_estimates(series)), si)
    style = _row_style(rows)
    clipped = _draw_all(fig, ax, series, style, lambda label, devices: f"{label}, {_devices_name(devices)}")
    if len({x for p in series.values() for x in p.x}) == 1:
        _name_device_counts(fig, ax, series)
    _legend(ax, style, [k[0] for k in series], [k[1] for k in series], _devices_name,
            _notes(series.values(), clipped), x=LEGEND_NEAR)
    return fig


def _name_device_counts(fig, ax, series: dict[Key, Points]) -> None:
    """At a single batch size line styles cannot show: name each device count's cluster of
    points beside it."""
    from matplotlib.transforms import offset_copy

    counts = sorted({devices for _, devices in series})
    last, count = max(_slots(series).values())
    beside = offset_copy(_nudge(fig, ax, last, count), fig=fig, x=8, y=0, units="points")
    for devices in counts:
        values = [v for (_, d), p in series.items() if d == devices for v in p.y]
        middle = math.exp(sum(math.log(v) for v in values) / len(values))
        ax.text(series[next(k for k in series if k[1] == devices)].x[0], middle, _devices_name(devices),
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
    fig, ax = _figure(f"Speedup over 1 device, model {model}", "global batch (samples per step)",
                      "speedup (× the 1-device throughput)")
    counts = sorted({devices for _, devices in series})
    _batch_axis(ax, [int(x) for p in series.values() for x in p.x])
    ax.set_ylim(*_limits(_values(series), log=False, floor=0.0, include=max(counts), estimates=_estimates(series),
                         stretch=LINEAR_STRETCH))
    style = _row_style(rows)
    _reference(ax, 1.0, "1×\nno gain", "1.0: no gain", color="black")
    for devices in counts:
        _reference(ax, devices, f"{devices}×\nideal", f"ideal on {devices} devices", style.dashes[devices])
    clipped = _draw_all(fig, ax, series, style, lambda label, devices: f"{label}, {devices} devices")
    _legend(ax, style, [k[0] for k in series], counts, _devices_name, _notes(series.values(), clipped))
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
    fig, (ax, eff) = _figure(f"Scaling with device count, model {model}", "devices", "", panels=2)
    ax.set_ylabel("speedup (× the 1-device throughput)")
    eff.set_ylabel("scaling efficiency (speedup / devices)")
    style = style_of([k[0] for k in series], [k[1] for k in series])
    speed = {key: _scaling_points(group, efficiency=False) for key, group in series.items()}
    share = {key: _scaling_points(group, efficiency=True) for key, group in series.items()}
    clipped = _speedup_panel(fig, ax, speed, style, [1, *counts])
    clipped = _efficiency_panel(fig, eff, share, style, [1, *counts]) or clipped
    _legend(eff, style, [k[0] for k in series], [k[1] for k in series],
            lambda b: "global batch" if b == 0 else f"batch {b:,}", _notes(speed.values(), clipped))
    return fig


def _scaling_slots(series: dict[Key, Points]) -> dict[Key, tuple[int, int]]:
    """A slot per series: the batch sizes of one program are apart too."""
    return {key: (i, len(series)) for i, key in enumerate(series)}


def _devices_axis(ax, counts: Sequence[int]) -> None:
    ax.set_xticks(counts)
    ax.set_xlim(counts[0] - 0.06 * (counts[-1] - counts[0]) - 0.2, counts[-1] + 0.06 * (counts[-1] - counts[0]) + 0.2)


def _speedup_panel(fig, ax, series: dict[Key, Points], style: Style, counts: Sequence[int]) -> bool:
    _devices_axis(ax, counts)
    ax.set_ylim(*_limits(_values(series), log=False, floor=0.0, include=counts[-1], estimates=_estimates(series),
                         stretch=LINEAR_STRETCH))
    ax.plot(counts, counts, color=REFERENCE, linewidth=1.0, linestyle=":", label="ideal (speedup = devices)", zorder=1)
    ax.annotate("ideal", (counts[-1], counts[-1]), xytext=(-4, 4), textcoords="offset points", ha="right",
                va="bottom", fontsize="small", color=REFERENCE)
    _reference(ax, 1.0, "1×", "1.0: no gain", color="black")
    return _draw_all(fig, ax, series, style, lambda label, batch: f"{label}, batch {batch}", _scaling_slots(series))


def _efficiency_panel(fig, ax, series: dict[Key, Points], style: Style, counts: Sequence[int]) -> bool:
    _devices_axis(ax, counts)
    ax.set_ylim(*_limits(_values(series), log=False, floor=0.0, include=1.0, estimates=_estimates(series),
                         stretch=LINEAR_STRETCH))
    _reference(ax, 1.0, "ideal", "ideal efficiency", linestyle=":")
    ax.plot(counts, [1 / n for n in counts], color="black", linewidth=1.0, label="no gain (1 / devices)", zorder=1)
    ax.annotate("no gain", (counts[-1], 1 / counts[-1]), xytext=(-4, 4), textcoords="offset points", ha="right",
                va="bottom", fontsize="small", color="black")
    return _draw_all(fig, ax, series, style, lambda label, batch: f"{label}, batch {batch}, efficiency",
                     _scaling_slots(series))


def breakdown_figure(rows: Sequence[Row], model: str):
    """Stacked bars per multi-device trial in its framework's colour: compute-only step time,
    then the exposed communication (hatched) on top (drawn from zero when the difference is
    within noise); the bar carries the 95 % interval of the full step time."""
    measured = [(r, r.breakdown) for r in rows if r.breakdown is not None]
    if not measured:
        return None
    fig, ax = _figure(f"Where a step's time goes, model {model}", "program, devices, global batch",
                      "time per step (ms, at the median throughput)")
    style = _row_style(rows)
    labels = [f"{r.label}\n{r.devices} dev, b{r.global_batch:,}" for r, _ in measured]
    colours = [style.colours.get(r.label, SPARE_COLOURS[-1]) for r, _ in measured]
    compute = [b.compute_ms for _, b in measured]
    comm = [max(b.comm_ms, 0.0) for _, b in measured]
    ax.bar(labels, compute, color=colours, alpha=0.85, label="compute (step without the all-reduce)")
    ax.bar(labels, comm, bottom=compute, color="white", edgecolor=colours, hatch="///", linewidth=1.0,
           label="exposed communication")
    steps = _step_points([r for r, _ in measured])
    tops = [c + m for c, m in zip(compute, comm)]
    ax.set_ylim(*_limits((*tops, *steps.low, *steps.high), log=False, floor=0.0, estimates=tops,
                         stretch=LINEAR_STRETCH))
    shown = steps.bars()
    if shown:
        ax.plot([steps.x[i] for i in shown], [steps.y[i] for i in shown], linestyle="none", marker="_",
                markersize=12, color="black", label="_full step")
    _breakdown_legend(ax, _bars(ax, steps, "black", ax.transData), bool(shown))
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
        return r.nbytes * bus_factor(r.devices) / seconds / 1e9 if seconds > 0 else math.inf

    def bound(r: AllReduceResult, end: int) -> float:
        return math.nan if r.median_ci is None else gbps(r, r.median_ci[end])

    return Points([r.nbytes for r in group], [r.busbw / 1e9 for r in group],
                  [bound(r, 1) for r in group], [bound(r, 0) for r in group])


def busbw_figure(results: Sequence[AllReduceResult]):
    """All-reduce bus bandwidth against message size, one line per backend and device count,
    with the interval of the time behind it."""
    groups: dict[Key, list[AllReduceResult]] = {}
    for r in results:
        if r.devices > 1:
            groups.setdefault((r.label, r.devices), []).append(r)
    if not groups:
        return None
    series = {key: _busbw_points(sorted(group, key=lambda r: r.nbytes)) for key, group in sorted(groups.items())}
    fig, ax = _figure("All-reduce bus bandwidth", "message size per device (bytes)", "busbw (GB/s, median time)")
    _size_axis(ax, [r.nbytes for group in groups.values() for r in group])
    _log_y(ax, *_limits(_values(series), log=True, estimates=_estimates(series)), lambda v: f"{v:g}")
    style = style_of([k[0] for k in series], [k[1] for k in series], DEVICE_DASHES)
    clipped = _draw_all(fig, ax, series, style, lambda label, devices: f"{label}, {devices} devices")
    notes = ["bars: the median time's 95% interval" + (CLIPPED if clipped else "")] \
        if any(p.bars() for p in series.values()) else []
    _legend(ax, style, [k[0] for k in series], [k[1] for k in series], _devices_name, notes, x=LEGEND_NEAR)
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
