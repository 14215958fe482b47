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
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xbench.results.fitting import error_summary, load_runs, predict_rerun, validate

MEDIAN_TARGET, P90_TARGET = 0.10, 0.25


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of one machine")
    parser.add_argument("--rerun", type=Path, help="another run of the same sweep, predicted whole")
    args = parser.parse_args()
    measured = load_runs(args.runs)
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


if __name__ == "__main__":
    sys.exit(main())
