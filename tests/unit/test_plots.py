"""The plots show what the tables say, intervals included, in a way a reader can trust: one
colour per framework, one line style per device count, interval bars on every estimate and
clipped to the axis, reference lines inside the axes, drawn from committed GPU runs."""

import math
from dataclasses import replace

import pytest

from tests.conftest import ROOT
from xbench.report import drawing, plots
from xbench.results.records import read_records
from xbench.results.summary import full_rows, rows_from_records

VARIANTS = ROOT / "results" / "2026-11-24-h200x2-baselines-variants"  # 1 and 2 H200s, 3 replicates, intervals
WIDE = ROOT / "results" / "2026-11-22-h200x4-wide-scaling"  # 1, 2 and 4 H200s, 1 replicate: no intervals


def _rows(run, model):
    return [r for r in full_rows(rows_from_records(read_records(run))) if r.model == model]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    drawing.pyplot().close("all")


def _series(ax):
    """The data lines of an Axes by label (not the reference lines, caps or open markers)."""
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def _bars(ax):
    """Each error bar's (x, low, high) in data coordinates, from the errorbar line collections."""
    from matplotlib.collections import LineCollection

    return [(seg[0][0], min(seg[0][1], seg[1][1]), max(seg[0][1], seg[1][1]))
            for c in ax.collections if isinstance(c, LineCollection) for seg in c.get_segments()]


def test_a_framework_keeps_one_colour_and_a_device_count_one_line_style():
    rows = _rows(VARIANTS, "large")
    ax = plots.throughput_figure(rows, "large").axes[0]
    lines = _series(ax)
    framework_of = {r.label: r.framework for r in rows}  # as the workers named it
    assert set(framework_of.values()) == {"jax", "torch"}  # jax, jax-shardmap and torch's variants
    frameworks = sorted(set(framework_of.values()))
    for label, line in lines.items():
        program, devices = label.rsplit(", ", 1)
        assert line.get_color() == drawing.COLOURS[frameworks.index(framework_of[program])], label
        assert line.get_linestyle() == {"1 device": "-", "2 devices": "--"}[devices], label
    jax = [n for n in lines if framework_of[n.rsplit(", ", 1)[0]] == "jax" and n.endswith("2 devices")]
    assert len(jax) > 1 and len({lines[n].get_marker() for n in jax}) == len(jax)


def test_throughput_bars_are_the_rows_intervals_on_a_log_axis_with_nothing_at_or_below_zero():
    rows = _rows(VARIANTS, "large")
    fig = plots.throughput_figure(rows, "large")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylim()[0] > 0
    for row in rows:
        label = f"{row.label}, {row.devices} device{'s' if row.devices > 1 else ''}"
        line = _series(ax)[label]
        assert row.global_batch in list(line.get_xdata())
        assert row.throughput.mean in list(line.get_ydata())
    expected = {(r.global_batch, r.throughput.ci_low, r.throughput.ci_high) for r in rows
                if math.isfinite(r.throughput.ci_low)}
    drawn = _bars(ax)
    assert len(drawn) == len(expected) > 0
    for x, low, high in drawn:
        assert any(x == b and low == pytest.approx(lo) and high == pytest.approx(hi) for b, lo, hi in expected)
    values = [v for line in ax.get_lines() for v in line.get_ydata()] + [v for _, lo, hi in drawn for v in (lo, hi)]
    assert min(values) > 0


def test_an_interval_reaching_below_zero_is_clipped_to_the_log_axis():
    rows = _rows(VARIANTS, "large")
    wide = replace(rows[0], throughput=replace(rows[0].throughput, ci_low=-5.0 * rows[0].throughput.mean))
    ax = plots.throughput_figure([wide, *rows[1:]], "large").axes[0]
    bottom, _ = ax.get_ylim()
    assert bottom > 0 and min(low for _, low, _ in _bars(ax)) == pytest.approx(bottom)


def test_the_speedup_figure_has_interval_bars_and_the_1x_and_ideal_lines_inside_the_axes():
    rows = _rows(VARIANTS, "large")
    ax = plots.speedup_figure(rows, "large").axes[0]
    multi = [r for r in rows if r.devices == 2 and r.scaling is not None]
    lines = _series(ax)
    for row in multi:
        line = lines[f"{row.label}, 2 devices"]
        assert row.scaling.speedup in list(line.get_ydata())
    with_interval = [r for r in multi if math.isfinite(r.scaling.ci_low)]
    drawn = _bars(ax)
    assert len(drawn) == len(with_interval) > 0
    for row in with_interval:
        assert any(low == pytest.approx(row.scaling.ci_low) and high == pytest.approx(row.scaling.ci_high)
                   for _, low, high in drawn)
    bottom, top = ax.get_ylim()
    for reference in ("1.0: no gain", "ideal on 2 devices"):
        y = lines[reference].get_ydata()[0]
        assert bottom < y < top, reference
    assert ax.get_legend() is not None


def test_the_scaling_figure_shows_speedup_and_efficiency_with_ideal_lines_off_the_border():
    rows = _rows(WIDE, "wide-50m")
    fig = plots.scaling_figure(rows, "wide-50m")
    speed, efficiency = fig.axes[:2]
    row = next(r for r in rows if r.label == "jax" and r.devices == 4)
    assert list(_series(speed)["jax, batch 32768"].get_ydata())[-1] == row.scaling.speedup
    assert list(_series(efficiency)["jax, batch 32768, efficiency"].get_ydata())[-1] == pytest.approx(
        row.scaling.efficiency)
    assert list(_series(speed)["ideal (speedup = devices)"].get_ydata()) == [1, 2, 4]
    assert speed.get_ylim()[1] > 4 and efficiency.get_ylim()[1] > 1
    # one replicate: no interval to draw, so no bar, and the legend says why the markers are open
    assert _bars(speed) == [] and drawing.NO_INTERVAL in [t.get_text() for t in efficiency.get_legend().get_texts()]


def test_figures_save_as_png_with_the_legend_outside(tmp_path):
    rows = _rows(VARIANTS, "large")
    path = drawing.save(plots.throughput_figure(rows, "large"), tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(path) as image:
        width = image.width
    assert width > drawing.FIGSIZE[0] * drawing.DPI  # the legend right of the axes widens the image


def _row(backend, framework="", program="data-parallel"):
    from xbench.results.rows import Row

    return Row(backend=backend, model="m", devices=1, global_batch=8, per_device_batch=8, scaling_mode="strong",
               status="ok", reason=None, params=None, replicates=(), throughput=None, step_ms=None,
               first_call_s=None, scaling=None, framework=framework, program=program)


def test_a_framework_is_what_its_workers_named_else_the_backend():
    rows = [_row("jax", "jax"), _row("jax", "jax", program="plain"), _row("jax-shardmap", "jax"),
            _row("tf", "tensorflow"), _row("numpy")]  # numpy: no worker reported (a test's record)
    assert [r.framework_key for r in rows] == ["jax", "jax", "jax", "tensorflow", "numpy"]
    style = drawing.style_of(drawing.frameworks_of(rows), [1, 2], drawing.DEVICE_DASHES)
    assert style.colours["jax"] == style.colours["jax plain"] == style.colours["jax-shardmap"]
    assert len({style.colours[label] for label in ("jax", "tf", "numpy")}) == 3
    assert len({style.markers[label] for label in ("jax", "jax plain", "jax-shardmap")}) == 3
    assert style.dashes == {1: "-", 2: "--"}
