"""Does a rerun agree? Two separate `xbench compare` invocations of one spec, then `xbench diff`.

    python benchmarks/repeatability.py --out results/repeat -- --backends jax tf
    python benchmarks/repeatability.py --out $OUT/repeat -- --config configs/seed-study.toml \\
        --backends jax jax-shardmap torch

Everything after `--` goes to both `xbench compare` runs unchanged (each gets its own `--out`:
OUT/A and OUT/B); `--analyse-only` compares runs already there. Prints, per configuration, A's
and B's mean throughput, B/A, whether B's mean lies in A's 95 % interval and whether `xbench
diff` flags the configuration; then the share of configurations flagged, the share inside A's
interval, the median and largest |B/A − 1|, both wall times, and the exit status of `xbench
diff`. Targets (issue "Numbers that hold on a rerun"): flagged ≤ 10 % of configurations and
`xbench diff` exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from xbench.results.diff import diff_runs
from xbench.results.records import read_records

FLAGGED = ("regression", "improvement")
TARGET_FLAGGED = 0.10


def compare(out: Path, args: list[str]) -> tuple[float, int]:
    """One `xbench compare` in its own process; (wall seconds, exit status)."""
    started = time.monotonic()
    code = subprocess.call([sys.executable, "-m", "xbench", "compare", *args, "--out", str(out)])
    return time.monotonic() - started, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for runs A and B (must not exist)")
    parser.add_argument("--threshold", default="5%", help="xbench diff --threshold (default 5%%)")
    parser.add_argument("--analyse-only", action="store_true",
                        help="compare the runs already in OUT/A and OUT/B instead of running them")
    parser.add_argument("compare_args", nargs=argparse.REMAINDER, help="-- then the xbench compare arguments")
    options = parser.parse_args()
    args = [a for a in options.compare_args if a != "--"]
    a, b = options.out / "A", options.out / "B"
    if options.analyse_only:
        (wall_a, code_a), (wall_b, code_b) = (float("nan"), 0), (float("nan"), 0)
    else:
        wall_a, code_a = compare(a, args)
        wall_b, code_b = compare(b, args)
    diff = subprocess.run([sys.executable, "-m", "xbench", "diff", str(a), str(b), "--threshold", options.threshold],
                          capture_output=True, text=True)
    (options.out / "diff.txt").write_text(diff.stdout + diff.stderr, encoding="utf-8")
    limit = float(options.threshold.rstrip("%")) / (100 if options.threshold.endswith("%") else 1)
    result = diff_runs(read_records(a), read_records(b))
    print(f"{'configuration':44s} {'A samples/s':>13s} {'B samples/s':>13s} {'B/A':>7s}  in A's CI  flagged")
    inside, flagged, changes = 0, 0, []
    for row in result.rows:
        backend, model, devices, batch, _, _, all_reduce = row.key
        name = f"{backend}/{model}/d{devices}/b{batch}" + ("" if all_reduce else "/compute-only")
        low, high = row.a_interval
        within = low <= row.b_mean <= high
        change = row.change(limit)
        inside += within
        flagged += change in FLAGGED
        changes.append(abs(row.ratio.ratio - 1))
        print(f"{name:44s} {row.a_mean:13,.0f} {row.b_mean:13,.0f} {row.ratio.ratio:7.3f}  "
              f"{'yes' if within else 'no':9s}  {change if change in FLAGGED else '-'}")
    n = len(result.rows)
    if not n:
        print("the runs share no measured configuration")
        return 1
    print(f"configurations: {n}; flagged by xbench diff: {flagged} ({flagged / n:.0%}, target <= "
          f"{TARGET_FLAGGED:.0%}); B's mean inside A's 95% interval: {inside} ({inside / n:.0%})")
    print(f"|B/A - 1|: median {statistics.median(changes):.1%}, largest {max(changes):.1%}")
    print(f"wall: A {wall_a:.0f} s (exit {code_a}), B {wall_b:.0f} s (exit {code_b}); "
          f"xbench diff exit {diff.returncode} (target 0); its output: {options.out / 'diff.txt'}")
    return 0 if diff.returncode == 0 and flagged <= TARGET_FLAGGED * n else 1


if __name__ == "__main__":
    sys.exit(main())
