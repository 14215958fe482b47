"""Does a rerun agree? N separate `xbench compare` invocations of one spec, every pairwise
`xbench diff`, and optionally a planted slowdown that `xbench diff` must catch.

    python benchmarks/repeatability.py --out results/repeat -- --backends jax tf
    python benchmarks/repeatability.py --runs 3 --planted jax.extra_work=0.2 --out $OUT/repeat -- \\
        --config configs/seed-study.toml --backends jax jax-shardmap torch

Everything after `--` goes to every `xbench compare` run unchanged; each gets its own `--out`:
OUT/A, OUT/B, OUT/C, ... (`--runs N`, default 2: OUT/A and OUT/B, as before). `--planted
BACKEND.extra_work=F` then adds one more run, OUT/planted, with `--option BACKEND.extra_work=F`
(the backends' planted slowdown: about F more training steps than counted,
backends/extra_work.py). `--analyse-only` analyses the runs already in OUT. Prints:

- per configuration, each run's mean throughput, the relative sd between the runs (the sd of
  the log run means, with 3 runs or more), the part of it that the runs' replicates do not
  explain ("net": the variance of the log run means less the mean variance of a run's log
  mean from its own replicates, at least 0) and whether it is host-bound (in any run);
- per ordered pair of runs (X, Y): the exit status of `xbench diff X Y` (its output in
  OUT/diff-X-Y.txt; ordered, since only a slowdown of Y fails it), the configurations it
  flags, and how many of Y's means lie in X's 95 % interval;
- the median relative sd of the configurations the run-level variation applies to (host-bound,
  or on simulated CPU devices) and of the others, and the settings suggested for `xbench
  compare --run-variation` and `--device-run-variation`: the root mean square of each
  group's net sd;
- for a planted run: the share of that backend's configurations that `xbench diff A planted`
  calls a regression, and their median ratio against the 1 / (1 + F) expected.

Targets (issue "Numbers that hold on a rerun"), each PASS or FAIL; the exit status is 0 only
when all pass: every `xbench compare` exits 0 (not checked with --analyse-only); every pairwise
`xbench diff` exits 0; at least 80 % of (ordered pair, configuration) have the second run's mean
inside the first run's 95 % interval; the planted slowdown flagged on at least 90 % of its
backend's configurations.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import string
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from xbench.cli.diff_cmd import parse_threshold
from xbench.contract.trial import backend_of_implementation
from xbench.errors import XbenchError
from xbench.results.diff import Key, diff_runs
from xbench.results.records import Record, read_records
from xbench.results.summary import rows_from_records
from xbench_backends.extra_work import OPTION, parse

FLAGGED = ("regression", "improvement")
TARGET_INSIDE = 0.80
TARGET_PLANTED = 0.90
PLANTED = "planted"


@dataclass(frozen=True)
class Target:
    name: str
    value: str
    passed: bool


@dataclass(frozen=True)
class Planted:
    backend: str
    fraction: float

    @property
    def option(self) -> str:
        return f"{self.backend}.{OPTION}={self.fraction:g}"


def planted_arg(text: str) -> Planted:
    backend, _, rest = text.partition(".")
    key, _, value = rest.partition("=")
    try:
        if not backend or key != OPTION:
            raise ValueError(f"expected BACKEND.{OPTION}=F, e.g. jax.{OPTION}=0.2")
        return Planted(backend, parse(value))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def threshold_arg(text: str) -> float:
    try:
        return parse_threshold(text)
    except XbenchError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def runs_arg(text: str) -> int:
    if not text.isdigit() or not 2 <= int(text) <= len(string.ascii_uppercase):
        raise argparse.ArgumentTypeError(f"runs are named A to Z: 2 to 26 of them, got {text!r}")
    return int(text)


def run_names(runs: int) -> list[str]:
    """A, B, C, ...: with two runs, the names this script always gave them."""
    return list(string.ascii_uppercase[:runs])


def compare(out: Path, args: list[str]) -> tuple[float, int]:
    """One `xbench compare` in its own process; (wall seconds, exit status)."""
    started = time.monotonic()
    code = subprocess.call([sys.executable, "-m", "xbench", "compare", *args, "--out", str(out)])
    return time.monotonic() - started, code


def run_all(out: Path, runs: dict[str, list[str]]) -> Target:
    """`xbench compare` into OUT/NAME for each run (name -> its arguments), one after another."""
    walls = {name: compare(out / name, args) for name, args in runs.items()}
    codes = [code for _, code in walls.values()]
    print("wall: " + ", ".join(f"{name} {wall:.0f} s (exit {code})" for name, (wall, code) in walls.items()))
    return Target("every xbench compare exits 0", f"{codes.count(0)}/{len(codes)}", codes.count(0) == len(codes))


def diff_exit(out: Path, a: str, b: str, threshold: float) -> int:
    """`xbench diff OUT/a OUT/b` in its own process, its output to OUT/diff-a-b.txt; its exit status."""
    diff = subprocess.run([sys.executable, "-m", "xbench", "diff", str(out / a), str(out / b),
                           "--threshold", f"{threshold:g}"], capture_output=True, text=True)
    (out / f"diff-{a}-{b}.txt").write_text(diff.stdout + diff.stderr, encoding="utf-8")
    return diff.returncode


def config_name(key: Key) -> str:
    backend, model, devices, batch, _, _, all_reduce = key
    return f"{backend}/{model}/d{devices}/b{batch}" + ("" if all_reduce else "/compute-only")


def share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part / whole:.0%})" if whole else "0/0"


def pairwise(out: Path, records: dict[str, list[Record]], threshold: float) -> list[Target]:
    """Every ordered pair of runs: `xbench diff`'s exit status, what it flags, and how many of
    the second run's means lie in the first run's 95 % interval."""
    codes, inside, total = [], 0, 0
    for a, b in itertools.permutations(records, 2):
        codes.append(diff_exit(out, a, b, threshold))
        rows = diff_runs(records[a], records[b]).rows
        outside = [config_name(r.key) for r in rows if not r.a_interval[0] <= r.b_mean <= r.a_interval[1]]
        flagged = [f"{config_name(r.key)} {r.change(threshold)}" for r in rows if r.change(threshold) in FLAGGED]
        inside, total = inside + len(rows) - len(outside), total + len(rows)
        print(f"{a} -> {b}: xbench diff exit {codes[-1]}; flagged {len(flagged)}/{len(rows)}"
              + "".join(f"; {f}" for f in flagged)
              + f"; {b}'s mean in {a}'s 95% interval {len(rows) - len(outside)}/{len(rows)}"
              + (f" (outside: {', '.join(outside)})" if outside else ""))
    return [Target("every pairwise xbench diff exits 0", f"{codes.count(0)}/{len(codes)}",
                   bool(codes) and codes.count(0) == len(codes)),
            Target(f"means inside the other run's 95% interval (>= {TARGET_INSIDE:.0%})", share(inside, total),
                   total > 0 and inside >= TARGET_INSIDE * total)]


@dataclass(frozen=True)
class RunMeans:
    """One configuration across the runs."""

    means: list[float]  # its mean throughput in each run
    log_means: list[float]  # the mean log of its replicate means in each run (the interval's centre)
    host: bool  # the run-level variation applies (host-bound in any run, or on simulated CPU devices)
    replicate_var: float  # the mean over runs of the variance of a run's log mean from its own replicates


def run_means(records: dict[str, list[Record]]) -> dict[str, RunMeans]:
    """Per configuration measured in every run: its means, regime and replicate noise."""
    runs = [{row.trial_id: row for row in rows_from_records(recs) if row.throughput is not None}
            for recs in records.values()]
    return {config: RunMeans([run[config].measured.mean for run in runs],
                             [statistics.fmean(math.log(m) for m in run[config].means) for run in runs],
                             any(run[config].host_bound or run[config].simulated for run in runs),
                             statistics.fmean(_mean_var(run[config].means) for run in runs))
            for config in runs[0] if all(config in run for run in runs)}


def _mean_var(means: tuple[float, ...]) -> float:
    """The variance of a run's log mean that its own replicates estimate, without bias (the
    pooled spread is floored at each row's own, so it would be biased upward); 0 with one."""
    return statistics.variance(math.log(m) for m in means) / len(means) if len(means) >= 2 else 0.0


def gross_var(found: RunMeans) -> float:
    """The variance of the log run means (nan with fewer than 3 runs)."""
    return statistics.variance(found.log_means) if len(found.log_means) >= 3 else math.nan


def relative_sd(found: RunMeans) -> float:
    """The sd of the log run means (nan with fewer than 3 runs)."""
    return math.sqrt(gross_var(found))


def net_sd(found: RunMeans) -> float:
    """The run-to-run sd beyond what the runs' replicates explain, at least 0 (nan with fewer than 3 runs)."""
    net = gross_var(found) - found.replicate_var
    return math.nan if math.isnan(net) else math.sqrt(max(0.0, net))


def group_net_sd(group: list[RunMeans]) -> float:
    """The root mean square net sd of a group of rows: the variances averaged before the clip at
    0 (clipping each row first would bias it upward)."""
    return math.sqrt(max(0.0, statistics.fmean(gross_var(one) - one.replicate_var for one in group)))


def percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1%}"


def median_text(values: list[float]) -> str:
    return f"{statistics.median(values):.1%} ({len(values)} configurations)" if values else "- (none)"


def run_to_run(records: dict[str, list[Record]]) -> None:
    """Per configuration, each run's mean, the relative sd between runs (gross and net) and
    whether host-bound; then the medians and the suggested --run-variation and
    --device-run-variation."""
    found = run_means(records)
    print(f"{'configuration':44s} " + " ".join(f"{name + ' samples/s':>14s}" for name in records)
          + "  rel. sd      net  host-bound or CPU")
    for config, one in found.items():
        print(f"{config:44s} " + " ".join(f"{m:14,.0f}" for m in one.means)
              + f"  {percent(relative_sd(one)):>7s}  {percent(net_sd(one)):>7s}  {'yes' if one.host else '-'}")
    if len(records) < 3:
        print("run-to-run variation: needs --runs 3 or more")
        return
    host = [one for one in found.values() if one.host]
    others = [one for one in found.values() if not one.host]
    print(f"run-to-run relative sd (sd of log run means, {len(records)} runs), median: host-bound or on a CPU "
          f"{median_text([relative_sd(one) for one in host])}, others "
          f"{median_text([relative_sd(one) for one in others])}")
    groups = (("--run-variation", host, "host-bound or CPU"), ("--device-run-variation", others, "device-bound"))
    for option, group, regime in groups:
        if group:  # the root mean square: calibrated on average
            print(f"suggested: xbench compare {option} {group_net_sd(group):.3f} (the root mean square of the net "
                  f"sd of the {len(group)} {regime} rows" + (", too few to rely on" if len(group) < 4 else "") + ")")
        else:
            print(f"suggested: no {regime} configuration; {option} applies to none here")


def planted(out: Path, first: str, plant: Planted, threshold: float) -> Target:
    """`xbench diff` of the first run against the planted one: the planted backend's configurations flagged."""
    code = diff_exit(out, first, PLANTED, threshold)
    rows = [r for r in diff_runs(read_records(out / first), read_records(out / PLANTED)).rows
            if backend_of_implementation(r.key[0]) == plant.backend]
    flagged = sum(r.change(threshold) == "regression" for r in rows)
    ratio = f"{statistics.median(r.ratio.ratio for r in rows):.3f}" if rows else "-"
    print(f"planted {plant.option}: {first} -> {PLANTED}: xbench diff exit {code}; regression in "
          f"{share(flagged, len(rows))} of {plant.backend}'s configurations; B/A median {ratio} "
          f"(expected about {1 / (1 + plant.fraction):.3f})")
    return Target(f"planted {plant.option} flagged as regression (>= {TARGET_PLANTED:.0%})", share(flagged, len(rows)),
                  bool(rows) and flagged >= TARGET_PLANTED * len(rows))


def summary(targets: list[Target]) -> int:
    print("targets:")
    for target in targets:
        print(f"  {'PASS' if target.passed else 'FAIL'}  {target.name}: {target.value}")
    return 0 if all(t.passed for t in targets) else 1


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the runs (must not exist)")
    parser.add_argument("--runs", type=runs_arg, default=2, metavar="N",
                        help="xbench compare runs, OUT/A, OUT/B, ... (2 to 26; default 2)")
    parser.add_argument("--threshold", type=threshold_arg, default="5%", help="xbench diff --threshold (default 5%%)")
    parser.add_argument("--planted", type=planted_arg, metavar=f"BACKEND.{OPTION}=F",
                        help="one more run, OUT/planted, with this option: xbench diff must flag it")
    parser.add_argument("--analyse-only", action="store_true", help="analyse the runs already in OUT instead")
    parser.add_argument("compare_args", nargs=argparse.REMAINDER, help="-- then the xbench compare arguments")
    return parser.parse_args()


def main() -> int:
    options = arguments()
    args = [a for a in options.compare_args if a != "--"]
    runs = {name: args for name in run_names(options.runs)}
    plant: Planted | None = options.planted
    targets = []
    if not options.analyse_only:
        extra = {PLANTED: [*args, "--option", plant.option]} if plant else {}
        targets.append(run_all(options.out, {**runs, **extra}))
    records = {name: read_records(options.out / name) for name in runs}
    run_to_run(records)
    targets += pairwise(options.out, records, options.threshold)
    if plant:
        targets.append(planted(options.out, next(iter(runs)), plant, options.threshold))
    return summary(targets)


if __name__ == "__main__":
    sys.exit(main())
