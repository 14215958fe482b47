"""The checks that keep verification's cost flat in the model's size (see xbench.results.checks
for the ones that train).

Verify trains a reduced instance of each model (the family's `verification_dims` as caps: 2
transformer blocks on 64 tokens, 32 x 32 images) through every check of `checks`, and where
that instance is smaller than the model, probes the model itself once per program and device
count: the loss and the gradient at the common start, on a few samples per device, in the
precision the program is verified in, the gradient kept as per-tensor summaries
(`xbench.wire.SUMMARY_COLUMNS`). What depends on size (the same code path at full
width and depth, the layout of the weights, a layer past the reduced depth) shows there as an
error of order 1; what needs many steps and a float64 referee (formulas, rounding, the ten-step
trajectory) was checked on the reduced instance.

Each device's own share of the batch is checked at both sizes: the loss each device computed on
its slice before the all-reduce must equal the same program's loss of that slice on one device
(`ReportsShardLosses`). A program that computed the whole batch on one device and copied the
result to the others passes every other check; here each of its devices reports the whole
batch's loss instead of its slice's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

import numpy as np

from xbench.models.model_spec import ModelSpec
from xbench.results.checks import (
    ACROSS,
    FLOAT64_TOLERANCES,
    N_EQUALS_1,
    TOLERANCES,
    VERIFY_STEPS,
    Check,
    Key,
    comparisons,
    reduced_dims,
    verification_batch,
    verification_model,
)
from xbench.stats import relative_errors
from xbench.wire import SUMMARY_COLUMNS, Reference

FULL_SIZE_REPLICATE = 10  # a full-size probe's trial id ends in "/r10"
FULL_SIZE_PER_DEVICE = 2  # samples per device at the most devices (1 device takes them all)
# Per-tensor error (column differences over the tensor's norm) allowed at full size. The
# probe looks for faults of order 1 (a skipped or extra layer, a transposed or mis-sized
# weight, the whole batch on one device), not for formulas, which the reduced instance checks
# at fp32's tolerances; so rounding gets plenty of room: 1e-3 in fp32 (12 GPT-2 blocks of
# 1,024 tokens reorder sums of up to 10^5 terms), 1e-6 in float64, and in a 16-bit precision
# 0.25 (bf16 alone moves a small tensor's gradient by percent).
FULL_SIZE_TOLERANCES = {"fp64": 1e-6, "fp32": 1e-3, "tf32": 1e-2, "bf16": 0.25, "fp16": 0.25}
SHARD_TOLERANCES = {"fp64": FLOAT64_TOLERANCES["gradients"], "fp32": TOLERANCES["gradients"], "tf32": 1e-3,
                    "bf16": 1e-2, "fp16": 1e-2}

SUM, ABSOLUTE_SUM = SUMMARY_COLUMNS.index("sum"), SUMMARY_COLUMNS.index("absolute sum")
NOT_PROBED = "full size not probed"  # the reason of a probe left out before it ran (it would not fit)
FULL_SIZE = "full size: "  # the start checks' names, so prefixed
SHARES = "each device's share"  # its slice's loss on N devices = the slice's on 1


def full_size_model(model: ModelSpec, devices: Sequence[int]) -> ModelSpec | None:
    """The model as the full-size probe runs it: full dims, dropout off, `FULL_SIZE_PER_DEVICE`
    samples per device at the most devices; None where the reduced instance is the model."""
    if not model.dims or reduced_dims(model) == dict(model.dims):
        return None
    batch = verification_batch(devices, minimum=FULL_SIZE_PER_DEVICE * max(devices))
    return replace(model, dropout=0.0, batch_sizes=(batch,))


def is_full_size(trial: Mapping[str, object]) -> bool:
    """Whether a stored verification trial is a full-size probe."""
    return trial.get("replicate") == FULL_SIZE_REPLICATE


def full_size_checks(probes: Mapping[Key, Reference], precisions: Mapping[Key, str], reference_backend: str,
                     per_device_statistics: Collection[str] = ()) -> list[Check]:
    """The probes compared like the reduced instance's start (`checks.comparisons`): N
    devices against 1 of the same program, and each program against the reference backend,
    the tolerance the looser of the two programs' precisions'."""
    checks = []
    for me, probe in probes.items():
        backend, devices, model = me
        for name, other in comparisons(me, reference_backend, per_device_statistics):
            base = probes.get(other)
            if base is None or name not in (N_EQUALS_1, ACROSS):
                continue
            tolerance = max(FULL_SIZE_TOLERANCES[precisions[me]], FULL_SIZE_TOLERANCES[precisions[other]])
            error, at = summary_error(probe, base)
            blamed, keys = ((backend,), (me,)) if name == N_EQUALS_1 else ((backend, reference_backend), (me, other))
            checks.append(Check(FULL_SIZE + name, f"{model}: {backend} d{devices} vs {other[0]} d{other[1]}{at}",
                                blamed, error, error, error, tolerance, keys=keys))
    return checks



def summary_error(probe: Reference, base: Reference) -> tuple[float, str]:
    """The worst per-tensor error between two probes (and the loss's), and where it is."""
    mine, theirs = probe.summaries, base.summaries
    loss = abs(probe.loss - base.loss) / max(abs(base.loss), 1e-30)
    if mine is None or theirs is None or mine.shape != theirs.shape:
        if mine is not None and theirs is not None and len(mine) == len(theirs):
            return float("inf"), f" (summaries of {mine.shape[1]} and {theirs.shape[1]} columns: rerun both)"
        return float("inf"), f" (gradient shapes differ: {_rows(mine)} against {_rows(theirs)} tensors)"
    per_tensor = np.max(np.abs(mine - theirs) / _yardsticks(theirs), axis=1)
    per_tensor[(theirs[:, 0] == 0) & (np.max(np.abs(mine), axis=1) == 0)] = 0.0
    worst = int(np.argmax(per_tensor)) if per_tensor.size else 0
    if per_tensor.size == 0 or loss >= per_tensor[worst]:
        return float(loss), " (the loss)"
    return float(per_tensor[worst]), f" (tensor {worst})"


def _yardsticks(summaries: np.ndarray) -> np.ndarray:
    """What each summary's difference is divided by: the tensor's norm, but for the sum (and
    the absolute sum) the absolute sum. A gradient whose terms cancel (a weight that feeds a
    normalisation sums to about 0) has a sum that rounding moves relative to its terms'
    magnitudes, not to their norm: GPT-2 small's full-size probe in bf16 against fp32, the same
    program, moved such sums by 2.4 x the norm. Summaries of four columns (recorded before the
    absolute sum) divide everything by the norm."""
    norm = np.maximum(summaries[:, :1], 1e-30)
    scales = np.repeat(norm, summaries.shape[1], axis=1)
    if summaries.shape[1] > ABSOLUTE_SUM:
        scales[:, [SUM, ABSOLUTE_SUM]] = np.maximum(summaries[:, ABSOLUTE_SUM:ABSOLUTE_SUM + 1], 1e-30)
    return scales


def _rows(summaries: np.ndarray | None) -> int:
    return 0 if summaries is None else len(summaries)


def shard_checks(runs: Mapping[Key, Reference], precisions: Mapping[Key, str], tier: str) -> list[Check]:
    """For each N-device run that reported its devices' slice losses: against the same
    program's losses of the same N slices on one device."""
    checks = []
    for me, run in runs.items():
        backend, devices, model = me
        base = runs.get((backend, 1, model))
        mine = run.shard_losses.get(devices)
        if devices == 1 or base is None or mine is None or devices not in base.shard_losses:
            continue
        errors = relative_errors([np.asarray(mine)], [np.asarray(base.shard_losses[devices])])
        checks.append(Check(SHARES, f"{model}{tier}: {backend} d{devices} vs d1, {devices} slices", (backend,),
                            *errors, SHARD_TOLERANCES[precisions[me]], keys=(me,)))
    return checks


def unreported_shares(runs: Mapping[Key, Reference]) -> set[str]:
    """The programs with N-device runs that reported no slice losses (their shares went
    unchecked)."""
    return {key[0] for key, run in runs.items() if key[1] > 1 and key[1] not in run.shard_losses}


def sizes_checked(model: ModelSpec, devices: Sequence[int], precision: str) -> str:
    """In words, at which size and precision verify checked `model`: what it trained and what it
    probed at full size (`precision`: the family's verification precision)."""
    counts = sorted(set(devices) | {1})
    trained = verification_model(model, counts)
    full = full_size_model(model, counts)
    referee = "float64 throughout" if precision == "fp64" else f"{precision}, float64 referee"
    if full is None:
        return (f"{model.name}: trajectory {VERIFY_STEPS} steps at full size, batch {trained.batch_sizes[0]}, "
                f"{referee}")
    dims = dict(model.dims)
    changed = {key: value for key, value in reduced_dims(model).items() if value != dims[key]}
    shrunk = ", ".join(f"{key} {value}" for key, value in changed.items())
    full_dims = ", ".join(f"{key} {dims[key]}" for key in changed)
    return (f"{model.name}: trajectory {VERIFY_STEPS} steps on a reduced instance ({shrunk}), batch "
            f"{trained.batch_sizes[0]}, {referee}; full size ({full_dims}): initial loss and per-tensor gradient "
            f"summaries, batch {full.batch_sizes[0]}, {precision}")
