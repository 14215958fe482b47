"""A fitted model of the data-parallel training step, to predict configurations not yet run.

Per backend implementation (backend, variant, launcher), precision and model family, from the
configurations a run measured on one machine:

    compute      T_c = a_p + c_p * b * F0 * (F / F0)^k + d * P
    all-reduce   T_n = alpha_p + beta_p * 4 P
    step         T   = T_c on one device, (T_c^g + T_n^g)^(1/g) on p > 1 devices

with F the model's training FLOPs per sample, b the per-device batch, P the parameters (the
gradient travels as float32), F0 the geometric mean of the measured models' F. a_p is the
host's floor per step (Python, the framework's dispatch, kernel launches) on p devices, c_p
seconds per model FLOP of one device's share at F0, k how that cost grows with model size (1:
every FLOP costs the same; below 1: larger layers use the device better, as measured on CPUs
and GPUs alike), d seconds per parameter whatever the batch (the optimizer update, reading
the weights). alpha_p + beta_p * bytes is the alpha-beta model of the all-reduce inside the
step, fitted from full steps against their compute-only twins: the run's all-reduce benchmark
(`--breakdown`) is its starting point and is kept beside it, but a framework's step reduces
its gradient in its own way (DDP's buckets, one collective per tensor): fitted at 2-3x the
benchmark's latency and 2-8x its per-byte cost on simulated CPU devices. g >= 1 is the overlap of the two (1: none,
large: communication hidden behind compute), combined as Pollux does (Qiao et al., OSDI'21,
`adaptdl/goodput.py`).

The fit minimises squared differences of log step time (relative errors; every configuration
counts alike), each configuration at the mean of its replicates (fresh worker processes).
Compute-only twins (`--breakdown`) pin the compute terms on p devices. Uncertainty: a
bootstrap over replicates (each configuration's replicate means resampled with replacement,
the model refitted), widened by the fit's residual scatter, the model's own error that no
resampling of the data shows.

Assumptions, stated where predictions rest on them: devices of a machine are alike; a device
count not measured takes the largest measured one's per-FLOP cost, its host floor grown as it
grew between the two largest measured counts (per doubling; one process dispatching to more
devices pays more), and its all-reduce over the same links: the fitted latency as it is (in a
step it is mostly the framework's own per-step cost, not hops: fitted at 0.6-2 ms on 2 GPUs
against NCCL's 0.05-0.1 ms, and flat from 2 to 4 GPUs), the bytes x 2(p-1)/p as a ring carries
them (checked against 4 x H200 from fits on 1 and 2: results/2026-11-28-h200x4-four-gpus/);
F and P between measured models follow a power law fitted through the family's measured models.

Pure functions over plain data; no framework is imported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from xbench.contract import backend_label, implementation
from xbench.errors import XbenchError, brief

GRADIENT_BYTES_PER_PARAM = 4  # float32 gradients, whatever the matmul precision
BOOTSTRAP_SAMPLES = 100
Z95 = 1.959964
MAX_OVERLAP = 8.0
SIZE_EXPONENT = (0.3, 1.5)  # bounds of k, the growth of a sample's cost with its FLOPs
_LOG_BOUNDS = (-60.0, 5.0)  # ln of a term in seconds (per FLOP, per byte, ...)


class FitError(XbenchError):
    """The measurements cannot support a fit or a prediction; the message says what to measure."""


@dataclass(frozen=True)
class FitKey:
    """What one fitted model describes: an implementation at a precision, on one family."""

    backend: str
    variant: str
    launcher: str
    precision: str
    family: str

    @property
    def label(self) -> str:
        """As tables name it: "jax", "torch+compile (spmd)"."""
        return backend_label(implementation(self.backend, self.variant), self.launcher)


@dataclass(frozen=True)
class Observation:
    """One measured configuration: its replicates' mean step times."""

    key: FitKey
    model: str
    params: int
    flops: float  # training FLOPs per sample
    devices: int
    local_batch: int
    all_reduce: bool  # False: a compute-only twin
    step_s: tuple[float, ...]  # one per replicate

    @property
    def log_step(self) -> float:
        return math.log(float(np.mean(self.step_s)))

    @property
    def throughput(self) -> float:
        """Samples per second of the whole step, the mean over replicates (as tables show it)."""
        return float(np.mean([self.devices * self.local_batch / s for s in self.step_s]))


@dataclass(frozen=True)
class Layout:
    """Which device counts the fit has terms for, and the FLOPs per sample (F0) its per-FLOP
    cost is taken at."""

    devices: tuple[int, ...]
    flops_ref: float = 1.0

    @property
    def multi(self) -> tuple[int, ...]:
        return tuple(p for p in self.devices if p > 1)

    @property
    def size(self) -> int:
        """Terms: a and c per device count, d, k; alpha and beta per p > 1, and g."""
        return 2 * len(self.devices) + 2 + 2 * len(self.multi) + (1 if self.multi else 0)


@dataclass(frozen=True)
class Terms:
    """A step's predicted time and its parts, in seconds."""

    step: float
    host: float
    arithmetic: float  # per-FLOP and per-parameter compute
    comm: float  # the all-reduce alone
    exposed_comm: float  # step - compute: what overlap leaves of the all-reduce



@dataclass(frozen=True)
class Fit:
    """A fitted step model for one key, with its bootstrap and the range it was fitted on."""

    key: FitKey
    layout: Layout
    theta: tuple[float, ...]  # the parameter vector (see `unpack`)
    bootstrap: tuple[tuple[float, ...], ...]
    residual_sd: float  # of log step time, degrees of freedom counted
    observations: int
    params_range: tuple[int, int]
    batch_range: tuple[int, int]  # per-device batch
    size_law: tuple[float, float]  # ln F = size_law[0] + size_law[1] * ln P, through the measured models
    models: tuple[str, ...]
    # p -> the all-reduce benchmark's (alpha, beta)
    benchmark: Mapping[int, tuple[float, float]] = field(default_factory=dict)

    @cached_property
    def unpacked(self) -> tuple[dict[str, Any], ...]:
        """The central fit's named terms, then each bootstrap fit's: unpacked once, as a
        recommendation predicts hundreds of configurations from them."""
        return tuple(unpack(theta, self.layout) for theta in (self.theta, *self.bootstrap))


# ----------------------------------------------------------------------------- the model


def unpack(theta: Sequence[float] | np.ndarray, layout: Layout) -> dict[str, Any]:
    """The vector as named terms: a, c per device count; d; k; all-reduce (alpha, beta) per
    p > 1; the overlap g. Logs of the positive terms are what the optimiser moves."""
    x = list(theta)
    n = len(layout.devices)
    rest = x[2 * n + 2:]
    return {
        "a": {p: math.exp(v) for p, v in zip(layout.devices, x[:n])},
        "c": {p: math.exp(v) for p, v in zip(layout.devices, x[n:2 * n])},
        "d": math.exp(x[2 * n]),
        "k": x[2 * n + 1],
        "flops_ref": layout.flops_ref,
        "comm": {p: (math.exp(rest[2 * i]), math.exp(rest[2 * i + 1])) for i, p in enumerate(layout.multi)},
        "g": rest[-1] if layout.multi else 1.0,
    }


def step_terms(terms: Mapping[str, Any], devices: int, local_batch: float, flops: float, params: float,
               all_reduce: bool = True) -> Terms:
    """The predicted step on `devices` devices; a device count without terms of its own takes
    the largest measured one's per-FLOP cost, a host floor extrapolated from the measured ones
    and a ring all-reduce scaled from it."""
    base = devices if devices in terms["a"] else max(terms["a"])
    host = host_floor(terms["a"], devices)
    ref = terms.get("flops_ref", 1.0)
    per_sample = ref * (flops / ref) ** terms.get("k", 1.0)
    arithmetic = terms["c"][base] * per_sample * local_batch + terms["d"] * params
    compute = host + arithmetic
    if devices == 1 or not all_reduce:
        return Terms(compute, host, arithmetic, 0.0, 0.0)
    comm = all_reduce_time(terms["comm"], devices, GRADIENT_BYTES_PER_PARAM * params)
    g = terms["g"]
    step = (compute ** g + comm ** g) ** (1 / g)
    return Terms(step, host, arithmetic, comm, step - compute)


def host_floor(floors: Mapping[int, float], devices: int) -> float:
    """The host's floor per step on `devices` devices: measured, or the largest measured count's
    grown (or shrunk) per doubling of devices as it did between the two largest counts."""
    if devices in floors:
        return floors[devices]
    counts = sorted(floors)
    ref = counts[-1]
    if len(counts) < 2:
        return floors[ref]
    prev = counts[-2]
    return floors[ref] * (floors[ref] / floors[prev]) ** (math.log(devices / ref) / math.log(ref / prev))


def all_reduce_time(comm: Mapping[int, tuple[float, float]], devices: int, nbytes: float) -> float:
    """alpha + beta * bytes at a measured device count; elsewhere from the largest measured one:
    its latency as it is (per step, mostly the framework's own cost, not hops), the bytes per link
    as a ring carries them, 2(p-1)/p."""
    if devices in comm:
        alpha, beta = comm[devices]
        return alpha + beta * nbytes
    if not comm:
        raise FitError(f"no all-reduce measured on more than one device; sweep on {devices} devices")
    ref = max(comm)
    alpha, beta = comm[ref]
    return alpha + beta * nbytes * _ring(devices) / _ring(ref)


def _ring(p: int) -> float:
    return 2 * (p - 1) / p


def predict_log(theta: Sequence[float] | np.ndarray, layout: Layout, obs: Sequence[Observation]) -> np.ndarray:
    terms = unpack(theta, layout)
    return np.array([math.log(step_terms(terms, o.devices, o.local_batch, o.flops, o.params, o.all_reduce).step)
                     for o in obs])


# ----------------------------------------------------------------------------- fitting


def alpha_beta(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """The all-reduce's alpha (s) and beta (s per byte), non-negative, fitted on relative error."""
    from scipy.optimize import nnls

    t = np.asarray(seconds, dtype=float)
    design = np.column_stack([1 / t, np.asarray(sizes, dtype=float) / t])
    (alpha, beta), _ = nnls(design, np.ones_like(t))
    return float(alpha), float(beta)


def fit(obs: Sequence[Observation], benchmark: Mapping[int, tuple[float, float]] | None = None,
        bootstrap: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> Fit:
    """Fit one key's observations (all of one FitKey); `benchmark` is the all-reduce benchmark's
    (alpha, beta) per device count, the starting point of the step's own. FitError when the
    observations cannot support a fit."""
    obs = list(obs)
    key = _one_key(obs)
    devices = tuple(sorted({o.devices for o in obs}))
    if 1 not in devices:
        raise FitError(f"{key.label}: no 1-device step measured; sweep with --devices 1,N")
    layout = Layout(devices, float(np.exp(np.mean(np.log([o.flops for o in obs])))))
    benchmark = {p: (alpha, beta) for p, (alpha, beta) in (benchmark or {}).items() if p in layout.multi}
    _check_enough(obs, layout, key)
    theta = _least_squares(obs, layout, _initial(obs, layout, benchmark))
    resid = predict_log(theta, layout, obs) - np.array([o.log_step for o in obs])
    dof = len(obs) - layout.size
    sd = float(math.sqrt(float(resid @ resid) / dof))
    params = [o.params for o in obs]
    batches = [o.local_batch for o in obs]
    return Fit(key=key, layout=layout, theta=tuple(theta), bootstrap=_bootstrap(obs, layout, theta, bootstrap, seed),
               residual_sd=sd, observations=len(obs), params_range=(min(params), max(params)),
               batch_range=(min(batches), max(batches)), size_law=_size_law(obs),
               models=tuple(sorted({o.model for o in obs})),
               benchmark=benchmark)


def _one_key(obs: Sequence[Observation]) -> FitKey:
    keys = {o.key for o in obs}
    if len(keys) != 1:
        raise ValueError(f"fit takes one key's observations, got {len(keys)}")
    return keys.pop()


def _check_enough(obs: Sequence[Observation], layout: Layout, key: FitKey) -> None:
    """More configurations than terms, and per device count at least two batch sizes or model
    sizes (else the floor and the per-FLOP cost are one number)."""
    if len(obs) <= layout.size:
        raise FitError(f"{key.label}: {len(obs)} measured configuration(s) cannot fit {layout.size} terms; "
                       "sweep more batch sizes or models (xbench sweep)")
    for p in layout.devices:
        work = {o.flops * o.local_batch for o in obs if o.devices == p}
        if len(work) < 2:
            raise FitError(f"{key.label}: on {p} device(s) only one amount of work per device was measured; "
                           "sweep at least two batch sizes")


def _initial(obs: Sequence[Observation], layout: Layout,
             benchmark: Mapping[int, tuple[float, float]]) -> np.ndarray:
    """Starting point: per device count, non-negative least squares of a + c F b + d P on
    relative error over that count's compute (twins; full steps where there are none)."""
    from scipy.optimize import nnls

    floor = 1e-12
    a, c, d = [], [], []
    for p in layout.devices:
        mine = [o for o in obs if o.devices == p and not o.all_reduce] or [o for o in obs if o.devices == p]
        t = np.array([np.mean(o.step_s) for o in mine])
        design = np.column_stack([np.ones(len(mine)), [o.flops * o.local_batch for o in mine],
                                  [o.params for o in mine]]) / t[:, None]
        scale = np.maximum(np.abs(design).max(axis=0), floor)
        coef, _ = nnls(design / scale, np.ones(len(mine)))
        coef = coef / scale
        a.append(coef[0])
        c.append(coef[1])
        d.append(coef[2])
    first = [math.log(max(v, floor)) for v in a] + [math.log(max(v, 1e-20)) for v in c]
    first += [math.log(max(float(np.mean(d)), 1e-20)), 1.0]
    for p in layout.multi:
        alpha, beta = benchmark.get(p, (1e-5, 1e-11))
        first += [math.log(max(alpha, 1e-9)), math.log(max(beta, 1e-15))]
    if layout.multi:
        first.append(2.0)
    return np.array(first)


def _bounds(layout: Layout, which: int) -> np.ndarray:
    """Logs of the positive terms within _LOG_BOUNDS, k within SIZE_EXPONENT, g within 1..MAX_OVERLAP."""
    n = len(layout.devices)
    logs = (_LOG_BOUNDS[which],) * (2 * n + 1)
    comm = (_LOG_BOUNDS[which],) * (2 * len(layout.multi)) + (((1.0, MAX_OVERLAP)[which],) if layout.multi else ())
    return np.array([*logs, SIZE_EXPONENT[which], *comm])


def fit_problem(fit: Fit) -> str | None:
    """Why a stored fit cannot be one the fitter made, or None: every parameter vector (the
    fit's and its bootstrap's) within the bounds the fitter searches, finite numbers elsewhere.
    A hand-edited or damaged fit.json would otherwise answer with NaN or complex numbers."""
    if not (math.isfinite(fit.layout.flops_ref) and fit.layout.flops_ref > 0):
        return f"has flops_ref {brief(fit.layout.flops_ref)}"
    if not fit.layout.devices or any(not isinstance(p, int) or p < 1 for p in fit.layout.devices):
        return f"has devices {brief(list(fit.layout.devices))}"
    low, high = _bounds(fit.layout, 0), _bounds(fit.layout, 1)
    for name, theta in (("theta", fit.theta), *(("a bootstrap theta", b) for b in fit.bootstrap)):
        vector = np.asarray(theta, dtype=float)
        if vector.shape != low.shape or not np.all(np.isfinite(vector)):
            return f"has {name} of {vector.size} values, not {low.size} finite ones"
        if np.any(vector < low - 1e-9) or np.any(vector > high + 1e-9):
            return f"has {name} outside the fitter's bounds"
    ranges: tuple[tuple[str, Sequence[float]], ...] = (
        ("residual_sd", (fit.residual_sd,)), ("params_range", fit.params_range), ("batch_range", fit.batch_range),
        ("size_law", fit.size_law))
    for name, values in ranges:
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            return f"has {name} {brief(list(values))}"
    if fit.residual_sd < 0 or min(fit.params_range) <= 0 or min(fit.batch_range) <= 0:
        return "has a negative spread or a range below 1"
    return None


def _least_squares(obs: Sequence[Observation], layout: Layout, start: np.ndarray,
                   targets: np.ndarray | None = None) -> np.ndarray:
    from scipy.optimize import least_squares

    y = np.array([o.log_step for o in obs]) if targets is None else targets
    low, high = _bounds(layout, 0), _bounds(layout, 1)
    starts = [start] if targets is not None or not layout.multi else [
        np.concatenate([start[:-1], [g]]) for g in (1.0, 2.0, 4.0)]
    results = [least_squares(lambda x: predict_log(x, layout, obs) - y, np.clip(x0, low + 1e-9, high - 1e-9),
                             bounds=(low, high), method="trf", x_scale="jac",
                             max_nfev=400 if targets is None else 100)
               for x0 in starts]
    return min(results, key=lambda result: result.cost).x  # the first of the lowest cost


def _bootstrap(obs: Sequence[Observation], layout: Layout, theta: np.ndarray, samples: int,
               seed: int) -> tuple[tuple[float, ...], ...]:
    """Refits on the replicate means resampled with replacement per configuration (a
    configuration with one replicate keeps it: it says nothing about its spread)."""
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(samples):
        y = np.array([math.log(float(np.mean(rng.choice(o.step_s, size=len(o.step_s))))) for o in obs])
        fits.append(tuple(_least_squares(obs, layout, theta, y)))
    return tuple(fits)


def _size_law(obs: Sequence[Observation]) -> tuple[float, float]:
    """ln F against ln P through the measured models (slope 1 when there is one model size)."""
    pairs = sorted({(o.params, o.flops) for o in obs})
    logp = np.log([p for p, _ in pairs])
    logf = np.log([f for _, f in pairs])
    if len(pairs) < 2 or np.ptp(logp) == 0:
        return float(np.mean(logf - logp)), 1.0
    slope, intercept = np.polyfit(logp, logf, 1)
    return float(intercept), float(slope)


def flops_for(fit: Fit, params: float) -> float:
    """Training FLOPs per sample of a model of the fit's family with `params` parameters."""
    intercept, slope = fit.size_law
    return math.exp(intercept + slope * math.log(params))


# ----------------------------------------------------------------------------- predicting


@dataclass(frozen=True)
class Prediction:
    """A configuration's predicted throughput (samples/s) and speedup, 95 % intervals."""

    key: FitKey
    devices: int
    global_batch: int
    throughput: float
    throughput_low: float
    throughput_high: float
    terms: Terms
    speedup: tuple[float, float, float] | None  # vs 1 device at the same global batch: (central, low, high)
    extrapolated: str | None  # the assumption a device count beyond the measured ones rests on


def predict(fit: Fit, params: float, flops: float, global_batch: int, devices: int) -> Prediction:
    """Throughput of `global_batch` split over `devices`, with its interval, and the speedup
    against one device; FitError outside the fitted range of model sizes and batches."""
    local = global_batch / devices
    check_in_range(fit, params, local)
    samples = _log_steps(fit, params, flops, local, devices)
    center = samples[0]
    spread = _half_width(samples[1:], fit.residual_sd)
    terms = step_terms(fit.unpacked[0], devices, local, flops, params)
    speedup = None
    if devices > 1 and global_batch <= fit.batch_range[1]:
        single = _log_steps(fit, params, flops, global_batch, 1)
        ratio = single - samples  # ln(T1 / Tp): the same bootstrap fit on both sides
        half = _half_width(ratio[1:], math.sqrt(2) * fit.residual_sd)
        speedup = (math.exp(ratio[0]), math.exp(ratio[0] - half), math.exp(ratio[0] + half))
    rate = global_batch / math.exp(center)
    return Prediction(fit.key, devices, global_batch, rate, rate * math.exp(-spread), rate * math.exp(spread),
                      terms, speedup, extrapolation(fit, devices))


def _log_steps(fit: Fit, params: float, flops: float, local: float, devices: int) -> np.ndarray:
    """ln step time under the central fit, then under each bootstrap fit."""
    return np.array([math.log(step_terms(terms, devices, local, flops, params).step) for terms in fit.unpacked])


def _half_width(samples: np.ndarray, residual_sd: float) -> float:
    """Half the 95 % interval in log space: the bootstrap's (parameter uncertainty from the
    replicates) and the residual scatter's (model error), combined in quadrature."""
    boot = (np.percentile(samples, 97.5) - np.percentile(samples, 2.5)) / 2 if len(samples) > 1 else 0.0
    return float(math.sqrt(boot ** 2 + (Z95 * residual_sd) ** 2))


def check_in_range(fit: Fit, params: float, local_batch: float) -> None:
    if not params > 0 or not local_batch > 0:
        raise FitError("model size and batch must be positive")
    low, high = fit.params_range
    if not low <= params <= high:
        how = (f"--params {params:.3g}" if fit.key.family == "mlp"
               else f"--model or --config with a {fit.key.family} of that size")
        raise FitError(f"{fit.key.label}: {params:,.0f} parameters is outside the fitted {low:,}-{high:,}; "
                       f"sweep a model of that size (xbench sweep {how})")
    low, high = fit.batch_range
    if not low <= local_batch <= high:
        batch = max(1, int(local_batch))
        around = f"{max(1, batch // 2)} {batch} {2 * batch}"
        raise FitError(f"{fit.key.label}: {local_batch:g} samples per device is outside the fitted {low}-{high}; "
                       f"sweep batches around it (xbench sweep --per-device-batch {around})")


def extrapolation(fit: Fit, devices: int) -> str | None:
    if devices in fit.layout.devices:
        return None
    largest = max(fit.layout.devices)
    return (f"{devices} devices not measured (largest: {largest}); assumes devices as fast as the measured ones, "
            f"the host's cost growing with devices as measured, and a ring all-reduce over the same links")


def bottleneck(terms: Terms) -> str:
    """What bounds the step, from its terms: host-bound, communication-bound or compute-bound."""
    shares = {"host-bound": terms.host, "communication-bound": terms.exposed_comm,
              "compute-bound": terms.arithmetic}
    name = max(shares, key=lambda share: shares[share])
    parts = (f"host {100 * terms.host / terms.step:.0f} %, arithmetic {100 * terms.arithmetic / terms.step:.0f} %"
             + (f", exposed all-reduce {100 * terms.exposed_comm / terms.step:.0f} %" if terms.comm else ""))
    return f"{name} ({parts})"
