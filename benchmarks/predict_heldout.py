"""Does the fitted step model predict configurations it never saw?

Fits on part of one or more sweeps (`xbench sweep`) and predicts the held-out configurations:
each per-device batch strictly inside a model's measured range (all device counts at it), and
each model strictly inside its family's measured sizes. Prints every error, then the median
and 90th percentile of |error| per scheme against the targets (10 % and 25 %); exit 1 when a
target is missed.

    python benchmarks/predict_heldout.py results/<sweep> [more sweeps of the same machine]
    python benchmarks/predict_heldout.py results/<sweep A> --rerun results/<sweep B>

With --rerun, the fit on the first runs also predicts every configuration of another run of
the same sweep (scheme "rerun"): the error a user meets when measuring what the fit promised.

With --fit-devices N, the fit sees only the configurations (and all-reduce sizes) of up to N
devices and predicts every full step measured on more, each with its 95 % interval: what
`xbench recommend` answers for a larger machine than the sweep's. Targets: median |error| at
most 15 %, every measured value inside its interval. --save-fit PATH writes that fit, for
`xbench recommend --fits PATH --devices M`.

    python benchmarks/predict_heldout.py results/<sweep on 1, 2, 4 GPUs> --fit-devices 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xbench.results.fitting import (
    HeldOut,
    Measured,
    error_summary,
    extrapolate_devices,
    fit_all,
    fit_on_devices,
    load_runs,
    predict_rerun,
    save_fits,
    validate,
)

MEDIAN_TARGET, P90_TARGET = 0.10, 0.25
EXTRAPOLATION_MEDIAN_TARGET = 0.15


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of one machine")
    parser.add_argument("--rerun", type=Path, help="another run of the same sweep, predicted whole")
    parser.add_argument("--fit-devices", type=int, metavar="N",
                        help="fit on up to N devices, predict the configurations on more")
    parser.add_argument("--save-fit", type=Path, metavar="PATH", help="with --fit-devices: write that fit")
    args = parser.parse_args()
    measured = load_runs(args.runs)
    if args.fit_devices:
        return extrapolation(measured, args.fit_devices, args.save_fit)
    held, problems = validate(measured)
    if args.rerun:
        held += predict_rerun(measured, load_runs([args.rerun]))
    print(f"machine: {measured.machine}; runs: {', '.join(measured.sources)}")
    print(f"{'held out':10} {'backend':22} {'prec':5} {'model':16} {'dev':>3} {'batch':>7} "
          f"{'predicted':>12} {'measured':>12} {'error':>8}")
    for h in sorted(held, key=lambda h: (h.scheme, h.key.label, h.model, h.devices, h.global_batch)):
        print(f"{h.scheme:10} {h.key.label:22} {h.key.precision:5} {h.model:16} {h.devices:3d} {h.global_batch:7d} "
              f"{h.predicted:12,.0f} {h.measured:12,.0f} {100 * h.error:+7.1f}%")
    for problem in problems:
        print(f"not held out: {problem}")
    if not held:
        print("nothing could be held out: a model needs 3+ per-device batches, or a family 3+ model sizes")
        return 1
    missed = False
    for scheme in [*sorted({h.scheme for h in held}), "all"]:
        # "all" is the held-out schemes; a rerun's errors are reported beside them, not judged
        mine = [h for h in held if h.scheme == scheme or (scheme == "all" and h.scheme != "rerun")]
        if not mine:
            continue
        median, p90 = error_summary(mine)
        ok = median <= MEDIAN_TARGET and p90 <= P90_TARGET
        missed |= not ok and scheme != "rerun"
        print(f"{scheme:10}: {len(mine):3d} held out, median |error| {100 * median:5.1f} % "
              f"(target {100 * MEDIAN_TARGET:.0f}), p90 {100 * p90:5.1f} % (target {100 * P90_TARGET:.0f}): "
              f"{'meets' if ok else 'MISSES'} the targets")
    return 1 if missed else 0


def extrapolation(measured: Measured, fit_devices: int, save_to: Path | None) -> int:
    held, problems = extrapolate_devices(measured, fit_devices)
    if save_to:
        smaller = fit_on_devices(measured, fit_devices)
        print(f"fit on up to {fit_devices} devices written to {save_fits(save_to, fit_all(smaller)[0], smaller)}")
    print(f"machine: {measured.machine}; runs: {', '.join(measured.sources)}; fit on up to {fit_devices} device(s)")
    print(f"{'backend':22} {'prec':5} {'model':12} {'dev':>3} {'batch':>7} {'predicted (95% interval)':>34} "
          f"{'measured':>11} {'error':>7}  inside")
    for h in sorted(held, key=lambda h: (h.key.label, h.model, h.devices, h.global_batch)):
        low, high = h.interval or (float("nan"), float("nan"))
        print(f"{h.key.label:22} {h.key.precision:5} {h.model:12} {h.devices:3d} {h.global_batch:7d} "
              f"{h.predicted:11,.0f} ({low:9,.0f}-{high:10,.0f}) {h.measured:11,.0f} {100 * h.error:+6.1f}%  "
              f"{'yes' if h.inside else 'NO'}")
    for problem in problems:
        print(f"not fitted: {problem}")
    if not held:
        print(f"nothing to predict: no full step measured on more than {fit_devices} devices by a fitted backend")
        return 1
    verdicts = [_judge(label, mine) for label, mine in _groups(held)]  # every group printed, then judged
    return 0 if all(verdicts) else 1


def _groups(held: list[HeldOut]) -> list[tuple[str, list[HeldOut]]]:
    backends = sorted({h.key.label for h in held})
    return [(b, [h for h in held if h.key.label == b]) for b in backends] + [("all", held)]


def _judge(label: str, held: list[HeldOut]) -> bool:
    median, p90 = error_summary(held)
    outside = sum(1 for h in held if not h.inside)
    ok = median <= EXTRAPOLATION_MEDIAN_TARGET and not outside
    print(f"{label:22}: {len(held):3d} predicted, median |error| {100 * median:5.1f} % "
          f"(target {100 * EXTRAPOLATION_MEDIAN_TARGET:.0f}), p90 {100 * p90:5.1f} %, {outside} outside "
          f"the interval (target 0): {'meets' if ok else 'MISSES'} the targets")
    return ok


if __name__ == "__main__":
    sys.exit(main())
