"""Where a replicate's seconds go, from a finished run's records.

    python benchmarks/replicate_cost.py results/<run>

A replicate is one worker process running its group's configurations in turn (one backend on
one device count). Per backend and device count, this prints the mean seconds of:
  start   from asking for the worker process to its "ready" (process start or fork, framework
          import unless forked from a fork server, device set-up), as the launcher measured it;
          records made before it did: from the previous process's last trial to this one's
          first (timestamps of 1 s resolution: a mean over many processes)
  compile the first call (compilation without a warm cache)
  windows the timed windows
  other   the rest of each trial (model and data set-up, warm-up steps, telemetry)
the share of a replicate's wall time that the timed windows are, and how many of the worker
processes were forked from a fork server (xbench.run.zygote).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from xbench.results.records import read_records


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def costs(run_dir: Path) -> dict[tuple[str, int], dict[str, list[float]]]:
    """Per (backend, devices): lists of start, compile, windows and other seconds, and one
    entry in "processes" per worker process."""
    records = sorted((r for r in read_records(run_dir) if r["status"] == "ok"), key=lambda r: r["started_at"])
    found: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    previous_end, previous_process = None, None
    for record in records:
        trial = record["trial"]
        key = (trial["backend"], trial["devices"])
        process = (*key, trial.get("replicate", 0), trial.get("launcher"))
        timing = record["timing"]
        duration = _seconds(record["finished_at"]) - _seconds(record["started_at"])
        windows = sum(timing["window_s"])
        found[key]["compile"].append(timing["first_call_s"])
        found[key]["windows"].append(windows)
        found[key]["other"].append(max(0.0, duration - windows - timing["first_call_s"]))
        if process != previous_process:
            found[key]["processes"].append(1.0)
            if "process" in record:  # measured by the launcher: asked for -> ready
                found[key]["start"].append(record["process"]["start_s"])
                found[key]["forked"].append(float(record["process"]["forked"]))
            elif previous_end is not None:
                found[key]["start"].append(max(0.0, _seconds(record["started_at"]) - previous_end))
        previous_end, previous_process = _seconds(record["finished_at"]), process
    return found


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    table = costs(Path(sys.argv[1]))
    print(f"{'backend':14s} {'dev':>3s} {'start s':>8s} {'compile s':>10s} {'windows s':>10s} {'other s':>8s} "
          f"{'trials':>7s}  timed share  forked")
    for (backend, devices), parts in sorted(table.items()):
        mean = {k: sum(v) / len(v) if v else 0.0 for k, v in parts.items()}
        trials = len(parts["windows"])
        per_process = trials / max(1, len(parts["processes"]))
        wall = mean.get("start", 0.0) + per_process * (mean["compile"] + mean["windows"] + mean["other"])
        print(f"{backend:14s} {devices:3d} {mean.get('start', 0.0):8.2f} {mean['compile']:10.2f} "
              f"{mean['windows']:10.2f} {mean['other']:8.2f} {trials:7d}  {per_process * mean['windows'] / wall:11.0%}"
              f"  {sum(parts['forked']):.0f}/{len(parts['processes'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
