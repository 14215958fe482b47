"""xbench's sharded programs against the minimal FSDP loops an expert writes, in one call.

    python benchmarks/fsdp_loops.py --out fsdp-gpt2-xl                    # gpt2-xl bf16 @ 16 on 2 GPUs
    python benchmarks/fsdp_loops.py --platform cpu --quick --out /tmp/fl  # transformer-tiny @ 8, 2 CPU devices

What it runs, on the same model, global batch, devices and precision (bf16 mixed: bf16
compute, float32 master weights and gradient reductions, float32 loss; Adam with xbench's b1,
b2, eps and configs/families.toml's learning rate; the core's initial weights and data):

- the minimal loops (_fsdp_jax.py, _fsdp_torch.py), one child process per framework
  (_fsdp_child.py; torch's child starts one process per device): jax, the plain jax.numpy
  GPT-2 of expert_loops.py with parameters and Adam's moments split over a 1-D mesh and one
  jitted step with in/out shardings (cuDNN attention on a GPU); torch, expert_loops.py's
  nanoGPT-style GPT-2 with each block torch.compile'd and fully_shard'ed, the root sharded
  last, MixedPrecisionPolicy(bf16, fp32), fused Adam. Each is timed as xbench times: the first
  call apart, warm-up steps, then --rounds windows of about --window-s, each ending in a
  device sync; its ms/step is the median window's.
- `xbench compare --config configs/families.toml --variants` with the sharded programs (`sharded_variants`) on the same
  configuration, no verification (the GPU script verifies separately), --replicates 2 and
  --time-budget 0 unless --xbench-args says otherwise; its rows are read back from
  `xbench export --csv`. The as-written (replicated) rows come with it, as context.

Printed, one line each: every program's tokens/s, MFU (FLOPs per token x tokens/s over the
devices' dense peak, xbench.results.peaks; unknown on CPUs) and peak memory of the fullest
device (the framework's own counter; n/a on CPUs); then per framework the ratio of xbench's
best sharded program (variant fsdp) to the minimal loop. On a GPU at gpt2-xl the target is a
ratio >= 0.95; exit status 0 when everything ran and every target that applies is met.

Cost on 2 H100s at gpt2-xl (estimates, see benchmarks/gpu_sharded.sh): the minimal loops
~2-3 min together, xbench compare ~5-8 min (4 configurations x 2 replicates).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _expert_config import MARK
from _interleave import child_records

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # jax's peak counter, not a 75 % grab
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off, as on the lent GPU machines

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 0.95
# xbench's sharded programs; the best of a framework's is compared
SHARDED_VARIANTS = ("fsdp", "fsdp-compile", "fsdp-cudnn")
GPU_DEFAULTS = {"model": "gpt2-xl", "global_batch": 16}  # 8 sequences of 1,024 per GPU on 2 GPUs
CPU_DEFAULTS = {"model": "transformer-tiny", "global_batch": 8}
ROUNDS, WINDOW_S, WARMUP = 5, 2.0, 3
QUICK_ROUNDS, QUICK_WINDOW_S, QUICK_WARMUP = 3, 0.1, 1
XBENCH_ARGS = "--replicates 2 --time-budget 0"
COMPARE_STOP_S = 60  # for an interrupted xbench compare to record what it finished and exit
QUICK_XBENCH_ARGS = "--replicates 2 --time-budget 0 --repeats 2 --min-window 0"


def run_minimal(framework: str, payload: dict[str, Any], started: float) -> tuple[dict | None, str]:
    """One framework's minimal loop in a child; its result record (None if it failed) and why."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps({**payload,
                                                                                      "framework": framework})]

    def show(record: dict) -> None:
        if record["kind"] == "progress":
            print(f"[{time.monotonic() - started:4.0f} s] {record['text']}", flush=True)

    records, code, stderr = child_records(command, MARK, show)
    found = next((r for r in records if r["kind"] == "result"), None)
    errors = [r["error"] for r in records if r["kind"] == "error"]
    if found is None or code != 0:
        return found, "; ".join(errors) or f"exit {code}: {stderr.strip()[-1500:]}"
    return found, ""


def run_xbench(args, run_dir: Path) -> tuple[list[dict[str, str]], str]:
    """`xbench compare` on the same configuration; its rows (configurations.csv) and why none."""
    command = [sys.executable, "-m", "xbench", "compare", "--config", str(ROOT / "configs" / "families.toml"),
               "--backends", *args.frameworks, "--model", args.model, "--global-batch", str(args.global_batch),
               "--devices", str(args.devices), "--precision", args.precision, "--platform", args.platform,
               "--variants", *sharded_variants(args.frameworks, compiled=not args.no_compile,
                                               gpu=args.platform == "gpu"), "--no-verify",
               *shlex.split(args.xbench_args), "--out", str(run_dir)]
    print(f"$ {shlex.join(command[1:])}", flush=True)
    with open(run_dir.parent / "compare.err", "w") as err:
        compare = subprocess.Popen(command, stderr=err, text=True)
        try:
            compare.wait()
        except KeyboardInterrupt:  # the step's timeout: the run stops cleanly, what it measured is read back
            compare.send_signal(signal.SIGINT)  # it has it already where the signal went to the group
            try:
                compare.wait(timeout=COMPARE_STOP_S)
            except subprocess.TimeoutExpired:
                compare.kill()
                compare.wait()
    exported = subprocess.run([sys.executable, "-m", "xbench", "export", str(run_dir), "--csv"],
                              capture_output=True, text=True)
    table = run_dir / "configurations.csv"
    if exported.returncode != 0 or not table.exists():
        said = (run_dir.parent / "compare.err").read_text().strip().splitlines() if compare.returncode else []
        why = said[-1] if said else f"export: {exported.stderr.strip()[-500:]}"
        return [], f"compare exit {compare.returncode}: {why}"
    with open(table, newline="") as f:
        return list(csv.DictReader(f)), "" if compare.returncode == 0 else f"compare exit {compare.returncode}"


def xbench_row(row: dict[str, str]) -> dict[str, Any] | None:
    """A configurations.csv row as figures; None where it has no throughput."""
    if row["status"] != "ok" or not row["samples_per_s_geomean"]:
        return None
    tokens = float(row["samples_per_s_geomean"]) * float(row["units_per_sample"])
    return {"framework": row["backend"], "program": f"xbench {row['backend']}"
            + ("" if row["variant"] == "as-written" else f"+{row['variant']}"),
            "variant": row["variant"], "tokens_per_s": tokens, "ms": float(row["step_ms"] or "nan"),
            "mfu": float(row["mfu"]) if row["mfu"] else None,
            "memory_gib": float(row["memory_gib"]) if row["memory_gib"] else None,
            "first_call_s": float(row["first_call_s"] or "nan"), "replicates": int(row["replicates"] or 0)}


def program_line(p: dict[str, Any]) -> str:
    mfu = "unknown" if p["mfu"] is None else f"{p['mfu']:.1%}"
    memory = "n/a" if p["memory_gib"] is None else f"{p['memory_gib']:.1f} GiB"
    return (f"{p['program']:34s} {p['tokens_per_s']:12,.0f} tokens/s  MFU {mfu:>7s}  memory/device {memory:>9s}  "
            f"{p['ms']:9.2f} ms/step  first call {p['first_call_s']:.1f} s")


def sharded_variants(frameworks: list[str], compiled: bool, gpu: bool) -> list[str]:
    """The sharded programs to time, like with like: torch's `fsdp`, and its compiled one where
    the minimal torch loop compiles too; jax's `fsdp`, on GPUs `fsdp-cudnn` instead (the
    minimal jax loop's attention is cuDNN's there; XLA's attention of gpt2-xl at 8 sequences
    a GPU asks 85 GiB at once)."""
    wanted = {"torch": ("fsdp", "fsdp-compile") if compiled else ("fsdp",),
              "jax": ("fsdp-cudnn",) if gpu else ("fsdp",)}
    return [f"{f}:{v}" for f in frameworks for v in wanted.get(f, ("fsdp",))]


def ratio_line(framework: str, minimal: dict | None, rows: list[dict], gpu_target: bool) -> tuple[str, bool]:
    """The ratio line of one framework, and whether it passes (a missing side fails)."""
    sharded = [r for r in rows if r["framework"] == framework and r["variant"] in SHARDED_VARIANTS]
    best = max(sharded, key=lambda r: r["tokens_per_s"], default=None)
    if minimal is None or best is None:
        missing = "the minimal loop" if minimal is None else "xbench's sharded program"
        return f"ratio {framework}: not measured ({missing} did not run)", False
    ratio = best["tokens_per_s"] / minimal["tokens_per_s"]
    verdict = (("meets" if ratio >= TARGET_RATIO else "misses") + f" the target {TARGET_RATIO:g}" if gpu_target
               else "the target applies at gpt2-xl on GPUs")
    return (f"ratio {framework}: {best['program']} / {minimal['program']} = {ratio:.3f} ({verdict})",
            ratio >= TARGET_RATIO or not gpu_target)


def parent(args) -> int:
    started = time.monotonic()
    out = args.out or Path(tempfile.mkdtemp(prefix="fsdp-loops-"))
    out.mkdir(parents=True, exist_ok=True)
    payload = {"model": args.model, "global_batch": args.global_batch, "devices": args.devices,
               "precision": args.precision, "platform": args.platform, "compile": not args.no_compile,
               "rounds": args.rounds, "window_s": args.window_s, "warmup": args.warmup}
    print(f"fsdp loops: {args.model} {args.precision} @ {args.global_batch} on {args.devices} device(s); "
          f"{', '.join(args.frameworks)}; minimal loops: {args.rounds} windows of ~{args.window_s:g} s", flush=True)
    minimal, failures = {}, []
    for framework in args.frameworks:
        record, why = run_minimal(framework, payload, started)
        if record is not None:
            minimal[framework] = record
            # kept should the step be cut before the report (which prints it again, unprefixed)
            print(f"[{time.monotonic() - started:4.0f} s] {program_line(record)}", flush=True)
        if why:
            failures.append(f"minimal {framework}: {why}")
    rows: list[dict] = []
    if not args.no_xbench:
        raw, why = run_xbench(args, out / "xbench-run")
        rows = [r for r in map(xbench_row, raw) if r is not None]
        if why:
            failures.append(f"xbench: {why}")
    return report(args, out, minimal, rows, failures, time.monotonic() - started)


def report(args, out: Path, minimal: dict[str, dict], rows: list[dict], failures: list[str], wall: float) -> int:
    platform = next((r["platform"] for r in minimal.values()), args.platform)
    gpu_target = platform == "gpu" and args.model == GPU_DEFAULTS["model"] and args.precision == "bf16"
    print(f"\nfsdp loops: {args.model} {args.precision} @ {args.global_batch} on {args.devices} device(s) "
          f"({next((r['device'] for r in minimal.values()), 'device unknown')})")
    for record in minimal.values():
        print(program_line(record))
        if record["params"] != record["params_core"]:
            failures.append(f"{record['program']}: {record['params']:,} parameters, "
                            f"the core's {record['params_core']:,}")
    for row in rows:
        print(program_line(row))
    ok = not failures
    for framework in () if args.no_xbench else args.frameworks:
        line, passes = ratio_line(framework, minimal.get(framework), rows, gpu_target)
        print(line)
        ok &= passes
    for failure in failures:
        print(f"failed: {failure}", file=sys.stderr)
    document = {"benchmark": "fsdp_loops", "arguments": {k: str(v) for k, v in vars(args).items()},
                "minimal": minimal, "xbench": rows, "failures": failures, "wall_s": wall}
    (out / "fsdp-loops.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    print(f"wall: {wall:.0f} s; results: {out}")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a transformer preset (default gpt2-xl on GPUs, "
                                                      "transformer-tiny on CPUs)")
    parser.add_argument("--global-batch", type=int, default=None, help="sequences per step, all devices (default "
                                                                       "16 on GPUs, 8 on CPUs)")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default="bf16")
    parser.add_argument("--frameworks", nargs="+", choices=("jax", "torch"), default=["jax", "torch"])
    parser.add_argument("--platform", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument("--no-compile", action="store_true", help="torch's minimal loop eager (torch.compile "
                                                                  "takes minutes on a small CPU host)")
    parser.add_argument("--no-xbench", action="store_true", help="the minimal loops only")
    parser.add_argument("--xbench-args", default=None, help=f"more for xbench compare (default {XBENCH_ARGS!r}; "
                                                            f"--quick {QUICK_XBENCH_ARGS!r})")
    parser.add_argument("--rounds", type=int, default=None, help=f"timed windows (default {ROUNDS})")
    parser.add_argument("--window-s", type=float, default=None, help=f"seconds a window (default {WINDOW_S:g})")
    parser.add_argument("--warmup", type=int, default=None, help=f"untimed steps (default {WARMUP})")
    parser.add_argument("--quick", action="store_true", help="short windows, fewer rounds (a smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="a directory for the JSON and xbench's run")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        from _fsdp_child import child

        return child(json.loads(args.child))
    defaults(args)
    return parent(args)


def defaults(args) -> None:
    """Fill what was not given: the platform's model and batch, the timing, xbench's arguments."""
    from xbench.run.environment import nvidia_gpus

    gpu = args.platform == "gpu" or (args.platform == "auto" and bool(nvidia_gpus()))
    sized = GPU_DEFAULTS if gpu else CPU_DEFAULTS
    args.model = args.model or sized["model"]
    args.global_batch = args.global_batch or sized["global_batch"]
    quick = (QUICK_ROUNDS, QUICK_WINDOW_S, QUICK_WARMUP, QUICK_XBENCH_ARGS)
    given = (args.rounds, args.window_s, args.warmup, args.xbench_args)
    args.rounds, args.window_s, args.warmup, args.xbench_args = (
        g if g is not None else d for g, d in zip(given, quick if args.quick else
                                                  (ROUNDS, WINDOW_S, WARMUP, XBENCH_ARGS)))


if __name__ == "__main__":
    sys.exit(main())
