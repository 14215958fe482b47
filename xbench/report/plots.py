"""PNG plots of a run, drawn with matplotlib (imported only when a plot is drawn).

Figures have an opaque white background so they read the same in light and dark viewers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from xbench.results.allreduce import AllReduceResult
from xbench.results.records import write_atomic
from xbench.results.summary import Row

DPI = 110


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _series(rows: Sequence[Row]) -> dict[tuple[str, int], list[Row]]:
    """Measured rows grouped by (backend, devices), each sorted by global batch."""
    groups: dict[tuple[str, int], list[Row]] = {}
    for row in rows:
        if row.throughput is not None:
            groups.setdefault((row.label, row.devices), []).append(row)
    return {key: sorted(group, key=lambda r: r.global_batch) for key, group in sorted(groups.items())}


def _figure(title: str, xlabel: str, ylabel: str):
    fig, ax = _pyplot().subplots(figsize=(7.5, 4.6), dpi=DPI, facecolor="white")
    ax.set_facecolor("white")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def _batch_axis(ax, batches: Sequence[int]) -> None:
    """Log-2 x axis labelled with the batch sizes themselves."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ticks = sorted(set(batches))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{b:,}" for b in ticks])


def save(fig, path: Path) -> Path:
    """Write a figure as PNG and free it."""
    fig.axes[0].legend(loc="best", fontsize="small")
    fig.tight_layout()
    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", facecolor="white"))
    finally:
        _pyplot().close(fig)
    return path


def throughput_figure(rows: Sequence[Row], model: str):
    """Samples/s against global batch, log-log, one line per backend and device count, with
    the 95 % interval of the mean as a band; None when nothing was measured."""
    series = _series(rows)
    if not series:
        return None
    unit, k = rows[0].unit, rows[0].units_per_sample
    fig, ax = _figure(f"Throughput, model {model}", "global batch (samples per step)",
                      f"throughput ({unit}/s, mean ± 95% CI)")
    for (backend, devices), group in series.items():
        x = [r.global_batch for r in group]
        mean = [r.measured.mean * k for r in group]
        line, = ax.plot(x, mean, marker="o", label=f"{backend}, {devices} device{'s' if devices > 1 else ''}",
                        linestyle="-" if devices == 1 else "--")
        ax.fill_between(x, [r.measured.ci_low * k for r in group], [r.measured.ci_high * k for r in group],
                        color=line.get_color(), alpha=0.2, linewidth=0)
    _batch_axis(ax, [r.global_batch for group in series.values() for r in group])
    ax.set_yscale("log")
    return fig


def speedup_figure(rows: Sequence[Row], model: str):
    """Speedup over the same backend on 1 device against global batch, with the 1.0 line and
    the ideal line; None without a multi-device result."""
    series = {key: [r for r in group if r.scaling is not None]
              for key, group in _series(rows).items() if key[1] > 1}
    series = {key: group for key, group in series.items() if group}
    if not series:
        return None
    fig, ax = _figure(f"Speedup over 1 device, model {model}", "global batch (samples per step)",
                           "speedup (× the 1-device throughput)")
    ax.axhline(1.0, color="black", linewidth=1, label="1.0: no gain")
    for devices in sorted({key[1] for key in series}):
        ax.axhline(devices, color="grey", linewidth=0.8, linestyle=":", label=f"ideal on {devices} devices")
    for (backend, devices), group in series.items():
        ax.plot([r.global_batch for r in group], [r.scaling.speedup for r in group if r.scaling], marker="o",
                label=f"{backend}, {devices} devices")
    _batch_axis(ax, [r.global_batch for group in series.values() for r in group])
    ax.set_ylim(bottom=0)
    return fig


def scaling_figure(rows: Sequence[Row], model: str):
    """Speedup against device count, one line per backend and global batch, with the ideal
    line (speedup = devices); None unless at least two multi-device counts were measured."""
    series: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for row in rows:
        if row.scaling is not None and row.devices > 1:
            series.setdefault((row.label, row.global_batch), []).append((row.devices, row.scaling.speedup))
    counts = sorted({devices for points in series.values() for devices, _ in points})
    if len(counts) < 2:
        return None
    fig, ax = _figure(f"Scaling with device count, model {model}", "devices", "speedup (× the 1-device throughput)")
    ax.plot([1, *counts], [1, *counts], color="grey", linewidth=1, linestyle=":", label="ideal (speedup = devices)")
    ax.axhline(1.0, color="black", linewidth=1, label="1.0: no gain")
    for (backend, batch), points in sorted(series.items()):
        points = [(1, 1.0), *sorted(points)]
        ax.plot([d for d, _ in points], [s for _, s in points], marker="o", label=f"{backend}, batch {batch:,}")
    ax.set_xticks([1, *counts])
    ax.set_ylim(bottom=0)
    return fig


def breakdown_figure(rows: Sequence[Row], model: str):
    """Stacked bars per multi-device trial: compute-only step time, then the exposed
    communication on top (drawn from zero when the difference is within noise)."""
    measured = [(r, r.breakdown) for r in rows if r.breakdown is not None]
    if not measured:
        return None
    fig, ax = _figure(f"Where a step's time goes, model {model}", "backend, devices, global batch",
                      "time per step (ms)")
    labels = [f"{r.label}\n{r.devices} dev, b{r.global_batch}" for r, _ in measured]
    compute = [b.compute_ms for _, b in measured]
    comm = [max(b.comm_ms, 0.0) for _, b in measured]
    ax.bar(labels, compute, label="compute (step without the all-reduce)", color="#4c72b0")
    ax.bar(labels, comm, bottom=compute, label="exposed communication", color="#dd8452")
    ax.set_ylim(bottom=0)
    return fig


def busbw_figure(results: Sequence[AllReduceResult]):
    """All-reduce bus bandwidth against message size, one line per backend and device count."""
    series: dict[tuple[str, int], list[AllReduceResult]] = {}
    for r in results:
        if r.devices > 1:
            series.setdefault((r.label, r.devices), []).append(r)
    if not series:
        return None
    fig, ax = _figure("All-reduce bus bandwidth", "message size per device (bytes)", "busbw (GB/s, median time)")
    for (backend, devices), group in sorted(series.items()):
        group = sorted(group, key=lambda r: r.nbytes)
        ax.plot([r.nbytes for r in group], [r.busbw / 1e9 for r in group], marker="o",
                label=f"{backend}, {devices} devices")
    _size_axis(ax, [r.nbytes for group in series.values() for r in group])
    ax.set_yscale("log")
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
