"""Proof of identical work: same start, same gradients, a real all-reduce.

Each backend runs its own data-parallel program from the core's weights, with dropout off
and strict fp32, and reports (through the optional capability methods `gradients`, `train`
and `replica_weights`, see `xbench.contract`):

- the loss and the gradient its step applies after the all-reduce, at the initial weights;
- the losses of `VERIFY_STEPS` training steps and the weights on every replica afterwards.

The checks then compare, within tolerances derived from fp32 rounding:

1. N devices against 1 device of the same backend (a missing all-reduce, or one that sums
   instead of averaging, shows here: the gradient is off by O(1));
2. each backend's initial loss and gradients against the reference backend's;
3. each backend's loss curve and final weights, on every device count, against the
   reference backend on 1 device, within a tolerance widened where fp32 rounding alone moves
   the ten-step trajectory (each program's float64 "referee" run, `floors`), and the float64
   runs against each other at float64 tolerances (`referee_checks`);
4. the replicas' weights against each other after training (they drift apart when
   gradients are not all-reduced).

A program that runs only in a lower precision (`Variant.precisions`, e.g. a fused attention
kernel that takes bf16 alone) runs in that precision instead, and is checked against its
backend's float64 run within a tolerance from bf16 rounding measured on the backend's own
program (`precision_checks`, see LOW_PRECISION_FACTOR).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from xbench.contract import backend_of_implementation
from xbench.experiment import PRECISIONS
from xbench.models.model_spec import ModelSpec
from xbench.stats import relative_errors
from xbench.wire import Reference

VERIFY_STEPS = 10
VERIFY_BATCHES = VERIFY_STEPS  # distinct batches, so every step sees new data

# fp32 unit roundoff u = 2**-24 = 6.0e-8. Reordering a sum of K terms (a split batch, another
# matmul kernel) moves a result by about sqrt(K)*u relative in practice and K*u at worst; with
# K up to about 1e3 that is 2e-6 to 6e-5, so gradients get 1e-4. Ten Adam steps divide each
# gradient by its own running RMS, which amplifies such differences where a gradient is near
# zero; correct backends measured at most 4e-6 after ten steps (seed models, CPU), so training
# gets 1e-4: tight enough to catch another Adam formula (one framework's own placement of eps gave
# 8e-4 and 3e-2). Broken all-reduces give gradient errors of order 1 (0.5 for a missing
# reduction on 2 devices, 1.0 for a sum instead of a mean). Replicas must agree exactly.
TOLERANCES = {
    "gradients": 1e-4,  # loss and gradients, normwise relative
    "training": 1e-4,  # loss curve and final weights after VERIFY_STEPS steps
    "replicas": 1e-6,  # replicas should hold identical weights
}
# Families whose fp32 gradients cannot be compared at 1e-4 are verified in float64 (the
# family's `verification_precision`): ResNets. Measured on resnet18 at 32 x 32, batch 32: the
# fp32 gradients of the three built-in backends are 0.5-1.9 % from a float64 referee, the
# ReLU kinks and BatchNorm's near-cancelling scale and bias gradients (see
# `verification_model`); Adam then turns near-zero gradient noise into steps of +-lr. In
# float64 (u = 1.1e-16) the same arguments give about 1e-12, so 1e-8 leaves room and still
# sees a BatchNorm epsilon of 1e-3 instead of 1e-5 by orders of magnitude.
FLOAT64_TOLERANCES = {"gradients": 1e-8, "training": 1e-8, "replicas": 1e-12}
VERIFY_PRECISIONS = ("fp32", "fp64")
# Ten steps can amplify rounding far beyond 1e-4 in a ReLU network: after the first (sign-like)
# Adam step a few pre-activations lie within rounding of zero, and the side each program rounds
# them to switches whole rows of the next gradient. Measured on a 3 x 1,400 MLP at lr 1e-3
# (seed 0, CPU): initial gradients of jax, tf and torch within 3e-7 of a float64 computation,
# yet after ten steps 7.4e-3 (jax), 9.5e-4 (tf) and 2.4e-6 (torch) from it, and numpy's own
# fp32 program 7.4e-3; widths 64-1,024 stayed below 8e-6, a 3 x 640 at seed 1 reached 7e-4.
# Correct programs then fail a fixed 1e-4. So each program also trains once in float64 on 1
# device (its referee, `referee_trials`); its floor is ||fp32 - fp64|| of the ten-step loss curve
# and weights, rounding's own effect on this model, and the ten-step tolerance of two programs
# that both have a floor is at least FLOOR_FACTOR x the sum of their floors (their differences
# from exact arithmetic add up; 2 x for a discrete kink the referee run may not have hit). A
# formula difference shows in a program's fp32 and float64 runs alike, so it does not widen its
# own floor, and the float64 runs are compared with each other at FLOAT64_TOLERANCES
# (`referee_checks`; jax, tf and torch agree to 1e-15 in gradients and 8e-15 after ten steps on
# the seed MLPs, transformer-tiny, lstm-small and 3 x 1,400 on the CPU, jax and torch to 1.7e-15
# and 1.4e-14 on an H200); two programs' pair is widened only if float64 checks compared both
# their runs, so a widened pair is always covered by them (the same program on N devices and on
# 1 uses its own floor: it cannot differ in formula from itself). What a floor can still hide:
# a difference in a program's fp32 training path alone widens its own floor (the fp32
# initial-gradient check, never widened, still sees precision leaks in the step). Where a floor
# stays below 1e-4 / FLOOR_FACTOR (the seed models: about 1e-6) nothing changes.
FLOOR_FACTOR = 2.0
REFEREE_PRECISION = "fp64"
REFEREE_REPLICATE = 1  # the referee's trial id ends in "/r1": it must not overwrite the fp32 run's arrays
# A program that runs only in a lower precision than its family is verified in (a variant
# whose `precisions` are ("bf16",): cuDNN's fused attention) runs the checks in the first
# precision it lists, against its backend's float64 run of the as-written data-parallel
# program on 1 device (R_f64: the referee, or for a family verified in float64 that run
# itself). Its distance from exact arithmetic is measured where it can be: the backend's
# as-written program in the same precision on 1 device (`precision_reference_trials`), whose
# normwise distance from R_f64 is the precision's floor, once for the initial loss and
# gradients and once for the ten steps. bf16 (u = 2**-8 = 3.9e-3, 65,536 x fp32's) moves
# gradients by up to percent: measured (CPU, seed 0), jax's bf16 program is 2.9e-2 from
# float64 in the medium MLP's initial loss and gradients and 6.8e-3 after ten steps, 1.9e-3
# and 2.8e-3 on transformer-tiny (a numpy MLP that rounds what a mixed-precision program holds
# in bf16, `tests.support.fakes.NumpyMlpBackend`, gives the same 2.9e-2). So nothing of the fp32
# arguments above survives but their form: the tolerance of a low-precision program is at
# least LOW_PRECISION_FACTOR x its backend's floor. Its own floor is unknown (it cannot run
# the precision it is verified in) and is taken to be about its backend's: what dominates a
# mixed-precision program's rounding is the casts of inputs, weights and activations to bf16
# at the layer boundaries the framework's policy sets, which every program of the model makes
# at the same places, while accumulation is fp32 in both and a fused kernel keeps its
# intermediates in fp32 or rounds them no more often than the unfused ops do (flash attention
# rounds the probabilities to bf16 before P.V, as the unfused program's bf16 matmul does).
# Measured: jax's `jnp` program, another implementation of the same models, checked as a bf16
# program against jax's floors, was 0.69-1.0 x them on 1 and 2 devices. So 2 x its backend's
# floor, room for a program that rounds as much again elsewhere (as large a second error
# doubles the distance at worst, sqrt(2) x if independent), times FLOOR_FACTOR for a ReLU or
# max kink (with u = 3.9e-3 far more pre-activations lie within rounding of zero than in
# fp32): 4 x. What the check still sees: anything over 4 floors, i.e. a missing or summed
# all-reduce (0.5 and 1.0 off on 2 devices), a missing attention scale or mask; a gradient
# scaled by 10 % only where the floor is below 2.5e-2 (transformer-tiny: tolerance 7.6e-3; not
# the medium MLP: 1.1 x was 9.4e-2 from float64 in the numpy one, inside 4 x 2.9e-2); never an 8e-4
# formula difference such as another Adam epsilon. No separate "N devices = 1 device" check:
# each device count is compared with float64, and a missing all-reduce is 0.5 off. A floor so
# large that its tolerance would exceed LOW_PRECISION_MAX_TOLERANCE (so that a missing
# all-reduce could pass) is not trusted, nor is a run that is not finite or a float64 run that
# does not start where the fp32 one does (`_distrust`): the program then fails, with the
# reason, instead of passing.
LOW_PRECISION_FACTOR = 2 * FLOOR_FACTOR
LOW_PRECISION_MAX_TOLERANCE = 0.25  # half a missing all-reduce's error on 2 devices
# Each low precision's reference run gets a replicate number of its own ("/r4" for bf16), so
# that neither it nor the referee ("/r1") overwrites the verified run's arrays ("/r0").
PRECISION_REFERENCE_REPLICATES = {precision: 2 + i for i, precision in enumerate(PRECISIONS)}


@dataclass(frozen=True)
class Check:
    check: str
    subject: str  # what was compared with what
    backends: tuple[str, ...]  # the backends a failure implicates
    max_abs: float
    max_rel: float
    norm_rel: float
    tolerance: float
    keys: tuple = ()  # the (backend, devices, model) results compared; the first is the one tested
    floor: float | None = None  # the rounding floor that widened the tolerance (see FLOOR_FACTOR)

    @property
    def passed(self) -> bool:
        return bool(math.isfinite(self.norm_rel) and self.norm_rel <= self.tolerance)


def is_referee(trial: Mapping[str, Any]) -> bool:
    """Whether a stored trial is a referee (`referee_trials`), not a verified program."""
    return trial.get("precision") == REFEREE_PRECISION and trial.get("replicate") == REFEREE_REPLICATE


def is_precision_reference(trial: Mapping[str, Any]) -> bool:
    """Whether a stored verification trial is a low precision's reference run
    (`precision_reference_trials`), not a verified program."""
    return trial.get("replicate") == PRECISION_REFERENCE_REPLICATES.get(trial.get("precision", ""), -1)


def start_state(ref: Reference) -> list[np.ndarray]:
    """What the start checks compare: the loss and the gradients from the common start."""
    return [np.asarray(ref.loss), *ref.gradients]


def trajectory(ref: Reference) -> list[np.ndarray]:
    """What the ten-step check compares: the loss curve and replica 0's final weights."""
    return [np.asarray(ref.losses), *ref.replicas[0]]


def rounding_floors(refs: Mapping[Key, Reference], referees: Mapping[tuple[str, str], Reference]
                    ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], str]]:
    """(implementation, model) -> normwise distance of its fp32 ten steps from its float64
    ones, and (implementation, model) -> why its float64 run gives no floor: it must have run
    in float64, stayed finite like its fp32 run (a run that blows up must fail its checks, not
    widen them), and start from the fp32 run's loss and gradients (the same model)."""
    floors, rejected = {}, {}
    for (name, model), referee in referees.items():
        fp32 = refs.get((name, 1, model))
        if fp32 is not None:
            why = _distrust(fp32, referee)
            if why:
                rejected[(name, model)] = why
            else:
                floors[(name, model)] = relative_errors(trajectory(fp32), trajectory(referee))[2]
    return floors, rejected


def _distrust(fp32: Reference, referee: Reference) -> str | None:
    """Why a float64 run cannot measure the fp32 run's floor, or None."""
    if any(np.asarray(a).dtype != np.float64 for a in [*referee.gradients, *referee.replicas[0]]):
        return "its float64 run returned other than float64 arrays"
    for run, ref in (("fp32", fp32), ("float64", referee)):
        if not _finite(ref):
            return f"its {run} run is not finite"
    start = relative_errors(start_state(fp32), start_state(referee))[2]
    return f"its float64 gradients are {start:.1e} from its fp32 ones" if start > TOLERANCES["gradients"] else None


def distrust_float64(run: Reference) -> str | None:
    """Why a run verified in float64 (a family's `verification_precision`) cannot stand for
    exact arithmetic, or None: it must be float64 and finite."""
    if any(np.asarray(a).dtype != np.float64 for a in [*run.gradients, *run.replicas[0]]):
        return "its float64 run returned other than float64 arrays"
    return None if _finite(run) else "its float64 run is not finite"


def _finite(ref: Reference) -> bool:
    return all(np.all(np.isfinite(a)) for a in [*start_state(ref), *trajectory(ref)])


def verification_model(model: ModelSpec, devices: Sequence[int]) -> ModelSpec:
    """The model as verify trains it: dropout off, one batch size every device count divides
    (32, or `verification_per_device` times the most devices where the family says so), and
    the family's `verification_dims` as caps (`reduced_dims`). The CNN's: 32 x 32 images, two
    blocks a stage, 8 per device (at 4 per device, ten steps in float64 amplify rounding from
    3e-14 to 4e-5). Small because a ReLU network's gradient jumps where an activation lies
    within rounding of zero, and two correct fp32 programs then differ by percent: at about 1e-6 chance per
    activation, a ResNet-18 batch of 32 at 32 x 32 (1.5 M activations) hits one about half
    the time (measured: 1.8e-2 between two built-in backends, from one activation at 4.9e-7),
    ResNet-50 at 224 x 224 always."""
    fam = model.kind
    dims = tuple(sorted(reduced_dims(model).items())) if model.dims else model.dims
    per_device = getattr(fam, "verification_per_device", None)
    batch = verification_batch(devices, minimum=int(per_device) * max(devices) if per_device else 32)
    return replace(model, dropout=0.0, batch_sizes=(batch,), dims=dims)


def reduced_dims(model: ModelSpec) -> dict[str, int]:
    """The model's dims with the family's `verification_dims` as caps, then its
    `verification_reduce` where it has one: the instance verify trains (a model they do not
    shrink is trained at full size)."""
    caps = dict(getattr(model.kind, "verification_dims", {}) or {})
    dims = {key: min(value, caps.get(key, value)) for key, value in model.dims}
    reduce = getattr(model.kind, "verification_reduce", None)
    return dict(reduce(dims)) if reduce and dims else dims


def verification_precision(model: ModelSpec) -> str:
    """"fp32", or "fp64" for a family that says so (`verification_precision`; see
    `FLOAT64_TOLERANCES`). A backend asked for "fp64" runs everything in float64."""
    precision = getattr(model.kind, "verification_precision", "fp32")
    return precision if precision in VERIFY_PRECISIONS else "fp32"


def verification_batch(devices: Sequence[int], minimum: int = 32) -> int:
    """The smallest multiple of every device count that is at least `minimum`."""
    step = math.lcm(*devices)
    return step * math.ceil(minimum / step)


Key = tuple[str, int, str]  # (implementation: backend, variant, program; devices; model)


N_EQUALS_1 = "gradients: N devices = 1 device"
ACROSS = "initial loss and gradients across backends"
TEN_STEPS = f"{VERIFY_STEPS} steps: losses and final weights"


def comparisons(key: Key, reference_backend: str, per_device_statistics: Collection[str] = ()
                ) -> list[tuple[str, Key]]:
    """The checks that compare result `key` with another result, by name, with that result's
    key, whether or not either exists: what `run_checks` runs when both do, and what is lost
    when one is missing (`lost_comparisons`). (The replicas check needs only `key` itself.)"""
    backend, devices, model = key
    own_count = model in per_device_statistics
    base = (reference_backend, devices if own_count else 1, model)
    planned = []
    if devices > 1 and not own_count:
        planned.append((N_EQUALS_1, (backend, 1, model)))
    if (devices == 1 or own_count) and backend != reference_backend:
        planned.append((ACROSS, base))
    if key != base:
        planned.append((TEN_STEPS, base))
    return planned


def run_checks(refs: Mapping[Key, Reference], reference_backend: str,
               per_device_statistics: Collection[str] = (), float64: Collection[str] = (),
               floors: Mapping[tuple[str, str], float] | None = None,
               compared: Collection[tuple[str, str]] = ()) -> list[Check]:
    """All four kinds of check over whatever references exist. `floors` maps (implementation,
    model) to its rounding floor (`rounding_floors`), which widens the fp32 ten-step tolerance
    of a pair that both have one (see FLOOR_FACTOR): the same program on N and 1 devices, or
    two programs whose float64 runs float64 checks compared (`compared`, see
    `compared_in_float64`); otherwise the fixed tolerance holds. Models named in
    `per_device_statistics` normalise over each device's share of the batch (BatchNorm), so
    their N-device arithmetic differs from 1 device's by design: they are compared with the
    reference backend at the same device count, and skip "N devices = 1 device" (the
    replicas check and the other backends still catch a missing or summed all-reduce).
    Models named in `float64` ran in float64 and get `FLOAT64_TOLERANCES`."""
    checks: list[Check] = []
    for me, ref in refs.items():
        backend, devices, model = me
        tolerances = FLOAT64_TOLERANCES if model in float64 else TOLERANCES
        tag = f"{model}: {backend} d{devices}"
        for name, other in comparisons(me, reference_backend, per_device_statistics):
            base = refs.get(other)
            if base is None:
                continue
            subject = f"{tag} vs {other[0]} d{other[1]}"
            if name == N_EQUALS_1:
                checks.append(_check(name, subject, (backend,), start_state(ref),
                                     start_state(base), tolerances["gradients"], (me,)))
            elif name == ACROSS:
                checks.append(_check(name, subject, (backend, reference_backend), start_state(ref),
                                     start_state(base), tolerances["gradients"], (me, other)))
            else:
                floor = _floor(floors or {}, compared, model, backend, reference_backend)
                tolerance = tolerances["training"] if floor is None else max(tolerances["training"],
                                                                               FLOOR_FACTOR * floor)
                checks.append(replace(_check(name, subject, tuple(dict.fromkeys((backend, reference_backend))),
                                             trajectory(ref), trajectory(base), tolerance,
                                             (me,) if backend == reference_backend else (me, other)), floor=floor))
        worst = ref.worst_replica_error()
        if worst is not None:
            checks.append(Check("replicas hold the same weights", f"{tag}: replicas 1.. vs 0", (backend,),
                                *worst, tolerances["replicas"], keys=(me,)))
    return checks


def lost_comparisons(expected: Collection[Key], present: Collection[Key], reference_backend: str,
                     per_device_statistics: Collection[str] = ()
                     ) -> tuple[dict[Key, list[tuple[str, Key]]], dict[Key, list[tuple[str, Key]]]]:
    """The comparisons that missing results took away, among the `expected` results (those
    whose trials ran or should have: not skipped, not unsupported) of which only `present`
    exist. Returns (untested, unpartnered): for each present result, the checks
    (`comparisons`) that would have tested it against a missing one, as (check, missing key);
    and for each present result, the checks in which a missing result would have been tested
    against it. A present result that lost a check of its own is not verified; one that lost
    only its partners is, if anything else compared it (`xbench.run.verification`)."""
    untested: dict[Key, list[tuple[str, Key]]] = {}
    unpartnered: dict[Key, list[tuple[str, Key]]] = {}
    for key in expected:
        for name, other in comparisons(key, reference_backend, per_device_statistics):
            if other not in expected:
                continue
            if key in present and other not in present:
                untested.setdefault(key, []).append((name, other))
            elif other in present and key not in present:
                unpartnered.setdefault(other, []).append((name, key))
    return untested, unpartnered


def precision_floors(references: Mapping[tuple[str, str, str], Reference],
                     float64_runs: Mapping[tuple[str, int, str], Reference]
                     ) -> tuple[dict[tuple[str, str, str], tuple[float, float]], dict[tuple[str, str, str], str]]:
    """(backend, model, precision) -> the floors (initial loss and gradients, ten steps) of its
    as-written program's run in that precision (`precision_reference_trials`) against its
    float64 run on 1 device (`float64_runs`, trusted already), and -> why a run gives none:
    missing float64 run, not finite, or so far from float64 that its tolerance would exceed
    LOW_PRECISION_MAX_TOLERANCE (see LOW_PRECISION_FACTOR)."""
    floors, rejected = {}, {}
    for (backend, model, precision), ref in references.items():
        exact = float64_runs.get((backend, 1, model))
        if exact is None:
            continue  # why is the float64 run's business (`precision_checks` says it)
        if not _finite(ref):
            rejected[(backend, model, precision)] = f"its {precision} run is not finite"
            continue
        found = (relative_errors(start_state(ref), start_state(exact))[2],
                 relative_errors(trajectory(ref), trajectory(exact))[2])
        worst = max(found)
        if not LOW_PRECISION_FACTOR * worst <= LOW_PRECISION_MAX_TOLERANCE:
            rejected[(backend, model, precision)] = (
                f"its {precision} run is {worst:.1e} from its float64 one, more than {precision} rounding may "
                f"move it ({LOW_PRECISION_MAX_TOLERANCE / LOW_PRECISION_FACTOR:.2g}): a tolerance of "
                f"{LOW_PRECISION_FACTOR:g} x that could not see a missing all-reduce")
        else:
            floors[(backend, model, precision)] = found
    return floors, rejected


LowKey = tuple[str, int, str, str]  # (implementation, devices, model, precision)


def precision_checks(programs: Mapping[LowKey, Reference], float64_runs: Mapping[tuple[str, int, str], Reference],
                     floors: Mapping[tuple[str, str, str], tuple[float, float]],
                     no_floor: Mapping[tuple[str, str, str], str],
                     no_float64: Mapping[tuple[str, int, str], str], float64: Collection[str] = (),
                     per_device_statistics: Collection[str] = ()) -> tuple[list[Check], dict[LowKey, str]]:
    """Each low-precision program's run (`programs`, see LOW_PRECISION_FACTOR) on each device
    count against its backend's float64 run (`float64_runs`: (backend, devices, model), the
    as-written data-parallel program on 1 device, or on as many devices as the program where
    the family normalises per device), within max(the fixed tolerance, LOW_PRECISION_FACTOR x
    the floor of its backend's run in that precision), for the initial loss and gradients and
    for the ten steps; and its replicas against each other. A check blames the program alone:
    the float64 run it is compared with was trusted first. Returns the checks, and for each
    program run that could not be checked, why: its backend's float64 run or floor is missing
    (`no_float64`, `no_floor`) or untrusted; such a program must not pass."""
    checks, unchecked = [], {}
    for me, ref in programs.items():
        name, devices, model, precision = me
        backend = backend_of_implementation(name)
        tolerances = FLOAT64_TOLERANCES if model in float64 else TOLERANCES
        exact_key = (backend, devices if model in per_device_statistics else 1, model)
        exact, floor = float64_runs.get(exact_key), floors.get((backend, model, precision))
        tag = f"{model}: {name} d{devices}"
        worst = ref.worst_replica_error()
        if worst is not None:
            checks.append(Check("replicas hold the same weights", f"{tag}: replicas 1.. vs 0", (name,),
                                *worst, TOLERANCES["replicas"], keys=(me,)))
        if exact is None:
            why = no_float64.get(exact_key) or f"{backend} has no float64 run of {model} on d{exact_key[1]}"
            unchecked[me] = f"not verified in {precision}: {why}"
            continue
        if floor is None:
            why = (no_floor.get((backend, model, precision))
                   or f"{backend} has no {precision} run of {model} to measure {precision} rounding with")
            unchecked[me] = f"not verified in {precision}: {why}"
            continue
        against = f"{tag} vs {exact_key[0]} d{exact_key[1]}, float64"
        keys = (me, (*exact_key, REFEREE_PRECISION))
        for check, actual, expected, kind, measured in (
                (f"{precision}: initial loss and gradients vs float64", start_state(ref),
                 start_state(exact), "gradients", floor[0]),
                (f"{precision}: {VERIFY_STEPS} steps vs float64", trajectory(ref), trajectory(exact), "training",
                 floor[1])):
            tolerance = max(tolerances[kind], LOW_PRECISION_FACTOR * measured)
            checks.append(replace(_check(check, against, (name,), actual, expected, tolerance, keys), floor=measured))
    return checks, unchecked


def referee_checks(referees: Mapping[tuple[str, str], Reference], reference_backend: str) -> list[Check]:
    """The accepted float64 runs ((implementation, model) -> run) against each other at
    float64 tolerances: the formula check that a widened fp32 ten-step tolerance can no longer
    be (see FLOOR_FACTOR). Every pair of backends' own programs (data-parallel, as written),
    so that a third clears a correct one (`failed_backends`); each other program or variant
    against its backend's own, or against every backend's where that has none."""
    checks = []
    for model in dict.fromkeys(model for _, model in referees):
        names = sorted((name for name, m in referees if m == model), key=lambda n: (n != reference_backend, n))
        own = [n for n in names if backend_of_implementation(n) == n]
        pairs = [(a, b) for i, b in enumerate(own) for a in own[i + 1:]]
        for name in (n for n in names if n not in own):  # with its backend's run, else with every backend's
            backend = backend_of_implementation(name)
            pairs += [(name, backend)] if backend in own else [(name, o) for o in own]
        for name, base in pairs:
            checks += _float64_pair(model, name, referees[(name, model)], base, referees[(base, model)])
    return checks


def _float64_pair(model: str, name: str, ref: Reference, base_name: str, base: Reference) -> list[Check]:
    against = f"{model}: {name} d1 vs {base_name} d1, float64"
    keys = ((name, 1, model, REFEREE_PRECISION), (base_name, 1, model, REFEREE_PRECISION))
    return [_check("float64: initial loss and gradients", against, (name, base_name),
                   start_state(ref), start_state(base), FLOAT64_TOLERANCES["gradients"], keys),
            _check(f"float64: {VERIFY_STEPS} steps: losses and final weights", against, (name, base_name),
                   trajectory(ref), trajectory(base), FLOAT64_TOLERANCES["training"], keys)]


def compared_in_float64(checks: Sequence[Check]) -> set[tuple[str, str]]:
    """(implementation, model) whose float64 run some float64 check compared."""
    return {(key[0], key[2]) for c in checks if c.check.startswith("float64:") for key in c.keys}


def _floor(floors: Mapping[tuple[str, str], float], compared: Collection[tuple[str, str]], model: str,
           tested: str, reference: str) -> float | None:
    """The sum of the two programs' floors, or None unless both have one and, for two
    different programs, float64 checks compared both."""
    keys = [(tested, model), (reference, model)]
    if not all(key in floors for key in keys) or (tested != reference and not all(key in compared for key in keys)):
        return None
    return sum(floors[key] for key in keys)


def _check(name: str, subject: str, backends: tuple[str, ...], actual, expected, tolerance: float,
           keys: tuple) -> Check:
    return Check(name, subject, backends, *relative_errors(actual, expected), tolerance, keys=keys)


def failed_backends(checks: Sequence[Check]) -> set[str]:
    """The backends (implementations) the failed checks implicate. A check within one
    backend blames it. A disagreement between two blames both, unless one of the two results
    compared fails a check of its own (that one is then the culprit), or one of them passes
    the same check, on the same result, against a third backend (it is then cleared; a
    program or variant of either backend shares its code, so it clears nobody)."""
    own_failures = {c.keys[0] for c in checks if len(c.backends) == 1 and not c.passed and c.keys}
    blamed = {c.backends[0] for c in checks if len(c.backends) == 1 and not c.passed}
    for check in checks:
        if check.passed or len(check.backends) == 1:
            continue
        pair = set(check.backends)
        culprits = {key[0] for key in check.keys if key in own_failures}
        blamed.update(culprits or (pair - _cleared(check, checks)) or pair)
    return blamed


def _cleared(failed: Check, checks: Sequence[Check]) -> set[str]:
    """Who of a failed two-backend check passes the same check on the same result against
    a backend that is neither of the two."""
    pair = {backend_of_implementation(b) for b in failed.backends}
    return {name for name, key in zip(failed.backends, failed.keys)
            for c in checks if c.passed and c.check == failed.check and key in c.keys
            and all(backend_of_implementation(b) not in pair for b in c.backends if b != name)
            and len(c.backends) == 2}
