"""`xbench recommend`'s answers from fitted step models (`xbench.results.step_model`): which stored
fit answers (the one of this machine's devices, else the closest, never two at once), throughput
per backend and device count, a verdict per backend, and where more devices start to pay."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from xbench.results.fitting import StoredFits, same_kind
from xbench.results.step_model import Fit, FitError, Prediction, flops_for, predict

MULTI, SINGLE, MEASURE = "more devices", "one device", "measure"
# Where a verdict's reason quotes a speedup: the words are decided here, the number is written
# as `xbench compare` writes one, by the command (`Verdict.reason`).
SPEEDUP = "{speedup}"


@dataclass(frozen=True)
class Question:
    """A model (parameters and training FLOPs per sample; FLOPs None: from the family's measured
    sizes), its family, the global batches, and the most devices available."""

    params: float
    flops: float | None
    family: str
    batches: tuple[int, ...]
    devices: int
    unit: str = "samples"  # what throughput is counted in (a preset's unit: tokens, images)
    units_per_sample: int = 1


# How close a fit's machine is to this one: the same kind of device (whatever the count), the
# same platform (a CPU for a CPU, a GPU for a GPU), or another.
SAME_DEVICES, SAME_PLATFORM, OTHER_MACHINE = 2, 1, 0


@dataclass(frozen=True)
class Candidate:
    """A stored fit.json and those of its fits that match the question (family, precision, backends)."""

    stored: StoredFits
    fits: tuple[Fit, ...]


@dataclass(frozen=True)
class Choice:
    """The one fit.json that answers, how close its machine is to this one, and the others that
    cover the question too (left unused: two answers would leave the reader to choose)."""

    answer: Candidate
    closeness: int
    others: tuple[Candidate, ...]


@dataclass(frozen=True)
class Verdict:
    """For one backend at one global batch: the device count to use, and why."""

    fit: Fit
    global_batch: int
    choice: str  # MULTI, SINGLE or MEASURE
    best: Prediction  # the prediction behind the choice
    why: str  # a speedup it quotes stands at SPEEDUP: `reason` writes it
    fastest: Prediction  # the highest predicted throughput over the device counts
    quoted: Prediction | None = None  # the prediction whose speedup `why` quotes (at SPEEDUP)

    def reason(self, speedup: Callable[[tuple[float, float, float]], str]) -> str:
        """`why`, its quoted speedup (central, low, high) written by `speedup`."""
        return self.why if self.quoted is None else self.why.replace(SPEEDUP, speedup(_interval(self.quoted)))

    @property
    def chosen(self) -> Prediction:
        """What the verdict recommends running: the multi-device prediction, else one device's
        (for "measure": the faster central estimate)."""
        return self.fastest if self.choice == MEASURE else self.best


@dataclass(frozen=True)
class BreakEven:
    """The smallest model (parameters) at which `devices` devices beat one, at a global batch:
    the central estimate and the ends of its interval (None: not within the fitted sizes)."""

    fit: Fit
    global_batch: int
    devices: int
    params: float | None
    earliest: float | None  # where the speedup's upper end first passes 1
    surely: float | None  # where its lower end does


def device_counts(available: int) -> list[int]:
    """1, the powers of two below `available`, and `available`."""
    if available < 1:
        raise FitError("--devices must be at least 1")
    counts = {1, available}
    p = 2
    while p < available:
        counts.add(p)
        p *= 2
    return sorted(counts)


def matching(fits: Sequence[Fit], family: str, precision: str | None, backends: Sequence[str] | None) -> list[Fit]:
    return [f for f in fits if f.key.family == family and (precision is None or f.key.precision == precision)
            and (not backends or f.key.backend in backends)]


def model_flops(fit: Fit, question: Question) -> float:
    return question.flops if question.flops else flops_for(fit, question.params)


def predictions(fit: Fit, question: Question, batch: int) -> list[Prediction]:
    """The fit's predictions at each device count that splits the batch evenly and whose
    per-device batch lies in the fitted range; FitError when there is none."""
    flops = model_flops(fit, question)
    found, problems = [], []
    for p in device_counts(question.devices):
        if batch % p:
            continue
        try:
            found.append(predict(fit, question.params, flops, batch, p))
        except FitError as err:
            problems.append(str(err))
    if not found:
        raise FitError(problems[0] if problems else f"batch {batch} does not split over any device count")
    return found


def verdict(fit: Fit, question: Question, batch: int, found: Sequence[Prediction] | None = None) -> Verdict:
    """More devices when some count's speedup interval lies above 1 (the fastest such count);
    one device when every count's lies below; otherwise measure. `found`: the predictions
    already made (`predictions`)."""
    found = list(found) if found is not None else predictions(fit, question, batch)
    fastest = max(found, key=lambda p: p.throughput)
    if not fit.layout.multi:
        return Verdict(fit, batch, SINGLE, found[0], "the fit measured one device only; to weigh more, sweep on a "
                       "machine with them (xbench sweep --devices 1,N)", fastest)
    single = next((p for p in found if p.devices == 1), None)
    if single is None:  # the batch is beyond what one device was measured at
        return Verdict(fit, batch, MULTI, fastest, f"{fastest.devices} devices: batch {batch} on one device is "
                       f"beyond the fitted per-device batches ({fit.batch_range[0]}-{fit.batch_range[1]})", fastest)
    multi = [p for p in found if p.devices > 1 and p.speedup is not None]
    better = [p for p in multi if _interval(p)[1] > 1]
    if better:
        best = max(better, key=lambda p: p.throughput)
        return Verdict(fit, batch, MULTI, best, f"{best.devices} devices: {SPEEDUP}", fastest, best)
    if multi and all(_interval(p)[2] < 1 for p in multi):
        best = max(multi, key=lambda p: _interval(p)[0])
        return Verdict(fit, batch, SINGLE, single, f"{best.devices} devices would run at {SPEEDUP}", fastest, best)
    if not multi:
        return Verdict(fit, batch, SINGLE, single, f"no device count up to {question.devices} splits batch {batch} "
                       "into per-device batches the fit covers", fastest)
    best = max(multi, key=lambda p: _interval(p)[0])
    return Verdict(fit, batch, MEASURE, best, f"{best.devices} devices: {SPEEDUP}, the interval straddles 1×",
                   fastest, best)


def _interval(p: Prediction) -> tuple[float, float, float]:
    """The speedup (central, low, high) of a prediction that has one: on several devices,
    at a global batch one device was measured at."""
    if p.speedup is None:
        raise ValueError(f"no speedup predicted on {p.devices} device(s) at batch {p.global_batch}")
    return p.speedup


def break_even(fit: Fit, global_batch: int, devices: int = 2, points: int = 120) -> BreakEven:
    """Scan the fitted model sizes (log grid) at this batch for where `devices` beat one."""
    low, high = fit.params_range
    sizes = np.geomspace(low, high, points)
    central, lows, highs = [], [], []
    for params in sizes:
        s = _interval(predict(fit, params, flops_for(fit, params), global_batch, devices))
        central.append(s[0])
        lows.append(s[1])
        highs.append(s[2])
    return BreakEven(fit, global_batch, devices, _first_above(sizes, central), _first_above(sizes, highs),
                     _first_above(sizes, lows))


def _first_above(sizes: np.ndarray, values: Sequence[float]) -> float | None:
    """The smallest size from which every value stays above 1."""
    above = np.asarray(values) > 1
    if not above[-1]:
        return None
    last_below = np.flatnonzero(~above)
    return float(sizes[0] if last_below.size == 0 else sizes[last_below[-1] + 1])


def break_even_batches(fit: Fit, devices: int) -> list[int]:
    """Powers of two at which both one device and `devices` stay in the fitted batch range."""
    low, high = fit.batch_range
    start = 2 ** math.ceil(math.log2(low * devices))
    return [b for b in (start * 2 ** k for k in range(40)) if b <= high][:8]


# ----------------------------------------------------------------------------- which fit answers


def candidates(sets: Sequence[StoredFits], family: str, precision: str | None,
               backends: Sequence[str] | None) -> list[Candidate]:
    found = [Candidate(s, tuple(matching(s.fits, family, precision, backends))) for s in sets]
    return [c for c in found if c.fits]


def closeness(machine: str, here: str) -> int:
    """SAME_DEVICES, SAME_PLATFORM or OTHER_MACHINE, from two `machine_of` descriptions."""
    if same_kind(machine, here):
        return SAME_DEVICES
    platform = _platform(machine)
    return SAME_PLATFORM if platform and platform == _platform(here) else OTHER_MACHINE


def _platform(machine: str) -> str | None:
    if machine.startswith("simulated CPU devices"):
        return "cpu"
    count, sep, _ = machine.partition(" x ")
    return "gpu" if sep and count.isdigit() else None


def choose(found: Sequence[Candidate], here: str, question: Question) -> Choice:
    """A fit of this machine's devices (one that covers the question, else the newest); with
    none, the closest machine's fit among those that cover the question (then the newest).
    `found` must not be empty."""
    def rank(c: Candidate) -> tuple[bool, bool, int, str]:
        near = closeness(c.stored.machine, here)
        return near == SAME_DEVICES, uncovered(c.fits, question) is None, near, c.stored.created
    best, *rest = sorted(found, key=rank, reverse=True)
    others = tuple(c for c in rest if uncovered(c.fits, question) is None)
    return Choice(best, closeness(best.stored.machine, here), others)


def uncovered(fits: Sequence[Fit], question: Question) -> str | None:
    """What of the question lies outside every fit's range (None: some fit covers a batch of it)."""
    sized = [f for f in fits if f.params_range[0] <= question.params <= f.params_range[1]]
    if not sized:
        return f"{question.params:,.0f} parameters"
    if any(_splits(f, b, question.devices or max(f.layout.devices)) for f in sized for b in question.batches):
        return None
    asked = " / ".join(f"{b:,}" for b in question.batches)
    return f"global batch {asked}"


def _splits(fit: Fit, batch: int, devices: int) -> bool:
    """Whether some device count up to `devices` splits `batch` into a per-device batch the fit covers."""
    low, high = fit.batch_range
    return any(batch % p == 0 and low <= batch // p <= high for p in device_counts(devices))


def fit_range(fits: Sequence[Fit]) -> str:
    """What the fits cover, in words: 'mlp of 31,363-1,030,659 parameters, 16-1,024 samples per device
    on 1-2 devices'."""
    fit = fits[0]
    devices = sorted({p for f in fits for p in f.layout.devices})
    on = f"{devices[0]}-{devices[-1]} devices" if len(devices) > 1 else f"{devices[0]} device"
    return (f"{fit.key.family} of {fit.params_range[0]:,}-{fit.params_range[1]:,} parameters, "
            f"{fit.batch_range[0]:,}-{fit.batch_range[1]:,} samples per device on {on}")


def sweep_command(fits: Sequence[Fit], question: Question | None = None) -> str:
    """The `xbench sweep` that would measure a fit like these on this machine, widened to cover
    what of `question` they do not."""
    words = ["xbench sweep --backends", *sorted({f.key.backend for f in fits})]
    precisions = {f.key.precision for f in fits}
    if len(precisions) == 1 and precisions != {"fp32"}:
        words += ["--precision", *precisions]
    family = fits[0].key.family
    if question is not None and not any(f.params_range[0] <= question.params <= f.params_range[1] for f in fits):
        p = question.params
        words += ([f"--params {_short(p / 2)} {_short(p)} {_short(2 * p)}"] if family == "mlp"
                  else [f"--model <{family} presets around {_short(p)} parameters>"])
    elif family != "mlp":
        words += [f"--model <{family} presets>"]
    if question is not None and not any(_splits(f, b, 1) for f in fits for b in question.batches):
        batches = sorted({max(1, min(question.batches) // 2), *question.batches, 2 * max(question.batches)})
        words += ["--per-device-batch", *map(str, batches)]
    return " ".join(words)


def _short(count: float) -> str:
    """A parameter count as one writes it on the command line: 5e6, 2.5e5, 300."""
    return f"{count:.3g}".replace("e+0", "e").replace("e+", "e")


def out_of_range(choice: Choice, question: Question) -> str | None:
    """One line when the answering fit does not cover the question: its range, the sweep that
    would, and any other stored fit that does."""
    fits = choice.answer.fits
    outside = uncovered(fits, question)
    if outside is None:
        return None
    stored = choice.answer.stored
    covering = [c.stored for c in choice.others]
    elsewhere = (f"; {covering[0].path} ({covering[0].machine}) covers it: --fits {covering[0].path}"
                 if covering else "")
    return (f"{outside} is outside the fit that answers here ({stored.path}, {stored.machine}: {fit_range(fits)}); "
            f"`{sweep_command(fits, question)}` here would measure a fit that covers it{elsewhere}")
