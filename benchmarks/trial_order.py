"""Does a configuration run slower when other configurations ran before it in the same worker
process? One fresh interpreter per sample (this script re-runs itself) sets up a backend on
simulated CPU devices, then prepares and times each configuration of `--order` in turn, as a
worker runs a job's trials, with or without `gc.collect()` between them (`--collect`) and the
backend's `forget_trial` before it (`--forget`): what `xbench.worker.main.run_trials` does
is both.

    python benchmarks/trial_order.py --order medium:32 large:256 medium:256 large:32 --samples 4
    python benchmarks/trial_order.py --order medium:32 large:256 medium:256 large:32 --samples 4 --collect
    python benchmarks/trial_order.py --order medium:32 large:256 medium:256 large:32 --samples 4 --collect --forget

Prints one JSON line per sample: each configuration's samples/s per timed window (`--windows`
windows of `--steps` steps, after 2 untimed steps).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

TARGET = "xbench_backends.jax.pmap:JaxPmapBackend"


def one_sample(args) -> dict:
    from xbench.contract.work import build_work
    from xbench.experiment.spec import load_spec
    from xbench.run.plan import plan_trials
    from xbench.worker.main import forget, load_target

    backend = load_target(TARGET)
    backend.setup(args.devices, "cpu")
    out, works = {}, {}  # a worker keeps each model's work (weights, data) for the whole job
    for item in args.order:
        model, batch = item.split(":")
        spec = load_spec(Path("configs/quick.toml"), {"models": [model], "batch_sizes": [int(batch)],
                                                      "devices": [args.devices], "platform": "cpu"})
        trial = next(t for t in plan_trials(spec, ["jax"]) if t.devices == args.devices)
        key = (trial.model, trial.samples, trial.seed)
        if key not in works:
            works[key] = build_work(*key)
        prepared = backend.prepare(trial, works[key])
        backend.run(prepared, 2)
        windows = []
        for _ in range(args.windows):
            start = time.perf_counter()
            backend.run(prepared, args.steps)
            windows.append(round(int(batch) * args.steps / (time.perf_counter() - start)))
        out[item] = windows
        del prepared
        if args.forget:
            forget(backend)
        if args.collect:
            gc.collect()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--order", nargs="+", required=True, help="MODEL:GLOBAL_BATCH, in the order they run")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--samples", type=int, default=3, help="fresh interpreters")
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--collect", action="store_true", help="gc.collect() between configurations")
    parser.add_argument("--forget", action="store_true", help="the backend's forget_trial between configurations")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_sample(args)))
        return 0
    for _ in range(args.samples):
        child = subprocess.run([sys.executable, __file__, "--child", *sys.argv[1:]], capture_output=True, text=True)
        if child.returncode != 0:
            print(child.stderr[-2000:], file=sys.stderr)
            return 1
        sample = json.loads(child.stdout.strip().splitlines()[-1])
        print(json.dumps({"collect": args.collect, "forget": args.forget, **sample}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
