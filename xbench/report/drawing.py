"""The drawing kit of xbench's plots (matplotlib, imported only when a figure is drawn): one
style per series (a colour per framework, a marker per program, a line style per device count
or batch), series nudged sideways so that their interval bars stay visible, axes whose limits
keep every estimate and cut an interval at the frame when it is far wider, reference lines
named in the margin, and a legend outside the axes. `plots` draws the figures with it."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xbench.results.records import write_atomic
from xbench.results.rows import Row

DPI = 110
FIGSIZE = (7.2, 4.4)  # inches, the axes and labels; the legend adds its width on the right
# Okabe-Ito's colours (told apart with any colour vision), given to the frameworks of a figure in
# their alphabetical order: no framework is named in the core.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#882255", "#444444")
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


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class Style:
    """Colour and marker per series label, line style per level (device count or batch)."""

    colours: dict[str, str]
    markers: dict[str, str]
    dashes: dict[int, Any]

    def line(self, label: str, level: int) -> dict[str, Any]:
        return {"color": self.colours[label], "marker": self.markers[label], "linestyle": self.dashes[level],
                "linewidth": 1.5, "markersize": 6}


def frameworks_of(rows: Iterable[Row]) -> dict[str, str]:
    """Each series label's framework, as `Row.framework_key` gives it."""
    return {row.label: row.framework_key for row in rows}


def style_of(framework_of: Mapping[str, str], levels: Iterable[int], fixed: dict[int, Any] | None = None) -> Style:
    """One colour per framework (`framework_of`: each series label's), one marker per label
    within its framework, one line style per level (`fixed` ones first: a device count keeps its
    style from figure to figure)."""
    names = sorted(framework_of)
    frameworks = sorted(set(framework_of.values()))
    by_framework = {f: COLOURS[i % len(COLOURS)] for i, f in enumerate(frameworks)}
    markers: dict[str, str] = {}
    for f in frameworks:
        mine = [name for name in names if framework_of[name] == f]
        markers.update({name: MARKERS[i % len(MARKERS)] for i, name in enumerate(mine)})
    return Style({name: by_framework[framework_of[name]] for name in names}, markers, dashes_for(levels, fixed or {}))


def dashes_for(levels: Iterable[int], fixed: dict[int, Any]) -> dict[int, Any]:
    dashes = {level: fixed[level] for level in set(levels) if level in fixed}
    spare = [d for d in ("-", "--", "-.", ":", *SPARE_DASHES) if d not in dashes.values()]
    for i, level in enumerate(sorted(set(levels) - set(dashes))):
        dashes[level] = spare[i % len(spare)]
    return dashes


def new_figure(title: str, xlabel: str, ylabel: str, panels: int = 1):
    width = FIGSIZE[0] if panels == 1 else FIGSIZE[0] * 0.75 * panels
    fig, axes = pyplot().subplots(1, panels, figsize=(width, FIGSIZE[1]), dpi=DPI, facecolor="white",
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


def series_slots(keys: Collection[Key]) -> dict[Key, tuple[int, int]]:
    """Each series' sideways slot and the number of slots: one per label, so that a program's
    points line up across device counts."""
    labels = sorted({label for label, _ in keys})
    return {key: (labels.index(key[0]), len(labels)) for key in keys}


def nudged(fig, ax, index: int, count: int):
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


def draw_series(ax, points: Points, label: str, look: dict[str, Any], transform) -> bool:
    """The series' line, its interval bars (clipped to the y limits already set) and open
    markers where it has no interval; whether a bar was cut at the frame."""
    ax.plot(points.x, points.y, label=label, transform=transform, markevery=points.estimated(), **look)
    clipped = interval_bars(ax, points, look["color"], transform)
    known = points.with_interval()
    bare = [i for i in range(len(points.x)) if i not in known]
    if bare:
        ax.plot([points.x[i] for i in bare], [points.y[i] for i in bare], linestyle="none", marker=look["marker"],
                markersize=look["markersize"], color=look["color"], markerfacecolor="white", transform=transform,
                label="_no interval")
    return clipped


def draw_every_series(fig, ax, series: dict[Key, Points], style: Style, name: Callable[[str, int], str],
                      slots: dict[Key, tuple[int, int]] | None = None) -> bool:
    """Each (label, level) series, nudged sideways in its slot (by default its label's);
    whether a bar was cut at the frame."""
    slots = slots or series_slots(series)
    return any([draw_series(ax, points, name(label, level), style.line(label, level),
                            nudged(fig, ax, *slots[label, level]))
                for (label, level), points in series.items()])


def interval_bars(ax, points: Points, colour: str, transform) -> bool:
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


def axis_limits(values: Iterable[float], log: bool, floor: float | None = None, include: float = math.nan,
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


def all_values(series: dict[Key, Points]) -> list[float]:
    """Every estimate and interval end of the series (nan and inf included: `axis_limits` drops them)."""
    return [v for p in series.values() for v in (*p.y, *p.low, *p.high)]


def all_estimates(series: dict[Key, Points]) -> list[float]:
    return [v for p in series.values() for v in p.y]


def log_y_axis(ax, low: float, high: float, format_value: Callable[[float], str]) -> None:
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


def batch_axis(ax, batches: Sequence[int]) -> None:
    """Log-2 x axis labelled with the batch sizes themselves, with room at both ends."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ticks = sorted(set(batches))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{b:,}" for b in ticks], rotation=30 if len(ticks) > 6 else 0)
    pad = 2 ** max(0.5, 0.1 * math.log2(ticks[-1] / ticks[0]))
    ax.set_xlim(ticks[0] / pad, ticks[-1] * pad)


def reference_line(ax, y: float, text: str, label: str, linestyle: Any = "-", color: str = REFERENCE) -> None:
    """A horizontal reference line, named in the margin right of the axes (never over data)."""
    ax.axhline(y, color=color, linewidth=1.0, linestyle=linestyle, label=label, zorder=1)
    ax.annotate(text, (1.0, y), xycoords=("axes fraction", "data"), xytext=(4, 0), textcoords="offset points",
                ha="left", va="center", fontsize="small", color=color, annotation_clip=False)


def legend_outside(ax, style: Style, labels: Iterable[str], levels: Iterable[int], level_name: Callable[[int], str],
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


def interval_notes(all_points: Iterable[Points], clipped: bool = False) -> list[str]:
    points = list(all_points)
    notes = [INTERVAL + (CLIPPED if clipped else "")] if any(p.bars() for p in points) else []
    return notes + ([NO_INTERVAL] if any(len(p.with_interval()) < len(p.x) for p in points) else [])


def devices_name(n: int) -> str:
    return "devices" if n == 0 else f"{n} device{'s' if n > 1 else ''}"


def save(fig, path: Path) -> Path:
    """Write a figure as PNG (the legend outside the axes included) and free it."""
    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", facecolor="white", bbox_inches="tight",
                                                   pad_inches=0.12))
    finally:
        pyplot().close(fig)
    return path


