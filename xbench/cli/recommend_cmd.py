"""`xbench recommend`: predicted throughput per backend and device count from fitted step
models, a verdict with its interval, and held-out validation of the fits (--validate)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from xbench import stats
from xbench.cli.consoles import data_console, status_console
from xbench.cli.options import Precision, is_integer, names, value
from xbench.errors import XbenchError, brief
from xbench.models.model_spec import preset_model
from xbench.report.terminal import bound_text
from xbench.report.words import USABLE_SPAN, interval_text, rate_text, ratio_text, too_uncertain
from xbench.results.fitting import StoredFits, error_summary, find_fits, fit_all, load_runs, validate
from xbench.results.recommend import (
    MEASURE,
    MULTI,
    SAME_DEVICES,
    Choice,
    Question,
    break_even,
    break_even_batches,
    candidates,
    choose,
    device_counts,
    model_flops,
    out_of_range,
    predictions,
    sweep_command,
    verdict,
)
from xbench.results.step_model import FitError, bottleneck
from xbench.run.environment import cpu_name, nvidia_gpus

DEFAULT_FITS = Path("results")


def recommend(
    model: Annotated[Optional[list[str]], typer.Option(
        metavar="PRESET", help="A preset (`xbench models`), e.g. gpt2-small (default: none; this or "
                               "--params).")] = None,
    params: Annotated[Optional[list[float]], typer.Option(
        metavar="N", help="Or the model's parameter count, e.g. 5e5, of the --family (default: none; this or "
                          "--model).")] = None,
    flops: Annotated[Optional[float], typer.Option(
        metavar="FLOPS", help="With --params: training FLOPs per sample (default: from the family's measured "
                              "sizes).")] = None,
    family: Annotated[str, typer.Option(
        metavar="NAME", show_default=True, help="With --params: the model family.")] = "mlp",
    global_batch: Annotated[Optional[list[str]], typer.Option(
        "--global-batch", metavar="INT...",
        help="Global batch sizes (all devices together), e.g. 64 or 64,256 (required; no default).")] = None,
    batch: Annotated[Optional[list[str]], typer.Option("--batch", hidden=True)] = None,  # --global-batch's old name
    devices: Annotated[Optional[list[int]], typer.Option(
        metavar="N", help="Devices available (default: the most the fit measured).")] = None,
    precision: Annotated[Optional[Precision], typer.Option(
        help="Only fits at this precision (default: any).")] = None,
    backends: Annotated[Optional[list[str]], typer.Option(
        metavar="NAME...", help="Only these backends (default: every backend the fit has).")] = None,
    fits: Annotated[Optional[list[Path]], typer.Option(
        metavar="PATH...", help="fit.json files or directories holding them; the fit of this machine's devices "
                                "answers, else the closest (default: results/).")] = None,
    runs: Annotated[Optional[list[Path]], typer.Option(
        metavar="DIR...", help="Fit these run directories now instead of reading stored fits (default: none).")] = None,
    validate_runs: Annotated[Optional[list[Path]], typer.Option(
        "--validate", metavar="DIR...",
        help="Fit on part of these runs, predict the held-out configurations, print each error (default: "
             "none).")] = None,
) -> int:
    """Which backend and how many devices for a model and global batch, from a fitted step model.

    The fit measured on this machine's kind of device answers; else the closest stored one,
    and the first line says so."""
    if validate_runs:
        return _validate(validate_runs)
    question = _question(_one(model, "--model"), _one(params, "--params"), flops, family,
                         (global_batch or []) + (batch or []), _one(devices, "--devices"))
    found = candidates(_fit_sets(runs, fits), question.family, value(precision), names(backends))
    if not found:
        raise XbenchError(_no_fit_message(question, runs or fits or [DEFAULT_FITS]))
    here = this_machine()
    choice = choose(found, here, question)
    problem = out_of_range(choice, question)
    if problem:
        raise XbenchError(problem)
    _print_choice(choice, here)
    _respond(list(choice.answer.fits), question)
    return 0


def _respond(chosen, question: Question) -> None:
    """The answer of one fit.json's fits; what of the question they could not answer, and why."""
    answered, problems = _answer(chosen, question)
    if not answered:
        raise XbenchError(problems[0])
    for problem in problems:
        status_console().print(f"[yellow]not answered[/]: {problem}")


def _print_choice(choice: Choice, here: str) -> None:
    """Which stored fit answers, and why that one: said before the answer, so no reader takes it
    for this machine's when it is not, or wonders about the fits it left out."""
    stored = choice.answer.stored
    if choice.closeness == SAME_DEVICES:
        _say(f"answering from {stored.path} ({stored.machine}, fitted {stored.created})")
    else:
        _say(f"no fit was measured on this machine ({here}); answering from the fit of {stored.machine} in "
             f"{stored.path} (fitted {stored.created}) — run `{sweep_command(choice.answer.fits)}` here for a fit "
             "of your own")
    if choice.others:
        others = ", ".join(f"{c.stored.path} ({c.stored.machine}, fitted {c.stored.created})" for c in choice.others)
        _say(f"also covering this question, not used: {others}; `--fits PATH` answers from one of them instead")


def _say(line: str) -> None:
    """A line of the answer as written: paths and machine names are neither markup nor broken."""
    data_console().print(line, markup=False, highlight=False, soft_wrap=True)


def _one(values: list | None, flag: str):
    """A single-valued option given once (the command line takes `--devices 1 2` as two)."""
    if values and len(values) > 1:
        raise XbenchError(f"{flag} takes one value, got {len(values)}; run recommend once per model or device count")
    return values[0] if values else None


def _question(model, params, flops, family, batch, devices) -> Question:
    if (model is None) == (params is None):
        raise XbenchError("give either --model PRESET or --params N (e.g. --params 5e5 --global-batch 64)")
    batches = _batches(batch)
    if devices is not None and devices < 1:
        raise XbenchError(f"--devices must be at least 1, got {devices}")
    if model is not None:
        try:
            spec = preset_model(model)
        except KeyError:
            raise XbenchError(f"unknown model {brief(model)}; `xbench models` lists the presets") from None
        return Question(spec.params, spec.training_flops_per_sample, spec.family, batches, devices or 0, spec.unit,
                        spec.units_per_sample)
    if not params > 0 or (flops is not None and not flops > 0):
        raise XbenchError("--params and --flops must be positive numbers, e.g. --params 5e6")
    return Question(params, flops, family, batches, devices or 0)


def _batches(batch: list[str]) -> tuple[int, ...]:
    words = names(batch)
    if not words:
        raise XbenchError("--global-batch is required: the batch of all devices together, e.g. --global-batch 64")
    try:
        values = tuple(int(w) for w in words)
    except ValueError:
        bad = next(w for w in words if not is_integer(w))
        raise XbenchError(f"--global-batch takes whole numbers such as 64, got {brief(bad)}") from None
    if min(values) < 1:
        raise XbenchError(f"--global-batch must be positive, got {min(values)}")
    return values


def _fit_sets(runs: list[Path] | None, places: list[Path] | None) -> list[StoredFits]:
    if runs:
        measured = load_runs(runs)
        with status_console().status("fitting…"):
            fitted, skipped = fit_all(measured)
        for reason in skipped:
            status_console().print(f"[yellow]not fitted[/]: {reason}")
        return [StoredFits(Path(", ".join(map(str, runs))), measured.machine, "now", tuple(fitted))]
    missing = [str(p) for p in places or () if not Path(p).exists()]
    if missing:
        raise XbenchError(f"--fits {missing[0]}: no such file or directory")
    found, problems = find_fits(places or [DEFAULT_FITS])
    if problems and not found:  # say which file could not be read, not that there is none
        raise XbenchError(problems[0])
    for problem in problems:
        status_console().print(f"[yellow]left out[/]: {problem}")
    return found


def _no_fit_message(question: Question, places: list[Path]) -> str:
    where = ", ".join(map(str, places))
    # `xbench sweep` measures every installed backend unless --backends narrows it.
    sweep = "xbench sweep" if question.family == "mlp" else f"xbench sweep --model <{question.family} presets>"
    return f"no stored fit for the {question.family} family (looked in {where}); measure one with `{sweep}`"


def this_machine() -> str:
    """What a fit of this machine says it was measured on (the kind, not the count)."""
    gpus = nvidia_gpus()
    return f"{len(gpus)} x {gpus[0]['name']}" if gpus else f"simulated CPU devices ({cpu_name()})"


def _answer(chosen, question: Question) -> tuple[int, list[str]]:
    """Print one fit set's predictions; how many batches it answered, and why not the others."""
    console = data_console()
    answered, problems = 0, []
    for batch in question.batches:
        table = Table(title=f"global batch {batch}", title_justify="left")
        for header in ("program", "precision", "dev", "per device", f"{question.unit}/s", "speedup (95%)",
                       "bound by"):  # as `xbench compare` names its columns
            table.add_column(header, justify="right" if header not in ("program", "bound by") else "left")
        verdicts = []
        for fit in chosen:
            q = question if question.devices else _with_devices(question, max(fit.layout.devices))
            try:
                rows = predictions(fit, q, batch)
                verdicts.append(verdict(fit, q, batch, rows))
            except FitError as problem:
                problems.append(str(problem))
                continue
            for p in rows:
                speed = "" if p.speedup is None else speedup_text(p.speedup)
                mark = " *" if p.extrapolated else ""
                table.add_row(fit.key.label, fit.key.precision, f"{p.devices}{mark}", f"{batch // p.devices:,}",
                              _rate(p, question), speed, bottleneck(p.terms))
        if not verdicts:
            continue
        answered += 1
        console.print(table)
        _print_verdicts(verdicts, question)
    if answered:
        _print_extrapolation(chosen, question)
        _print_model(chosen[0], question)
        _print_break_even(chosen)
    return answered, problems


def _rate(p, question: Question) -> str:
    """Throughput and its 95 % interval in the model's unit (tokens/s for a transformer preset), as
    `xbench compare` writes them: "3.567M ±0.4%" where the interval is nearly symmetric, else its
    bounds "767,391 (663k–1.08M)" (kept where compare would say "too few reps": a prediction's
    interval is the fit's, and the verdicts rest on it)."""
    n = question.units_per_sample
    value, low, high = n * p.throughput, n * p.throughput_low, n * p.throughput_high
    if high > USABLE_SPAN * low:
        return f"{rate_text(value)} ({bound_text(low)}–{bound_text(high)})"
    return f"{rate_text(value)} {interval_text(value, low, high, 1.0, bound_text)}".rstrip()


def speedup_text(speedup: tuple[float, float, float]) -> str:
    """e.g. "1.84× (1.27–2.68)": a predicted speedup (central, low, high) as `xbench compare`
    writes one (`ratio_text`), except that its bounds stay where they lie more than USABLE_SPAN
    apart (compare says "too uncertain" there): a verdict here rests on where they lie against 1."""
    central, low, high = speedup
    s = stats.Scaling(0, central, math.nan, math.nan, low > 1, low, high)
    if not too_uncertain(s):
        return ratio_text(s)
    return f"{ratio_text(stats.Scaling(0, central, math.nan, math.nan, False))} ({low:.2f}–{high:.2f})"


def _with_devices(question: Question, devices: int) -> Question:
    return replace(question, devices=devices)


def _print_verdicts(verdicts, question: Question) -> None:
    console = data_console()
    for v in verdicts:
        label, why = f"{v.fit.key.label} ({v.fit.key.precision})", v.reason(speedup_text)
        if v.choice == MULTI:
            console.print(f"{label}: use {v.best.devices} devices — {why}; {bottleneck(v.best.terms)}")
        elif v.choice == MEASURE:
            console.print(f"{label}: measure — {why}")
        else:
            console.print(f"{label}: use one device — {why}; {bottleneck(v.best.terms)}")
    if len(verdicts) > 1:
        top = max(verdicts, key=lambda v: v.chosen.throughput)
        best = top.chosen
        overlapping = [v.fit.key.label for v in verdicts
                       if v is not top and v.chosen.throughput_high >= best.throughput_low]
        tie = f"; intervals overlap with {', '.join(overlapping)}" if overlapping else ""
        console.print(f"fastest as recommended: {top.fit.key.label} on {best.devices} device(s), "
                      f"{rate_text(question.units_per_sample * best.throughput)} {question.unit}/s{tie}")


def _print_extrapolation(chosen, question: Question) -> None:
    """The footnote of the rows marked *: device counts the fit did not measure."""
    for fit in chosen:
        asked = device_counts(question.devices or max(fit.layout.devices))
        if any(p not in fit.layout.devices for p in asked):
            status_console().print(f"* device counts not measured (the fit measured {fit.layout.devices}): "
                                   "extrapolated from the largest, assuming devices as fast as the measured ones, "
                                   "the host's cost growing with devices as measured, and a ring all-reduce over "
                                   "the same links")
            return


def _print_model(fit, question: Question) -> None:
    flops = model_flops(fit, question)
    source = "given" if question.flops else "from the family's measured sizes"
    status_console().print(f"model: {question.params:,.0f} parameters ({question.family}), {flops:,.3g} training "
                           f"FLOPs per sample ({source}); intervals: bootstrap over replicates and the fit's "
                           "residual scatter")


def _print_break_even(chosen) -> None:
    """The seed's question, answered from the fit: from which model size 2 devices beat one,
    per global batch, with the interval (where the speedup's upper and lower ends pass 1)."""
    console = data_console()
    for fit in chosen:
        if not fit.layout.multi:
            continue
        devices = min(fit.layout.multi)
        found, never = [], []
        for batch in break_even_batches(fit, devices):
            b = break_even(fit, batch, devices)
            if b.params is None:
                never.append(batch)
            elif b.surely == fit.params_range[0]:
                found.append(f"batch {batch}: already at the smallest fitted size ({b.params:,.3g} params)")
            else:
                high = f"{b.surely:,.3g}" if b.surely else f"beyond the fitted {fit.params_range[1]:,.3g}"
                found.append(f"batch {batch}: from {b.params:,.3g} params ({b.earliest:,.3g}–{high})")
        if never:
            found.append(f"batch {'/'.join(map(str, never))}: not within the fitted sizes "
                         f"(up to {fit.params_range[1]:,.3g} params)")
        if found:
            console.print(f"{devices} devices beat 1 ({fit.key.label}, {fit.key.precision}): " + "; ".join(found))


def _validate(run_dirs: list[Path]) -> int:
    measured = load_runs(run_dirs)
    with status_console().status("fitting each held-out split…"):
        held, problems = validate(measured)
    if not held:
        raise FitError("nothing could be held out: a model needs 3+ per-device batches, or a family 3+ model sizes "
                       "(xbench sweep measures them); " + (problems[0] if problems else ""))
    table = Table(title=f"held-out predictions ({measured.machine})", title_justify="left")
    for header in ("held out", "program", "precision", "model", "devices", "global batch", "predicted", "measured",
                   "error"):
        table.add_column(header, justify="left" if header in ("held out", "program", "model") else "right")
    for h in sorted(held, key=lambda h: (h.scheme, h.key.label, h.model, h.devices, h.global_batch)):
        table.add_row(h.scheme, h.key.label, h.key.precision, h.model, str(h.devices), f"{h.global_batch:,}",
                      f"{h.predicted:,.0f}", f"{h.measured:,.0f}", f"{100 * h.error:+.1f} %")
    console = data_console()
    console.print(table)
    for scheme in sorted({h.scheme for h in held}):
        mine = [h for h in held if h.scheme == scheme]
        median, p90 = error_summary(mine)
        console.print(f"{scheme}: {len(mine)} held-out configurations, median |error| {100 * median:.1f} %, "
                      f"90th percentile {100 * p90:.1f} %")
    median, p90 = error_summary(held)
    console.print(f"all: {len(held)} held-out configurations, median |error| {100 * median:.1f} %, "
                  f"90th percentile {100 * p90:.1f} %")
    for problem in problems:
        status_console().print(f"[yellow]not held out[/]: {problem}")
    return 0
