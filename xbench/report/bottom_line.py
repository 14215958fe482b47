"""The bottom line: per model, the sentences a reader came for (which framework is fastest and
by how much, whether more devices help and from where, what could not be decided and what would
decide it), generated from the same rows, intervals and verdicts as the tables beside them.

Nothing here computes a statistic of its own: a margin is `summary.ratio_of`'s interval, a device
answer is `summary.verdict`'s zone, and "more replicates would decide it" compares the speedup's
run-level floor (`stats.Scaling.run_floor`) with its distance to the nearest verdict threshold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xbench import stats
from xbench.contract import AS_WRITTEN, DATA_PARALLEL, PLAIN, backend_label, implementation
from xbench.report.words import USABLE_SPAN, rate_text, ratio_text, too_uncertain
from xbench.results.control import movements
from xbench.results.fit import does_not_fit, fit_words
from xbench.results.links import NO_EFFECT
from xbench.results.summary import (
    BENEFICIAL_SPEEDUP,
    INCONCLUSIVE,
    SINGLE_PREFERRED_BELOW,
    Row,
    above_linear,
    full_rows,
    geomean_rate,
    program_kind,
    ratio_of,
    verdict,
)

BENEFICIAL, SINGLE, EVEN = "multi-device beneficial", "single device preferred", "about even"
LISTED = 3  # configurations named in one sentence before "and N more"


@dataclass(frozen=True)
class ModelBottomLine:
    model: str
    sentences: tuple[str, ...]


@dataclass(frozen=True)
class Contest:
    """One configuration (devices, global batch): its fastest row and the fastest row of another
    framework, with the ratio of the two from the model behind the tables' intervals."""

    devices: int
    global_batch: int
    best: Row
    rival: Row
    margin: stats.LogRatio
    kind: str = DATA_PARALLEL  # the kind of program both rows are (`summary.program_kind`)

    @property
    def significant(self) -> bool:
        return self.margin.ci_low > 1

    @property
    def untested(self) -> bool:
        """One replicate on a side: no interval, so neither a lead nor a tie can be said."""
        return math.isnan(self.margin.ci_low)

    @property
    def where(self) -> str:
        plain = ", plain programs" if self.kind == PLAIN else ""
        return f"{_plural(self.devices, 'device')}, {batch_phrase(self.best)}{plain}"


def bottom_line(rows: Sequence[Row], controls: Sequence[Mapping[str, Any]] = ()) -> list[ModelBottomLine]:
    """Per model with a measured row, in the tables' order. `controls`: the run's drift control
    (`xbench.results.control.read_controls`), whose movement within the run is said first."""
    found = []
    moved_for = {gpu: machine_moved(controls, device_bound=gpu) for gpu in (False, True)}
    for model in dict.fromkeys(row.model for row in rows):
        measured = [r for r in full_rows(rows) if r.model == model and r.throughput is not None]
        fit = fit_sentence([r for r in full_rows(rows) if r.model == model])
        if measured or fit:  # the machine's movement matters only to rows that were timed
            moved = moved_for[all(map(gpu_bound, measured))]
            said = ([moved] if moved and measured else []) + ([fit] if fit else []) + (
                _sentences(measured) if measured else [])
            found.append(ModelBottomLine(model, tuple(said)))
    return found


def fit_sentence(rows: Sequence[Row]) -> str:
    """Where some configurations did not fit in device memory (`xbench.results.fit`): which,
    which programs fit, and the fastest configuration of those that fit; "" where all fit."""
    missing = [r for r in rows if does_not_fit(r)]
    if not missing:
        return ""
    said = _listed(f"{r.label} on {_plural(r.devices, 'device')} at {batch_phrase(r)} ({fit_words(r.reason)})"
                   for r in missing)
    fit = [r for r in rows if r.throughput is not None]
    if not fit:
        return f"Nothing fit in device memory: {said}."
    best = max(fit, key=geomean_rate)
    programs = ", ".join(f"{label} ({sum(r.label == label for r in fit)} of "
                         f"{_plural(sum(r.label == label for r in rows), 'configuration')})"
                         for label in dict.fromkeys(r.label for r in fit))
    return (f"Did not fit in device memory: {said}. Fit: {programs}; the fastest of them is "
            f"{best.label} on {_plural(best.devices, 'device')} at {batch_phrase(best)} "
            f"({rate_text(geomean_rate(best) * best.units_per_sample)} {best.unit}/s).")


def _sentences(rows: list[Row]) -> list[str]:
    sentences = _machine_sentences(rows)
    sentences += _fastest_sentences(rows)
    sentences += [s for s in (_devices_sentence(label, [r for r in rows if r.label == label])
                              for label in _device_labels(rows)) if s]
    sentences += _plain_sentences(rows)
    sentences += _undecided_sentences(rows)
    sentences += _caveats(rows)
    return sentences


# Which framework is fastest ------------------------------------------------------------------


def contests(rows: Sequence[Row]) -> list[Contest]:
    """Per configuration and kind of program measured by at least two frameworks: the fastest
    row against the fastest row of any other framework (a framework's own backends and variants
    do not count as rivals: the question is which framework). Plain programs meet plain ones
    and data-parallel ones data-parallel ones, so that a program's own overhead is never
    counted as a framework's; a backend without a plain program meets the others on 1 device
    with its data-parallel program."""
    groups: dict[tuple[int, int, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.devices, row.global_batch, program_kind(row)), []).append(row)
    found = []
    for (devices, batch, kind), group in sorted(groups.items(), key=lambda item: (*item[0][:2], item[0][2] != PLAIN)):
        ranked = sorted(group, key=geomean_rate, reverse=True)  # the ratio's own scale
        best = ranked[0]
        rival = next((r for r in ranked if r.framework_key != best.framework_key), None)
        if rival is not None:
            found.append(Contest(devices, batch, best, rival, ratio_of(best, rival), kind))
    return found


def framework_names(rows: Sequence[Row]) -> dict[str, str]:
    """Each framework as the tables call it: the backend name its other backends extend ("tf"
    for tensorflow, "jax" for jax, jax-shardmap and jax-auto), else the framework's own name."""
    backends: dict[str, set[str]] = {}
    for row in rows:
        backends.setdefault(row.framework_key, set()).add(row.backend)
    names = {}
    for name, mine in backends.items():
        shortest = min(mine, key=len)
        names[name] = shortest if all(b.startswith(shortest) for b in mine) else name
    return names


def _fastest_sentences(rows: list[Row]) -> list[str]:
    names = framework_names(rows)
    if len(names) < 2:
        return [f"Only {next(iter(names.values()))} was measured: no framework comparison."]
    tuned = any(r.variant != AS_WRITTEN for r in rows)
    written = [r for r in rows if r.variant == AS_WRITTEN]
    sentences = [_fastest_sentence(contests(written), "As written" if tuned else "Fastest", names)]
    if tuned:
        sentences.append(_fastest_sentence(contests(rows), "With the tuned variants", names))
    return [s for s in sentences if s]


def _fastest_sentence(found: list[Contest], lead: str, names: dict[str, str]) -> str:
    if not found:
        return ""
    wins: dict[str, list[Contest]] = {}
    for c in found:
        wins.setdefault(c.best.framework_key, []).append(c)
    leader = max(wins, key=lambda f: (len(wins[f]), _geomean(c.margin.ratio for c in wins[f])))
    mine, name = wins[leader], names[leader]
    head = (f"{lead}: {name} leads in {len(mine)} of {_plural(len(found), 'configuration')}"
            f"{_programs(mine, name)}, by {_span(c.margin.ratio for c in mine)} over the next framework")
    text = head + _lead_strength(mine)
    others = [c for c in found if c.best.framework_key != leader]
    if others:
        text += "; elsewhere " + _listed(f"{c.best.label} leads at {c.where} ({_margin(c)})" for c in others)
    return text + "."


def _lead_strength(mine: list[Contest]) -> str:
    """Whether the leads hold: significant, ties, or untested (one replicate a side)."""
    significant = [c for c in mine if c.significant]
    untested = [c for c in mine if c.untested]
    ties = [c for c in mine if not c.significant and not c.untested]
    if len(untested) == len(mine):
        return (", with one replicate a side: no interval, so no lead can be called; --replicates 2 or more would "
                "give one")
    if len(significant) == len(mine):
        return " (every lead significant)"
    if not significant and not untested:
        return ", but no lead is significant: the frameworks tie here within their intervals"
    parts = [f"significant in {len(significant)}"] if significant else []
    if ties:
        parts.append(f"a tie with {_names(c.rival.label for c in ties)} in {len(ties)} "
                     f"({_listed(c.where for c in ties)})")
    if untested:
        parts.append(f"untested in {len(untested)} (one replicate a side)")
    return "; " + ", ".join(parts)


def _programs(mine: list[Contest], leader: str) -> str:
    """Which of the leader's programs won, where that is not simply the framework's name."""
    counts: dict[str, int] = {}
    for c in mine:
        counts[c.best.label] = counts.get(c.best.label, 0) + 1
    if set(counts) == {leader}:
        return ""
    return " (" + ", ".join(f"{label} in {n}" for label, n in counts.items()) + ")"


def _margin(c: Contest) -> str:
    m = c.margin
    if c.untested:
        return f"{m.ratio:.2f}× over {c.rival.label}, untested: one replicate a side"
    if m.ci_high / m.ci_low > USABLE_SPAN and m.ci_low <= 1 <= m.ci_high:
        return f"{m.ratio:.2f}× over {c.rival.label}, too uncertain to say which is faster"
    return (f"{m.ratio:.2f}× over {c.rival.label}, {m.ci_low:.2f}–{m.ci_high:.2f}"
            + ("" if c.significant else ", not significant"))


# Whether more devices help -----------------------------------------------------------------


def _devices_sentence(label: str, rows: list[Row]) -> str:
    """At the largest device count measured: from which batch on the verdict is beneficial,
    the program against itself on 1 device; where the speedups were taken over the plain
    program instead (`--single-device plain`), the ratios alone, said to mix program and devices."""
    most = max(r.devices for r in rows)
    multi = sorted((r for r in rows if r.devices == most and r.scaling is not None), key=_batch_of)
    if not multi:
        return ""
    if any(r.baseline == PLAIN for r in multi):
        return (f"{label} on {most} devices against the plain 1-device program: "
                f"{_listed(f'{_speedup(r)} at {batch_phrase(r)}' for r in multi)}; that is another program, so "
                "these ratios mix what the program and what the devices do (--single-device both times the same "
                "program on 1 device)." + _above_linear_sentence(multi))
    return _verdicts_sentence(label, most, multi) + _above_linear_sentence(multi)


# What each verdict says of N devices against 1, in a sentence: plain words, no thresholds.
SAID = {BENEFICIAL: "faster than 1", SINGLE: "slower than 1", EVEN: "about even with 1", INCONCLUSIVE: "undecided"}


def _verdicts_sentence(label: str, most: int, multi: list[Row]) -> str:
    verdicts = [verdict(r) for r in multi]
    lead, every = f"{label}: {most} devices", "every batch measured"
    best = max(multi, key=lambda r: r.scaling.speedup if r.scaling else 0.0)
    start = _beneficial_from(verdicts)
    if all(v == BENEFICIAL for v in verdicts):
        return f"{lead} beat 1 at {every} ({_speedups(multi)})."
    if start is not None:
        below = _by_verdict(multi[:start], verdicts[:start])
        return f"{lead} beat 1 from {batch_phrase(multi[start])} on ({_speedup(multi[start])}); below it: {below}."
    if all(v == SINGLE for v in verdicts):
        return f"{lead} are slower than 1 at {every} (best {_speedup(best)} at {batch_phrase(best)})."
    if all(_no_interval(r) for r in multi):
        return (f"{lead}: {_listed(f'{_speedup(r)} at {batch_phrase(r)}' for r in multi)}; with one replicate a "
                "side there is no interval, so no verdict.")
    if all(v == INCONCLUSIVE for v in verdicts):
        return (f"{lead} against 1: undecided at {every} "
                f"({_listed(f'{_speedup(r)} at {batch_phrase(r)}' for r in multi)}).")
    return f"{lead} against 1: {_by_verdict(multi, verdicts)}."


def _by_verdict(rows: list[Row], verdicts: list[str]) -> str:
    """e.g. "faster than 1 at batch 64 (1.52× (1.31–1.77)); undecided at batch 256 (1.73×, too
    few replicates to say)": each batch in its verdict's plain words, with its speedup."""
    return _listed(f"{SAID.get(v, v)} at {batch_phrase(r)} ({_speedup(r)})" for r, v in zip(rows, verdicts))


def _above_linear_sentence(multi: list[Row]) -> str:
    """Speedups beyond the device count, with their likely cause: no N devices do more than N
    times one device's arithmetic, so such a figure says something about the 1-device row."""
    beyond = [(r, cause) for r in multi if (cause := above_linear(r)) is not None]
    if not beyond:
        return ""
    return (" Above linear, so not the devices' doing alone: "
            + _listed(f"{_speedup(r)} at {batch_phrase(r)} (likely {cause})" for r, cause in beyond) + ".")


# Against the program a user would write for one device ----------------------------------------


def _plain_sentences(rows: list[Row]) -> list[str]:
    """Per data-parallel program with a plain single-device sibling: its throughput on the most
    devices over the plain program's, split into the program's share (the data-parallel program
    on 1 device over the plain one) and the devices' share (the speedup), which multiply to it."""
    sentences = []
    written = [r for r in rows if r.variant == AS_WRITTEN]  # a tuned variant's would repeat the pattern
    for label in dict.fromkeys(r.label for r in written if r.vs_plain is not None and r.devices > 1):
        mine = [r for r in rows if r.label == label and r.vs_plain is not None]
        most = max(r.devices for r in mine)
        multi = sorted((r for r in mine if r.devices == most), key=_batch_of)
        single = {_batch_of(r): r for r in mine if r.devices == 1}
        plain = backend_label(implementation(multi[0].backend, multi[0].variant, PLAIN), multi[0].launcher)
        parts = [_plain_part(r, single.get(_batch_of(r))) for r in multi]
        sentences.append(f"{label} against {plain} (the program you would write for one device): on "
                         f"{_plural(most, 'device')} {_listed(parts)}.")
    return sentences


def _plain_part(row: Row, single: Row | None) -> str:
    assert row.vs_plain is not None
    total = (f"{row.vs_plain.speedup:.2f}× at {batch_phrase(row)} (too uncertain to say)" if too_uncertain(row.vs_plain)
             else f"{ratio_text(row.vs_plain)} at {batch_phrase(row)}")
    if single is None or single.vs_plain is None or row.scaling is None:
        return total
    return f"{total} = {single.vs_plain.speedup:.2f}× from the program × {row.scaling.speedup:.2f}× from the devices"


def _device_labels(rows: list[Row]) -> list[str]:
    """The programs whose device answer is said: each as written, and a tuned variant only
    where its verdicts differ from its own program as written (else it would say the same)."""
    def verdicts(label: str) -> tuple[str, ...]:
        mine = [r for r in rows if r.label == label and r.devices > 1]
        most = max((r.devices for r in mine), default=0)
        return tuple(verdict(r) for r in sorted((r for r in mine if r.devices == most), key=_batch_of))

    found = []
    for row in {r.label: r for r in rows if r.devices > 1}.values():
        written = backend_label(implementation(row.backend, AS_WRITTEN, row.program), row.launcher)
        if row.variant == AS_WRITTEN or not verdicts(written) or verdicts(row.label) != verdicts(written):
            found.append(row.label)
    return found


def _beneficial_from(verdicts: list[str]) -> int | None:
    """The first index from which every verdict is beneficial, when some earlier one is not."""
    for start in range(1, len(verdicts)):
        if all(v == BENEFICIAL for v in verdicts[start:]):
            return start
    return None


def _batch_of(row: Row) -> int:
    return row.per_device_batch if row.scaling_mode == "weak" else row.global_batch


def _speedup(row: Row) -> str:
    assert row.scaling is not None
    return ratio_text(row.scaling, brief=False)


def _speedups(rows: list[Row]) -> str:
    """Several speedups as their span; one with its interval."""
    if len(rows) == 1:
        return _speedup(rows[0])
    return _span(r.scaling.speedup for r in rows if r.scaling)


def _span(values) -> str:
    """e.g. "1.06× to 1.49×", or one value when they all round alike."""
    low, high = f"{min(values := list(values)):.2f}×", f"{max(values):.2f}×"
    return low if low == high else f"{low} to {high}"


def _counted(verdicts: list[str]) -> str:
    counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
    return ", ".join(f"{n} {v}" for v, n in counts.items())


# What could not be decided, and what would decide it ---------------------------------------


def _undecided_sentences(rows: list[Row]) -> list[str]:
    open_rows = [r for r in rows if r.devices > 1 and verdict(r) == INCONCLUSIVE and r.scaling is not None]
    if not open_rows:
        return []
    lonely = [r for r in open_rows if _no_interval(r)]
    narrowable = [r for r in open_rows if replicates_could_decide(r) and r not in lonely]
    floored = [r for r in open_rows if r not in narrowable and r not in lonely]
    sentences = []
    if lonely:
        sentences.append(f"Undecided: {_listed(_where(r) for r in lonely)} had one replicate a side, so no interval; "
                         "--replicates 2 or more would give one.")
    if narrowable:
        sentences.append(
            f"Undecided: more devices against 1 for {_listed(_where(r) for r in narrowable)}; these replicates "
            "cannot yet tell a gain from no change or a loss; more replicates would decide it (a longer "
            "--time-budget, or --max-replicates).")
    if floored:
        sentences.append(
            f"Undecided: more devices against 1 for {_listed(_where(r) for r in floored)}; this machine's "
            "run-to-run variation alone is wider than the gap, so more replicates will not decide it: a larger batch "
            "(less host-bound) or a quieter machine would.")
    return sentences


def _where(row: Row) -> str:
    return f"{row.label} on {_plural(row.devices, 'device')} at {batch_phrase(row)} ({_speedup(row)})"


def batch_phrase(row: Row) -> str:
    """The batch as the run chose it: "batch 2,048" (strong scaling: the global batch, the
    tables' batch column) or "per-device batch 64" (weak scaling)."""
    return f"per-device batch {row.per_device_batch:,}" if row.scaling_mode == "weak" else \
        f"batch {row.global_batch:,}"


def replicates_could_decide(row: Row) -> bool:
    """Whether the run-level variation of both sides of the speedup (which no replicate of this
    run narrows) leaves it clear of the nearest verdict threshold."""
    s = row.scaling
    assert s is not None
    gap = min(abs(math.log(s.speedup / t)) for t in (SINGLE_PREFERRED_BELOW, BENEFICIAL_SPEEDUP))
    return math.log1p(s.run_floor) < gap


def _no_interval(row: Row) -> bool:
    return row.scaling is not None and math.isnan(row.scaling.ci_low)


def _caveats(rows: list[Row]) -> list[str]:
    caveats = []
    if any(r.simulated for r in rows):
        caveats.append("These devices are simulated on one CPU's cores: the device answers test the harness and "
                       "the frameworks' CPU paths, not multi-GPU scaling.")
    links = {r.links for r in rows if r.links}
    if any(NO_EFFECT in said for said in links):
        caveats.append("P2P off was asked (--p2p off) but changes nothing on these devices: no collective here goes "
                       "through NCCL, or there is one GPU.")
    if any(NO_EFFECT not in said for said in links):
        caveats.append("P2P off (--p2p off): GPU-to-GPU traffic went through host memory, so the multi-device answers "
                       "are for that topology, as on a PCIe machine without peer-to-peer, staged through this "
                       "machine's host memory (not a PCIe box's own bandwidth).")
    bound = [r for r in rows if r.host_bound]
    if bound and not all(r.simulated for r in rows):
        caveats.append(f"{len(bound)} of {len(rows)} row(s) are host-bound (the step measures dispatch, not "
                       "arithmetic): a larger batch would show the devices.")
    return caveats


# The machine the run measured on --------------------------------------------------------------


def _machine_sentences(rows: list[Row]) -> list[str]:
    """A busy machine, first, since it qualifies every other sentence: other programs competed
    with the measurement (`conditions.busy_host`, the run's verdict, carried by each row)."""
    busy = next((r.busy for r in rows if r.busy), None)
    if busy is None:
        return []
    load, cores = busy
    return [f"Measured on a busy machine (the host's load averaged {load:.1f} on {_plural(cores, 'core')} as "
            "replicates started): other programs competed with the measurement, so these numbers, and every "
            "speedup and lead below, may not hold on an idle machine; rerun there before relying on them."]


def machine_moved(controls: Sequence[Mapping[str, Any]], device_bound: bool = False) -> str:
    """The sentence for a run whose drift control (`xbench.run.drift`, timed before and after its
    replicates) moved between its start and its end, else "": the machine changed while the run
    measured, so its early and late replicates saw different machines. It times the host, not the
    GPUs of `device_bound` rows (on one H100 it moved 14-15 % as their replicates agreed within 0.1 %)."""
    before = [c for c in controls if c.get("when") == "before"]
    after = [c for c in controls if c.get("when") == "after"]
    moved = [m for m in movements(before, after) if m.moved]
    if not moved:
        return ""
    said = "; ".join(f"its {m.workload} ran {abs(m.ratio - 1):.0%} {'slower' if m.ratio > 1 else 'faster'} at "
                     "the end than at the start" for m in moved)
    if device_bound:
        return (f"The host moved during the run ({said}); these rows time their GPUs' steps (none host-bound), "
                "which the host's probes do not measure, so it likely touches them little.")
    return (f"The machine moved during the run ({said}): replicates timed early and late saw different machines, "
            "so a rerun may differ by more than the intervals say.")


def gpu_bound(row: Row) -> bool:
    """A row on real GPUs (a known peak) whose step is not host dispatch."""
    return not row.simulated and row.peak is not None and not row.host_bound


# Wording helpers ---------------------------------------------------------------------------


def _listed(items) -> str:
    items = list(items)
    shown = "; ".join(items[:LISTED])
    return shown + (f"; and {len(items) - LISTED} more" if len(items) > LISTED else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _names(labels) -> str:
    return ", ".join(dict.fromkeys(labels))


def _geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0
