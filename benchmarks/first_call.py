"""Where a worker's fixed seconds go before its first timed window, phase by phase.

    python benchmarks/first_call.py --backend jax --model large --batch 128 [--program plain]
    python benchmarks/first_call.py --backend torch --model medium --batch 64 --fork 3

One fresh interpreter per sample (this script re-runs itself), each timing, in turn: importing
the backend's module (its framework), `setup` (the device context), building the work (weights
and data), `prepare` (the model on the device), the first call (one step: tracing, lowering,
compilation, first run) and a second call. For jax the first call is split further by
`jax.monitoring`'s duration events (trace, lowering to MLIR, XLA compilation).

With --fork K the parent imports the backend's module once, then forks K children one after
the other, each doing everything after the import in a fresh process: what a worker started
from a pre-imported parent (a fork server) would cost. With --steps N each sample then times
N steps (step_ms), to see what a setting that changes compilation (XLA_FLAGS) does to the
program it makes. Prints one JSON line per sample.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

TARGETS = {"jax": "xbench_backends.jax.pmap:JaxPmapBackend", "torch": "xbench_backends.torch.ddp:TorchDdpBackend",
           "tf": "xbench_backends.tf.mirrored:TfMirroredBackend"}


def trial_for(args):
    from xbench.contract import AS_WRITTEN
    from xbench.experiment.spec import load_spec
    from xbench.run.plan import Lineup, plan_trials

    spec = load_spec(Path(args.config), {"models": [args.model], "batch_sizes": [args.batch], "devices": [1],
                                         "platform": args.platform})
    trial = plan_trials(spec, [args.backend], lineups={args.backend: Lineup(single_device=(args.program,))})[0]
    return replace(trial, variant=args.variant or AS_WRITTEN)


def jax_listener(durations):
    try:
        import jax.monitoring
    except ImportError:
        return
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: durations.__setitem__(event, durations[event] + seconds))


def phases(args, imported_at: float | None = None) -> dict:
    """Every phase after the import (and the import itself unless `imported_at`)."""
    out: dict = {}
    durations: dict = defaultdict(float)
    start = time.perf_counter()
    from xbench.worker.main import load_target

    backend = load_target(TARGETS[args.backend])
    for module in type(backend).fork_preload:  # what a worker imports before its first step
        importlib.import_module(module)
    out["import_s"] = time.perf_counter() - start if imported_at is None else 0.0
    if args.backend == "jax":
        jax_listener(durations)
    t = time.perf_counter()
    backend.setup(1, args.platform)
    out["setup_s"] = time.perf_counter() - t
    trial = trial_for(args)
    from xbench.contract.work import build_work

    t = time.perf_counter()
    work = build_work(trial.model, trial.samples, trial.seed)
    out["work_s"] = time.perf_counter() - t
    profile = None
    if args.profile:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    modules = set(sys.modules)
    t = time.perf_counter()
    prepared = backend.prepare(trial, work)
    out["prepare_s"] = time.perf_counter() - t
    imported = collections.Counter(".".join(m.split(".")[:3]) for m in set(sys.modules) - modules)
    out["prepare_imported"] = dict(imported.most_common(12))
    if profile is not None:
        import io
        import pstats

        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        print(text.getvalue(), file=sys.stderr)
    before = dict(durations)
    t = time.perf_counter()
    backend.run(prepared, 1)
    out["first_call_s"] = time.perf_counter() - t
    out["first_call_parts"] = {k.rsplit("/", 1)[-1]: round(v - before.get(k, 0.0), 3) for k, v in durations.items()
                               if v - before.get(k, 0.0) > 0.001}
    t = time.perf_counter()
    backend.run(prepared, 1)
    out["second_call_s"] = time.perf_counter() - t
    if args.steps:  # the step time the first call's choices give
        backend.run(prepared, args.steps)
        t = time.perf_counter()
        backend.run(prepared, args.steps)
        out["step_ms"] = 1000 * (time.perf_counter() - t) / args.steps
    out["total_s"] = time.perf_counter() - (start if imported_at is None else imported_at)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=sorted(TARGETS), required=True)
    parser.add_argument("--model", default="large")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--program", default="data-parallel")
    parser.add_argument("--variant", default=None)
    parser.add_argument("--platform", default="auto")
    parser.add_argument("--config", default="configs/seed-study.toml")
    parser.add_argument("--samples", type=int, default=3, help="fresh interpreters (or forks) to time")
    parser.add_argument("--steps", type=int, default=0, help="then time this many steps (after as many untimed)")
    parser.add_argument("--profile", action="store_true", help="print prepare's 25 costliest calls to stderr")
    parser.add_argument("--fork", action="store_true", help="import once, fork a child per sample")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    label = {"backend": args.backend, "model": args.model, "batch": args.batch, "program": args.program,
             "variant": args.variant, "mode": "fork" if args.fork else "fresh"}
    if args.child:
        print(json.dumps(phases(args)), flush=True)
        return 0
    if not args.fork:
        for _ in range(args.samples):
            t = time.perf_counter()
            child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child"], capture_output=True,
                                   text=True)
            if child.returncode:
                sys.exit(f"the child failed: {child.stderr.strip()[-2000:]}")
            if args.profile:
                print(child.stderr, file=sys.stderr)
            line = child.stdout.strip().splitlines()[-1]
            print(json.dumps({**label, "wall_s": round(time.perf_counter() - t, 3), **json.loads(line)}), flush=True)
        return 0
    from xbench.worker.main import load_target

    t = time.perf_counter()
    for module in type(load_target(TARGETS[args.backend])).fork_preload:  # as the fork server: no device touched
        importlib.import_module(module)
    imported = time.perf_counter() - t
    for _ in range(args.samples):
        read, write = os.pipe()
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            result = phases(args, imported_at=t)
            os.write(write, json.dumps(result).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as stream:
            result = json.loads(stream.read())
        os.waitpid(pid, 0)
        print(json.dumps({**label, "parent_import_s": round(imported, 3), "wall_s": round(time.perf_counter() - t, 3),
                          **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
