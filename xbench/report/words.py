"""The one place that turns a result row into the words and numbers people read.

The terminal table, the Markdown/HTML report and the CSV export all take their cells, verdicts
and labels from here, so they can never say different things about the same configuration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from xbench import stats
from xbench.contract import PLAIN
from xbench.results.conditions import HOST_BOUND_GPU_UTIL_PCT, BusyHost, gpu_util_pct
from xbench.results.summary import (
    BENEFICIAL_SPEEDUP,
    SINGLE_PREFERRED_BELOW,
    Fastest,
    Row,
    above_linear,
    can_narrow,
    geomean_rate,
    mfu,
    run_floor,
    verdict,
    wide,
)

INTERVAL_HEADER = "95% interval"
RESULT_HEADERS = ("program", "dev", "batch", "samples/s", INTERVAL_HEADER, "step ms", "MFU", "1st call s", "speedup",
                  "eff.", "vs plain", "verdict", "reps", "notes")
NUMERIC_COLUMNS = frozenset(range(1, 11)) | {12}


def duration(seconds: float) -> str:
    """Measured seconds as people say them: "41 s", "3 min", "1 h 05 min"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def result_cells(row: Row, brief: bool = False) -> tuple[str, ...]:
    """A measured row's cells, in RESULT_HEADERS order; `brief`: the notes as short tags, for
    a terminal's narrow last column (the report says them in full)."""
    t = row.throughput
    assert t is not None, "rows without a measurement go to the problems list"
    return (row.label, str(row.devices), str(row.global_batch), *rate_cells(row),
            f"{row.step_ms:.3f}", mfu_text(row), f"{row.first_call_s:.2f}", speedup_text(row),
            f"{row.scaling.efficiency:.0%}" if row.scaling and row.devices > 1 else "", vs_plain_text(row),
            verdict(row), replicates_text(row),
            ", ".join(brief_notes(row)) if brief else "; ".join(notes(row)))


def rate_cells(row: Row) -> tuple[str, str]:
    """The throughput the tables print (the geometric mean of the replicate means: the centre
    of its interval, and what every ratio divides) and its 95 % interval (`interval_text`), in
    the model's unit (tokens/s for a transformer: samples/s times its context)."""
    t, k = row.measured, row.units_per_sample
    shown = interval_text(geomean_rate(row) * k, t.ci_low * k, t.ci_high * k, floor_span(row), rate_text,
                          brief=False)
    return rate_text(geomean_rate(row) * k), shown or "n/a"


def rate_text(rate: float, digits: int = 4) -> str:
    """e.g. "30,806" or "1.188M" (126.6M: not 126,602,464)."""
    return f"{rate / 1e6:,.{digits}g}M" if rate >= 1e6 else f"{rate:,.0f}"


# An interval is shown as a ± only where its longer side (from the value) is at most this many
# times its shorter one; a more lopsided one shows its bounds, so that no ± overstates one side.
NEARLY_SYMMETRIC = 1.15
# An interval whose upper end is more than this many times its lower one leaves a reader nothing
# to use: it is said in words ("too few replicates to say") instead of printed.
USABLE_SPAN = 2.0


def interval_text(value: float, low: float, high: float, floor: float, fmt, brief: bool = True) -> str:
    """A value's 95 % interval as a reader can use it: "±0.6%" where it is nearly symmetric
    around `value`, else its bounds "(1.91M–3.2M)"; where it spans more than USABLE_SPAN, words:
    too few replicates to say, or too noisy to say where `floor` (the span the run-to-run
    variation alone gives it) is that wide already, so that more replicates would not narrow
    it enough. "" without an interval; `brief`: the words short enough for a table cell."""
    if not (low > 0 and high >= low and value > 0) or math.isnan(low):
        return ""
    if high / low > USABLE_SPAN:
        few = floor <= USABLE_SPAN
        if brief:
            return "(too few reps)" if few else "(too noisy)"
        return "too few replicates to say" if few else "too noisy to say"
    up, down = high / value - 1, 1 - low / value
    if max(up, down) <= NEARLY_SYMMETRIC * min(up, down) or max(up, down) < 0.0005:
        half = max(up, down)
        return f"±{half:.0%}" if half >= 0.01 else f"±{half:.1%}" if half >= 0.0005 else "±<0.1%"
    lows, highs = fmt(low), fmt(high)
    return f"({lows}–{highs})" if brief else f"{lows}–{highs}"


def floor_span(row: Row) -> float:
    """The factor the run-to-run variation alone spans a row's interval by (1: none)."""
    return math.exp(2 * run_floor(row))


def rate_header(rows: Sequence[Row]) -> str:
    """e.g. "tokens/s": the unit of a model's rows (one model, one unit)."""
    return f"{rows[0].unit if rows else 'samples'}/s"


def result_headers(rows: Sequence[Row]) -> tuple[str, ...]:
    return tuple(rate_header(rows) if h == "samples/s" else h for h in RESULT_HEADERS)


def fastest_headers(rows: Sequence[Row], kinds: bool = False) -> tuple[str, ...]:
    """The fastest table's headers; `kinds`: with the PROGRAMS column (`both_kinds`)."""
    headers = tuple(rate_header(rows) if h == "samples/s" else h for h in FASTEST_HEADERS)
    return (*headers[:2], PROGRAMS, *headers[2:]) if kinds else headers


def model_facts(rows: Sequence[Row], brief: bool = False) -> str:
    """What a model table's title says of the work: e.g. "54,403 parameters, 0.298 MFLOP per
    training sample; MFU against 494.7 TFLOP/s per device (H200 SXM, tf32, tensor cores)";
    `brief`: without the peak (the compact table has no MFU column)."""
    params = next((r.params for r in rows if r.params), None)
    flops = next((r.flops_per_sample for r in rows if r.flops_per_sample), None)
    facts = [f"{params:,} parameters"] if params else []
    per = rows[0].units_per_sample if rows else 1
    if flops and per > 1:
        facts.append(f"{flops_text(flops / per)} per training {rows[0].unit.rstrip('s')}, "
                     f"{per:,} {rows[0].unit} per sample")
    elif flops:
        facts.append(f"{flops_text(flops)} per training sample")
    peaks = sorted({(r.peak.device, r.peak.flops, r.peak.unit) for r in rows if r.peak is not None})
    precisions = sorted({r.precision for r in rows if r.peak is not None})
    text = ", ".join(facts)
    if peaks and not brief:
        text += "; MFU against " + ", ".join(f"{flops / 1e12:g} TFLOP/s per device ({device}, "
                                             f"{'/'.join(precisions)}, {unit})" for device, flops, unit in peaks)
    return text


def flops_text(flops: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.0f} FLOP"


def mfu_text(row: Row) -> str:
    """e.g. "12.3%": model FLOPs utilisation at the mean throughput; "unknown" where xbench has
    no peak for the device (every CPU)."""
    found = mfu(row)
    if found is None:
        return "unknown"
    if found[0] < 0.0001:
        return "<0.01%"
    return f"{found[0]:.1%}" if found[0] >= 0.001 else f"{found[0]:.2%}"


def speedup_text(row: Row) -> str:
    """e.g. "0.87× (0.80–0.95)": the speedup over the same program on 1 device and its 95 %
    interval; "vs plain" where it is taken over the plain program instead (another program)."""
    s = row.scaling
    if s is None:
        return "1.00×" if row.devices == 1 and row.program != PLAIN else ""
    against = " vs plain" if row.baseline == PLAIN and row.program != PLAIN else ""
    return ratio_text(s) + against


def vs_plain_text(row: Row, interval: bool = True) -> str:
    """e.g. "2.53× (2.41–2.66)": a data-parallel row's throughput over its backend's plain
    single-device program's; "1.00×" on the plain row itself, "" where no plain program ran;
    without `interval`, the ratio alone (a narrow table's)."""
    if row.program == PLAIN:
        return "1.00×"
    if row.vs_plain is None:
        return ""
    return ratio_text(row.vs_plain) if interval else f"{row.vs_plain.speedup:.2f}×"


def ratio_text(s: stats.Scaling, brief: bool = True) -> str:
    """e.g. "0.87× (0.80–0.95)", the ratio alone where a side has no spread, and words where
    the interval spans more than USABLE_SPAN and holds 1: "1.73× (too uncertain)", in a sentence
    (not `brief`) "1.73×, too uncertain to say". A wide interval wholly on one side of 1 keeps its
    bounds: it answers which way ("0.31× (0.20–0.48)" is slower, however wide), and a verdict
    beside it rests on them. (Whether more replicates would help a ratio depends on what it must
    decide: the bottom line says that.)"""
    ratio = f"{s.speedup:.2f}×"
    if math.isnan(s.ci_low):
        return ratio
    if too_uncertain(s):
        return f"{ratio} (too uncertain)" if brief else f"{ratio}, too uncertain to say"
    return f"{ratio} ({s.ci_low:.2f}–{s.ci_high:.2f})"


def too_uncertain(s: stats.Scaling) -> bool:
    """The ratio's interval spans more than USABLE_SPAN and holds 1: it says neither how much
    nor which way."""
    return s.ci_high / s.ci_low > USABLE_SPAN and s.ci_low <= 1 <= s.ci_high


TIED = "not significantly slower"
FASTEST_HEADERS = ("dev", "batch", "fastest", "samples/s", INTERVAL_HEADER, "fastest as written", "samples/s",
                   INTERVAL_HEADER, "tuned gain", TIED)


# Which programs a fastest row ranks (the report's and --wide's column; the compact terminal table
# splits by title): a configuration of 1 device has a row for the plain programs and one for the
# data-parallel ones, which without it read as one contradiction.
PROGRAMS = "programs"


def both_kinds(found: Sequence[Fastest]) -> bool:
    """Whether the fastest rows rank plain programs and data-parallel ones (then they say which)."""
    return len({f.kind for f in found}) > 1


def fastest_cells(f: Fastest, kinds: bool = False) -> tuple[str, ...]:
    """A configuration's fastest backend/variant/program, and the fastest as written beside it;
    `kinds`: with the programs ranked after the batch (`fastest_headers`)."""
    best, written = f.best, f.as_written
    if f.gain is None:
        gain = "—" if written is best else ""
    else:
        g = f.gain
        gain = ratio_text(stats.Scaling(0, g.ratio, 0.0, g.p_value, g.ci_low > 1, g.ci_low, g.ci_high))
    written_cells = (written.label, *rate_cells(written)) \
        if written is not None and written.throughput is not None else ("", "", "")
    where = (str(f.devices), str(f.global_batch), *((f.kind,) if kinds else ()))
    return (*where, best.label, *rate_cells(best), *written_cells, gain, _tied_text(f))


def _tied_text(f: Fastest) -> str:
    """The rows not significantly slower, and those one replicate leaves untested."""
    untested = f"untested (1 replicate): {', '.join(f.untested)}" if f.untested else ""
    return "; ".join(part for part in (", ".join(f.tied), untested) if part)


def replicates_text(row: Row) -> str:
    """Measured replicates, and how many the run asked for when some failed or are missing
    (an interrupted run): "3" or "2/3"."""
    measured = len(row.replicates) - len(row.failed_replicates)
    planned = max(row.planned, len(row.replicates))
    return str(measured) if measured == planned else f"{measured}/{planned}"


def notes(row: Row) -> list[str]:
    """What a reader must know before trusting the row's numbers."""
    return [full for full, _ in _labels(row)]


def brief_notes(row: Row) -> list[str]:
    """The same labels as `notes`, as short tags."""
    return [brief for _, brief in _labels(row)]


def _labels(row: Row) -> list[tuple[str, str]]:
    """Each note in full (report, export) and as a short tag (terminal), side by side so that
    the two can never list different labels."""
    found = []
    t = row.throughput
    if wide(row):
        why = ("more replicates would narrow it" if can_narrow(row) else
               f"this machine's run-to-run variation alone gives ±{100 * run_floor(row):.3g}%")
        found.append((f"wide: the 95% interval is wider than the ±{100 * row.interval_target:.3g}% target ({why})",
                      "wide"))
    if t is not None and t.unstable:
        found.append((f"unstable: replicates ±{t.spread:.0%}", f"unstable ±{t.spread:.0%}"))
    if row.host_bound:
        util = gpu_util_pct(row)
        busy = util is not None and util < HOST_BOUND_GPU_UTIL_PCT
        found.append((f"host-bound: {row.host_bound}", f"host-bound (GPU {util:.0f}%)" if busy
                      else "host-bound (flat step)"))
    cause = above_linear(row)
    if cause is not None and row.scaling is not None:
        short = cause.split(" (")[0]
        found.append((f"above linear: {row.scaling.speedup:.2f}× on {row.devices} devices; likely cause: {cause}",
                      f"above linear: {short}" if len(short) <= 20 else "above linear"))
    if row.throttled:
        throttled = sorted({f"r{r.index}" for r in row.replicates if r.throttled})
        found.append(("throttled: " + ", ".join(row.throttled), f"throttled {','.join(throttled)}"))
    found += [(f"r{r.index} {r.status}",) * 2 for r in row.failed_replicates]
    if row.planned > len(row.replicates):
        missing = row.planned - len(row.replicates)
        found.append((f"{missing} replicate(s) not run", f"{missing} rep(s) not run"))
    if t is not None and t.removed:
        found.append((f"{t.removed} outlier window(s)", f"{t.removed} outlier(s)"))
    return found


def busy_text(busy: BusyHost) -> str:
    """The busy-machine warning, the same in the terminal and the report."""
    return (f"busy machine: the host's load averaged {busy.load:.1f} on {busy.cores} core(s) as replicates "
            "started, so other programs competed with the measurement; rerun on an idle machine for numbers "
            "that hold")


def spread_text(row: Row) -> str:
    """Between- and within-replicate spread as relative standard deviations, e.g. "12.0 % / 0.8 %"."""
    t = row.throughput
    if t is None or math.isnan(t.between_var) or t.mean == 0:
        return ""
    within = "" if math.isnan(t.within_var) else f"{math.sqrt(t.within_var) / t.mean:.1%}"
    return f"{math.sqrt(t.between_var) / t.mean:.1%} / {within}"


READING_NOTES = (
    "A replicate is one fresh worker process (a fresh start of the framework and fresh compilation, "
    "unless the run shares a compilation cache) that times the configuration's windows; a run measures "
    "every configuration in several replicates, in a shuffled order. The processes, not the windows, "
    "are the independent samples: each process decides once what all its windows share (kernels, "
    "autotuning, memory and thread placement).",
    "samples/s is the geometric mean of the replicates' mean throughputs (each over timed windows of many "
    "steps ending with a device sync, windows with |modified z-score| > "
    f"{stats.OUTLIER_THRESHOLD} dropped within their replicate): the centre of its interval, and the mean every "
    "ratio (speedup, vs plain, a lead, a tuned gain) divides, so that each ratio can be recomputed from the "
    "table. The 95% interval, shown as ± where it is nearly symmetric around that mean and as its bounds where "
    f"not, and as \"too few replicates to say\" where its ends lie more than {USABLE_SPAN:g}× apart (\"too noisy "
    "to say\" where this machine's run-to-run variation alone spans that much), is the interval "
    "of that mean over processes, from the replicate means on a log scale. The spread between replicates is "
    "estimated jointly for the configurations of one backend program in one regime "
    "(host-bound or not), which vary alike (an empirical-Bayes random-effects model: each configuration's "
    "variance is estimated with the group's, as far as the group's variances agree, and never below its own), "
    "so a few replicates give a usable interval; simulated, it covers the true mean 94-96 % of the time. "
    "Replicates of one run share "
    "the run's state of the machine, so host-bound rows (and every row on simulated CPU devices) also carry "
    "the machine's run-to-run variation (the spec's run_variation, by default measured on this project's "
    "machines; "
    "benchmarks/repeatability.py measures yours), so that their interval covers a rerun; the other rows, whose "
    "step is the device's, carry a smaller run-to-run term (device_run_variation, 0.2 % by default; absent in "
    "runs made before it). After the planned "
    "replicates, configurations wider than the interval target get more replicates, round by round, while the "
    "time budget lasts; those still wider are marked \"wide\". step ms is the global batch over the median "
    "throughput; 1st call s is the slowest replicate's first call (compilation), excluded from throughput.",
    "speedup answers whether devices help: the N-device mean over the same program's 1-device mean (same "
    "backend, variant and program, the same work per step), a ratio of geometric means, with its 95 % interval "
    "from the same model as the intervals (the two sides' pooled spreads, Welch-Satterthwaite degrees of "
    "freedom); eff. = speedup / devices. vs plain answers what a user gains over the program they would write "
    "for one device (no distribution at all; its rows are shown as \"plain\"): a data-parallel row's mean "
    "over the plain program's on 1 device, so that on N devices it is the program's share (the 1-device "
    "data-parallel row's vs plain) times the devices' share (the speedup). Where the data-parallel program did "
    "not run on 1 device (--single-device plain), the speedup is taken over the plain program and marked "
    "\"vs plain\": it then mixes the two shares. A speedup beyond the device count is marked \"above "
    "linear\" with its likely cause. Plain programs are ranked against plain ones, data-parallel ones "
    "against data-parallel ones on the same device count.",
    "Variants: \"as-written\" is each program as the framework's docs teach it; a named variant (shown as "
    "backend+variant; `xbench backends` lists them) turns on what a performance engineer would, and passes the same "
    "verification. Fastest per configuration: the row with the highest mean, the fastest as-written row beside "
    "it, the tuned gain (ratio of geometric means with its 95 % interval), and the rows whose difference from the "
    "fastest is not significant (the interval of the ratio holds 1; a row with no spread cannot be tested and "
    "is listed as untested). Plain programs are ranked among plain ones and data-parallel programs among "
    "data-parallel ones; where a model has both, the programs column says which a row ranks.",
    "MFU (model FLOPs utilisation): samples/s × the model's FLOPs per sample of a training step ÷ (devices × "
    "each device's dense peak at the run's precision: fp32 on the CUDA cores, tf32 and bf16 on the tensor "
    "cores, from the vendor's datasheet; `xbench.results.peaks`). FLOPs per sample count the matmuls of the forward "
    "pass, the weight gradients and the input gradients of every layer but the first, a multiply-add as 2; "
    "element-wise work (biases, activations, dropout, loss, optimizer) is left out. \"unknown\": the device is "
    "not in xbench's table of peaks (CPUs never are).",
    f"verdict: the zone that holds the speedup's whole 95 % interval: multi-device beneficial (≥ "
    f"{BENEFICIAL_SPEEDUP:.2f}), single device preferred (≤ {SINGLE_PREFERRED_BELOW:.2f}), about even (between "
    "them); inconclusive when the interval spans one of these thresholds (more replicates would decide it). A "
    "verdict can therefore never contradict the interval printed beside it.",
    f"unstable: the replicates disagree beyond what their windows explain (one-way ANOVA p < "
    f"{stats.UNSTABLE_P}) by more than {stats.UNSTABLE_SPREAD:.0%} (the standard deviation of replicate "
    "means over their mean, shown): the number depends on the process that measured it, so trust the "
    "interval, not any single run. host-bound: the GPU was busy for less than half of the timed windows, "
    "or the step time hardly grew while the batch grew 4× or more: the step measures the host's dispatch "
    "(Python, the framework, kernel launches), not the devices' arithmetic. throttled: NVML reported "
    "power or thermal clock limits during a replicate's windows.",
)


# The captions of the "where the time goes" table, in the terminal and the report.
BREAKDOWN_NOTE = ("compute ms: the same step without the gradient all-reduce; comm ms: exposed communication "
                  "= step ms - compute ms (negative: within noise); comm %: of the step; busbw: the backend's "
                  "own all-reduce of the gradient's bytes (xbench allreduce)")
TRAFFIC_NOTE = ("moved/step: one step's collectives in nccl-tests' sizes, from the parameters: AR, the float32 "
                "gradients all-reduced (replicated programs); sharded programs: AG, the parameters all-gathered in "
                "the compute dtype for the forward and again for the backward (resharded after the forward), RS, "
                "the float32 gradients reduce-scattered; each device sends 2(n−1)/n of AR, (n−1)/n of AG and RS")
TELEMETRY_NOTE = ("GPU util %: NVML's own samples of the timed windows, averaged over devices and replicates "
                  "(where it kept none, an untimed second of training after them); mem GiB: the framework's own "
                  "peak counter, the trial's own where a replicate has it, else (≤) one that covers its worker "
                  "process, where an earlier trial may have set it: a bound; without either, NVML's peak 'used'; "
                  "est. GiB: xbench's estimate before launching (parameters, gradients, Adam state, activations at "
                  "the batch where xbench models them: `xbench models` says '(state only)' where not), which leaves "
                  "out the framework's own buffers; "
                  "mJ/sample: NVML energy over the timed windows per sample")


def left_out_line(left_out: Sequence[int], kept: Sequence[int]) -> str:
    """The device counts a run left out (`readiness.within_the_machine`), and what that leaves it
    able to say."""
    counts = " and ".join(str(n) for n in left_out)
    why = ("; only 1-device rows run, so this run can say which framework is fastest, not whether more devices "
           "help" if tuple(kept) == (1,) else "")
    return f"{counts} devices: left out, no backend here has that many{why}"
