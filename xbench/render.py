"""Tables for people: rich renderables built from result rows; the caller prints them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from xbench import stats
from xbench.summary import Row


def model_tables(rows: Sequence[Row]) -> list[Table]:
    """One table per model, rows in run order."""
    models = list(dict.fromkeys(row.model for row in rows))
    return [_model_table(model, [r for r in rows if r.model == model]) for model in models]


def _model_table(model: str, rows: list[Row]) -> Table:
    params = next((r.params for r in rows if r.params is not None), None)
    title = f"model {model}" + (f" — {params:,} parameters" if params else "")
    table = Table(title=title, title_justify="left", caption=_caption(rows), caption_justify="left")
    for header, justify in [
        ("backend", "left"), ("devices", "right"), ("global batch", "right"),
        ("samples/s (mean ± 95% CI)", "right"), ("step ms", "right"), ("first call s", "right"),
        ("speedup", "right"), ("efficiency", "right"), ("vs 1 device", "left"), ("outliers", "right"),
    ]:
        table.add_column(header, justify=justify)
    for row in rows:
        table.add_row(*_cells(row))
    return table


def _cells(row: Row) -> list[str]:
    head = [row.backend, str(row.devices), str(row.global_batch)]
    if row.throughput is None:
        return [*head, f"[red]{row.status}[/]: {row.reason or ''}", "", "", "", "", "", ""]
    t = row.throughput
    return [
        *head,
        f"{t.mean:,.0f} ± {t.ci_half_width:,.0f}",
        f"{row.step_ms:.3f}",
        f"{row.first_call_s:.2f}",
        *_scaling_cells(row.scaling, row.devices),
        f"{t.removed}/{t.n + t.removed}",
    ]


def _scaling_cells(scaling: stats.Scaling | None, devices: int) -> list[str]:
    if devices == 1:
        return ["1.00×", "", "baseline"]
    if scaling is None:
        return ["", "", "no 1-device result"]
    verdict = ("faster" if scaling.speedup > 1 else "slower") if scaling.significant else "no significant difference"
    return [f"{scaling.speedup:.2f}×", f"{scaling.efficiency:.0%}", f"{verdict} (p={_p(scaling.p_value)})"]


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _caption(rows: list[Row]) -> str:
    modes = sorted({r.scaling_mode for r in rows})
    return (f"{' and '.join(modes)} scaling; speedup = mean throughput over the same backend's "
            f"1-device mean; p from Welch's t-test, significant below {stats.SIGNIFICANCE}; "
            f"outliers: |modified z| > {stats.OUTLIER_THRESHOLD}")


def devices_line(backend: str, info: Mapping[str, Any]) -> str:
    """e.g. 'jax 0.10.2 on 2 simulated CPU devices (no GPU used)'."""
    count = len(info["device_names"])
    version = f"{info['framework']} {info['framework_version']}"
    if info["simulated"]:
        return f"{backend}: {version} on {count} simulated CPU device(s) — one CPU split, no GPU used"
    names = ", ".join(dict.fromkeys(n.split(" ", 1)[-1] for n in info["device_names"]))
    return f"{backend}: {version} on {count} {info['platform'].upper()}(s): {names}"
