"""What `xbench verify` prints: its checks as a table, and the captions that say what the
checks compared, at which size and precision, and within which rounding floors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import JustifyMethod
from rich.table import Table

from xbench.results.checks import (
    FLOOR_FACTOR,
    LOW_PRECISION_FACTOR,
    VERIFY_STEPS,
    verification_model,
    verification_precision,
)
from xbench.results.full_size import sizes_checked


def checks_table(checks: Sequence[Any]) -> Table:
    """One row per verification check (see xbench.results.checks)."""
    table = Table(title="xbench verify", title_justify="left")
    columns: list[tuple[str, JustifyMethod]] = [
        ("check", "left"), ("compared", "left"), ("max abs err", "right"), ("max rel err", "right"),
        ("rel err (norm)", "right"), ("tolerance", "right"), ("result", "left")]
    for header, justify in columns:
        table.add_column(header, justify=justify)
    for c in checks:
        table.add_row(c.check, c.subject, f"{c.max_abs:.2e}", f"{c.max_rel:.2e}", f"{c.norm_rel:.2e}",
                      format_tolerance(c), "[green]pass[/]" if c.passed else "[red]FAIL[/]")
    return table


def format_tolerance(check: Any) -> str:
    """A power of ten as written (1e-04), one widened by rounding floors with two digits."""
    short = f"{check.tolerance:.0e}"
    return short if float(short) == check.tolerance else f"{check.tolerance:.1e}"


def floors_caption(floors: Mapping[tuple[str, str], float], no_floor: Mapping[tuple[str, str], str],
                   borrowed: Mapping[str, str] | None = None) -> str | None:
    """Each backend's rounding floor per model (its fp32 ten steps against its float64 ones),
    which sets a ten-step tolerance where it is larger than the fixed one, and the programs
    that use their as-written program's (`borrowed`); None without any."""
    per_model = {model: ", ".join(f"{name} {floor:.1e}" for (name, m), floor in sorted(floors.items()) if m == model)
                 for model in sorted({model for _, model in floors})}
    measured = "; ".join(f"{model}: {backends}" for model, backends in per_model.items())
    parts = [f"rounding floors ||fp32 - float64|| of ten steps ({measured}); where both programs of an fp32 "
             f"ten-step check have one (and float64 checks compared both), its tolerance is at least "
             f"{FLOOR_FACTOR:g} x their sum"] if floors else []
    parts += [f"{backend} has no floor for {model} ({why})" for (backend, model), why in sorted(no_floor.items())]
    by_base: dict[str, list[str]] = {}
    for name, base in sorted((borrowed or {}).items()):
        by_base.setdefault(base, []).append(name)
    parts += [f"{', '.join(names)} use {base}'s float64 run and floor (the same formula: no float64 run of their own)"
              for base, names in by_base.items()]
    return "; ".join(parts) + "." if parts else None


def probes_caption(borrowed: Mapping[str, str]) -> str | None:
    """The programs whose full size their as-written program's probe checked (`borrowed`:
    implementation -> that program); None without any."""
    by_base: dict[str, list[str]] = {}
    for name, base in sorted(borrowed.items()):
        by_base.setdefault(base, []).append(name)
    parts = [f"{', '.join(names)} use {base}'s full-size probe (the same formula over the same model code and "
             "parameter layout: no probe of their own)" for base, names in by_base.items()]
    return "; ".join(parts) + "." if parts else None


def memory_caption(peaks: Mapping[str, int], share: float | None) -> str | None:
    """The most memory a verification run's framework held on a device (`peaks`: trial id ->
    bytes), and each worker's cap where several shared a GPU; None where no run reported a
    peak (CPUs)."""
    if not peaks:
        return None
    largest = max(peaks, key=lambda trial_id: peaks[trial_id])
    shared = (f"; the workers that shared a GPU were each capped at {share:.1%} of its memory, a run that needed "
              "more ran again alone" if share is not None else "")
    return f"memory: the largest run held {peaks[largest] / 2**30:.1f} GiB on a device at its peak ({largest}){shared}."


def precision_floors_caption(floors: Mapping[tuple[str, str, str], tuple[float, float]]) -> str | None:
    """Each backend's low-precision floors per model (its as-written program in that precision
    against its float64 run), which set the tolerances of the programs verified in that
    precision; None without any."""
    if not floors:
        return None
    measured = "; ".join(f"{model}: {backend} {precision} initial {start:.1e}, ten steps {steps:.1e}"
                         for (backend, model, precision), (start, steps) in sorted(floors.items()))
    return (f"low-precision floors ||low - float64|| of each backend's as-written program on 1 device ({measured}); "
            f"a program that runs only in that precision is checked against its backend's float64 run within "
            f"{LOW_PRECISION_FACTOR:g} x them.")


def verify_caption(spec: Any, reference: str) -> str:
    counts = sorted(set(spec.devices) | {1})
    batches = ", ".join(f"{m.name} {verification_model(m, counts).batch_sizes[0]}" for m in spec.models)
    float64 = [m.name for m in spec.models if verification_precision(m) == "fp64"]
    per_device = [m.name for m in spec.models if m.kind.batch_statistics]
    cnn = "".join([f" ({', '.join(float64)}: float64, smaller, tolerances 1e-8; see xbench/results/checks.py)"
                   if float64 else "",
                   f" ({', '.join(per_device)}: N devices against the reference backend on N)" if per_device else ""])
    return (f"dropout off, strict fp32{cnn}, global batch: {batches}; {VERIFY_STEPS} Adam steps "
            f"(lr {spec.learning_rate:g}) from the core's weights (seed {spec.seed}); reference backend: "
            f"{reference}. rel err (norm) = ||a-b|| / ||b|| decides; max rel err divides by "
            "max(|b|, 1e-3 max|b|). What was checked at which size: "
            + "; ".join(sizes_checked(m, counts, verification_precision(m)) for m in spec.models) + ".")
