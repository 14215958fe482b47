"""xbench's programs against the minimal loops an expert writes: GPT-2 small, ResNet-50, seed MLPs.

    python benchmarks/expert_loops.py --models gpt2-small --out gpt2.json            # ~4-5 min on an H100
    python benchmarks/expert_loops.py --models resnet50 mlp --out resnet-mlp.json    # ~6-7 min
    python benchmarks/expert_loops.py --models resnet50 --frameworks torch --programs compile
    python benchmarks/expert_loops.py --quick                 # CPU smoke test, about 1.5 min on 2 cores
    python benchmarks/expert_loops.py --list                  # the programs of each framework

Without --models: gpt2-small resnet50 mlp on a GPU (about 11-12 minutes on an H100 with the
default lineup, more than one 10-minute command: the deadline below cuts the tail), the
CPU-sized transformer-tiny resnet18 medium on a CPU.

What it measures. For each configuration (GPT-2 small in bf16 at 16 x 1,024
tokens, ResNet-50 in bf16 at 256 images of 224 x 224, the seed MLPs in tf32: medium @ 128 and
large @ 65,536), the training throughput of xbench's programs and of minimal loops written
here, timed interleaved in one process per framework, as throughput ratios with intervals.

Processes. One child process per model and framework (jax and torch never share a process;
the children run one after the other, GPT-2 first). In a child, per configuration: the core's
work (xbench.contract.work.build_work: initial weights and data) is built once, then every program is
built from it:

- xbench's programs, through the backend in this process as the core drives it
  (`setup(1, platform)`, `prepare(Trial(program="plain", variant=V), work)`, `run(prepared,
  steps)`); the lineup is in JAX_XBENCH and TORCH_XBENCH, one line a program. A variant the
  backend does not know, or cannot run here, is recorded as "unknown" or "unsupported" with
  the reason; `--dp` adds the data-parallel program on one device.
- minimal loops, written here as an expert writes them (JAX_MINIMAL, TORCH_MINIMAL):
  jax GPT-2: plain jax.numpy + optax.adam, one `jax.jit` step per call with the state
  donated, attention `jax.nn.dot_product_attention(is_causal=True)` with implementation None
  (XLA) or "cudnn" (GPU and bf16 only); jax ResNet: a flax.linen ResNet v1.5 (NHWC, BatchNorm
  in training mode with its running averages as a mutable collection), the same jitted and
  donated step; torch GPT-2: a nanoGPT-style nn.Module (SDPA is_causal=True, tied head, loss
  inside forward) eager and `torch.compile`d; torch ResNet: a torchvision-style ResNet v1.5
  in channels-last with cudnn.benchmark, eager and `torch.compile`d; the MLPs: overhead.py's
  minimal loops. torch: autocast bf16, `torch.optim.Adam(fused=True)` (the default Adam where
  there is no fused kernel), `zero_grad(set_to_none=True)`.
  Same work as xbench: the preset's shapes, the core's initial weights (each loop's parameter
  count is printed beside xbench's, and must equal the core's), the core's data resident on
  the device with batch i = step mod batches, Adam with xbench.contract.ADAM's b1, b2, eps
  and the learning rate of configs/families.toml (1e-4; the MLPs xbench's default 1e-3), bf16
  mixed precision with float32 parameters and float32 loss, matmul precision as xbench sets it
  (jax_default_matmul_precision "bfloat16"/"tensorfloat32"; torch's TF32 flags), LayerNorm and
  BatchNorm epsilon 1e-5, GELU tanh, no dropout but the MLPs'.

Timing (benchmarks/_interleave.py). Every program is built before any runs (xbench's torch
prepare resets torch.compile's caches, which would throw away a program compiled earlier).
Then each program's first call (compilation, autotuning, first allocations) is timed on its
own and reported as "first call" (each torch.compile'd program starts from an empty inductor
cache, so none reuses kernels another compiled), and --warmup more steps run untimed; each program's steps
per window are calibrated so that its window lasts about --window-s (whole calls); then
--rounds rounds time one window of every program, in alternating order, each window ending
in a device sync. Settings that are global to a process (cuDNN's benchmark mode, TF32 flags,
jax's default matmul precision) are put back before each call as the program set them when
it was built, so that one program's settings never leak into another's windows.

Reported per configuration: each program's median ms/step, throughput in the family's unit
(tokens/s: global batch x context per step; images/s; samples/s), MFU (xbench.models'
FLOPs per sample x samples/s / xbench.results.peaks' dense peak for the device and precision;
"unknown" where there is none, as on CPUs), first-call seconds, and the ratio of its
throughput to the framework's reference minimal loop: the median over rounds of (reference
window / program window, per step) with a distribution-free interval (order statistics;
[min, max] with few rounds, its coverage printed). The reference is the first minimal loop of
the family, in table order, that ran: the expert's fastest (jax+cudnn, torch+compile, torch
compile+channels-last), else the next.

Acceptance (on a GPU; on a CPU the targets do not apply): GPT-2 small bf16 @ 16: the best
xbench jax program >= 0.95 x the minimal cuDNN-attention jax loop, xbench's torch plain+compile
>= 0.95 x the minimal compiled torch loop, and the best xbench program >= 37 % MFU; ResNet-50
bf16 @ 256 (224 x 224): the best xbench torch and the best xbench jax program each >= 0.95 x
the fastest minimal loop of its framework. "Best" is the highest median throughput; a check
compares by the paired per-round ratio, and a verdict marked "~" has the target inside its
interval. A check applies when its configuration and framework were asked for (not with
--precision or another batch); asked for but not measured, it misses. Exit status 0 when every
child ran and every check that applies here meets.

Cost. --deadline-s (default 570, under the device's 10-minute limit per command): a child
skips a program whose compilation would not fit before it, and no child starts too close to
it; the JSON (--out) is rewritten after every child, so a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _expert_child import child
from _expert_config import CPU_MODELS, GPU_MODELS, MARK, MODEL_GROUPS, Config, overridden, parse_model
from _expert_lineups import DATA_PARALLEL_PROGRAM, LINEUPS
from _interleave import child_records, paired_ratio

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax is imported: no preallocation
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off, as on the lent GPU machines

TARGET_RATIO = 0.95
TARGET_MFU = 0.37
DEFAULT_DEADLINE_S = 570.0
# Six rounds give the median's interval as [min, max] with 97 % coverage; windows of 0.4 s hold
# 5-10 steps of GPT-2 small or ResNet-50 on an H100.
ROUNDS, WINDOW_S, WARMUP = 6, 0.4, 3
QUICK_ROUNDS, QUICK_WINDOW_S, QUICK_WARMUP = 3, 0.05, 1
CHILD_START_S = 60.0  # no child starts with less time than this before the deadline


# -- the parent ------------------------------------------------------------------------------

def run_child(framework: str, group: str, configs: tuple[Config, ...], options: dict[str, Any],
              started: float) -> tuple[list[dict], int, str]:
    """One child process; its records, exit status and stderr. Progress is printed as it comes."""
    payload = {"framework": framework, "group": group, "configs": [asdict(c) for c in configs], "options": options}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(payload)]

    def show(record: dict) -> None:
        stamp = f"[{time.monotonic() - started:4.0f} s]"
        if record["kind"] == "progress":
            print(f"{stamp} {record['text']}", flush=True)
        elif record["kind"] == "header":
            print(f"{stamp} {framework} {record['version']} on {record['platform']}: {record['device']}", flush=True)
        elif record["kind"] == "result":
            print(f"{stamp} {framework} {record['label']} {record['precision']}: {summary_line(record)}", flush=True)
        elif record["kind"] == "error":
            print(f"{stamp} {framework} {record['label']}: failed: {record['error']}", flush=True)

    records, code, stderr = child_records(command, MARK, show)
    return [r for r in records if r["kind"] != "progress"], code, stderr


def summary_line(result: dict[str, Any]) -> str:
    timed = [p for p in result["programs"] if p["status"] == "timed"]
    others = len(result["programs"]) - len(timed)
    best = max((p for p in timed if p["kind"] == "xbench"), key=lambda p: p["throughput"], default=None)
    text = f"{len(timed)} programs timed ({others} not)"
    if best and best.get("ratio"):
        text += f"; best xbench {best['name']} = {best['ratio']['median']:.3f} x {result['reference']}"
    return text


def number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def print_configuration(result: dict[str, Any]) -> None:
    unit = result["unit"]
    peak = result["peak"]
    peak_text = (f"peak {peak['flops'] / 1e12:g} TFLOP/s ({peak['device']} {result['precision']})" if peak
                 else "no peak known (MFU unknown)")
    per_unit = result["flops_per_sample"] * result["config"]["batch"] / result["units_per_step"]
    print(f"\n{result['framework']} {result['label']} {result['precision']} on {result['device']}: "
          f"{result['units_per_step']:,} {unit}/step, {per_unit / 1e6:,.1f} MFLOP/{unit.rstrip('s')}, {peak_text}")
    print(f"  params (core) {result['params_core']:,}; reference: {result['reference'] or 'none ran'}; "
          f"{result['rounds']} rounds of ~{result['window_s']:g} s windows")
    print(f"  {'program':36s} {'params':>12s} {'ms/step':>9s} {unit + '/s':>12s} {'MFU':>6s} {'1st call':>8s}  "
          f"{'x reference [CI]':22s}")
    coverages = set()
    for p in result["programs"]:
        if p["status"] not in ("timed", "error") or "ms" not in p:
            why = p.get("reason") or ""
            print(f"  {p['name']:36s} {p['status']}: {why[:110]}")
            continue
        params = f"{p['params']:,}" + ("" if p["params"] == result["params_core"] else "!")
        mfu = "unknown" if p["mfu"] is None else f"{p['mfu']:.1%}"
        if p["name"] == result["reference"]:
            ratio = "reference"
        elif p.get("ratio"):
            r = p["ratio"]
            coverages.add(r["coverage"])
            ratio = f"{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
        else:
            ratio = "-"
        print(f"  {p['name']:36s} {params:>12s} {p['ms']:9.3f} {number(p['throughput']):>12s} {mfu:>6s} "
              f"{p.get('first_call_s', float('nan')):7.1f}s  {ratio}"
              + (f"  (failed later: {p['reason'][:60]})" if p["status"] == "error" else ""))
    for coverage in sorted(coverages):
        print(f"  [CI]: order-statistic interval of the per-round throughput ratios' median, coverage {coverage:.1%}"
              + (" (too few rounds for 95 %)" if coverage < 0.95 else ""))
    mismatched = [p["name"] for p in result["programs"] if "params" in p and p["params"] != result["params_core"]]
    if mismatched:
        print(f"  ! parameter count differs from the core's: {', '.join(mismatched)}")
    other_weights = [p["name"] for p in result["programs"] if p.get("weights_match") is False]
    if other_weights:
        print(f"  ! initial weights read back differ from the core's (hash): {', '.join(other_weights)}")


# -- acceptance ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """One acceptance check: a candidate's throughput over a reference's in one configuration
    (paired per-round ratio), or the best program's MFU."""

    title: str
    config: Config
    framework: str | None  # None: over every framework (the MFU check)
    candidate: str  # "best xbench" or a program's name
    reference: str | None = None  # a minimal loop's name, "fastest minimal", or None (MFU)
    target: float = TARGET_RATIO


CHECKS = (
    Check("GPT-2 small", MODEL_GROUPS["gpt2-small"][0], "jax", "best xbench", "minimal jax+cudnn"),
    Check("GPT-2 small", MODEL_GROUPS["gpt2-small"][0], "torch", "torch plain+compile", "minimal torch+compile"),
    Check("GPT-2 small", MODEL_GROUPS["gpt2-small"][0], None, "best xbench", None, TARGET_MFU),
    Check("ResNet-50", MODEL_GROUPS["resnet50"][0], "torch", "best xbench", "fastest minimal"),
    Check("ResNet-50", MODEL_GROUPS["resnet50"][0], "jax", "best xbench", "fastest minimal"),
)


def evaluate(check: Check, results: list[dict[str, Any]], requested: set[tuple[Config, str]],
             gpu: bool) -> dict[str, Any] | None:
    """The check's verdict; None when this invocation did not ask for its configuration and
    framework. Asked for but not measured (a child failed, the deadline): it misses on a GPU."""
    frameworks = {check.framework} if check.framework else {"jax", "torch"}
    if not any((check.config, framework) in requested for framework in frameworks):
        return None
    matching = [r for r in results if Config(**r["config"]) == check.config and r["framework"] in frameworks]
    if not matching:
        return {"verdict": "misses" if gpu else "n/a", "text": "not measured (see the children's output)"}
    if any(r["platform"] != "gpu" for r in matching):
        return {"verdict": "n/a", "text": "n/a on a CPU (the targets apply on a GPU)"}
    programs = [(r, p) for r in matching for p in r["programs"] if p["status"] == "timed"]
    if check.reference is None:
        return evaluate_mfu(check, programs)
    result = matching[0]
    by_name = {p["name"]: p for _, p in programs}
    candidate = (max((p for _, p in programs if p["kind"] == "xbench"), key=lambda p: p["throughput"], default=None)
                 if check.candidate == "best xbench" else by_name.get(check.candidate))
    reference = (max((p for _, p in programs if p["kind"] == "minimal"), key=lambda p: p["throughput"], default=None)
                 if check.reference == "fastest minimal" else by_name.get(check.reference))
    missing = [what for what, p in ((check.candidate, candidate), (check.reference, reference)) if p is None]
    if missing:
        why = "; ".join(f"{name}: {status_of(result, name)}" for name in missing)
        return {"verdict": "misses", "text": f"cannot measure ({why})"}
    ratio = paired_ratio(reference["per_step_s"], candidate["per_step_s"])
    label = candidate["name"] if check.candidate == candidate["name"] else f"{check.candidate} ({candidate['name']})"
    ref_label = reference["name"] if check.reference == reference["name"] else \
        f"{check.reference} ({reference['name']})"
    return verdict(f"{label} / {ref_label}", ratio, check.target, "{:.3f}")


def evaluate_mfu(check: Check, programs: list[tuple[dict, dict]]) -> dict[str, Any]:
    xbench = [(r, p) for r, p in programs if p["kind"] == "xbench"]
    if not xbench:
        return {"verdict": "misses", "text": "cannot measure (no xbench program was timed)"}
    result, best = max(xbench, key=lambda rp: rp[1]["mfu"] if rp[1]["mfu"] is not None else -1)
    if best["mfu"] is None:
        return {"verdict": "misses", "text": f"cannot measure (no peak known for {result['device']})"}
    low, high = best["mfu_interval"]
    return verdict(f"MFU of the best xbench program ({best['name']})",
                   {"median": best["mfu"], "low": low, "high": high}, check.target, "{:.1%}")


def status_of(result: dict[str, Any], name: str) -> str:
    if name in ("best xbench", "fastest minimal"):
        return "none was timed"
    found = next((p for p in result["programs"] if p["name"] == name), None)
    if found is None:
        return "not in the lineup"
    return f"{found['status']}" + (f": {found['reason'][:120]}" if found.get("reason") else "")


def verdict(what: str, ratio: dict[str, float], target: float, fmt: str) -> dict[str, Any]:
    meets = ratio["median"] >= target
    unsure = "~" if ratio["low"] <= target <= ratio["high"] else ""
    text = (f"{what} = {fmt.format(ratio['median'])} [{fmt.format(ratio['low'])}, {fmt.format(ratio['high'])}] "
            f">= {fmt.format(target)}: {'meets' if meets else 'misses'}{unsure}")
    return {"verdict": "meets" if meets else "misses", "unsure": bool(unsure), "value": ratio, "text": text}


def describe_check(check: Check) -> str:
    config = check.config
    where = f" ({check.framework})" if check.framework else ""
    return f"{check.title} {config.precision} @ {config.batch}{where}"


# -- main ------------------------------------------------------------------------------------

def gpu_expected(platform: str) -> bool:
    """Whether the children will find a GPU (judged without importing a framework)."""
    from xbench.run.environment import nvidia_gpus

    return platform == "gpu" or (platform == "auto" and bool(nvidia_gpus()))


def print_lineups() -> None:
    for framework, (xbench_programs, minimal_programs) in LINEUPS.items():
        print(f"{framework}:")
        for family in ("transformer", "cnn", "mlp"):
            names = [p.name for p in minimal_programs if p.family == family]
            names += [p.name(framework) + ("" if p.families is None or family in p.families else " (--programs)")
                      for p in xbench_programs]
            print(f"  {family}: {'; '.join(names)}")
    print(f"--dp adds {DATA_PARALLEL_PROGRAM.name('jax')!r} / {DATA_PARALLEL_PROGRAM.name('torch')!r}; models: "
          f"{', '.join(MODEL_GROUPS)} or PRESET:BATCH")


def write_json(path: Path | None, document: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1), encoding="utf-8")


def parent(args) -> int:
    from xbench.run.environment import host_environment

    started = time.monotonic()
    gpu = gpu_expected(args.platform)
    groups = [parse_model(m) for m in (args.models or (GPU_MODELS if gpu and not args.quick else CPU_MODELS))]
    groups = [(name, tuple(overridden(c, args.precision, args.image) for c in configs)) for name, configs in groups]
    options = {"platform": args.platform, "rounds": args.rounds, "window_s": args.window_s, "warmup": args.warmup,
               "samples": args.samples, "programs": args.programs, "dp": args.dp,
               "deadline": time.time() + args.deadline_s if args.deadline_s else None}
    print(f"expert loops: xbench's programs against minimal loops; models {', '.join(n for n, _ in groups)}; "
          f"frameworks {', '.join(args.frameworks)}; {args.rounds} rounds of ~{args.window_s:g} s windows"
          + (f"; deadline in {args.deadline_s:g} s" if args.deadline_s else ""), flush=True)
    document: dict[str, Any] = {"benchmark": "expert_loops", "arguments": {k: str(v) if isinstance(v, Path) else v
                                                                           for k, v in vars(args).items()},
                                "environment": host_environment(), "children": [], "results": [], "errors": []}
    failed = False
    for group, configs in groups:
        for framework in args.frameworks:
            if options["deadline"] and options["deadline"] - time.time() < CHILD_START_S:
                print(f"{framework} {group}: not started, too close to the deadline", flush=True)
                document["children"].append({"framework": framework, "group": group, "skipped": "deadline"})
                continue
            records, code, stderr = run_child(framework, group, configs, options, started)
            header = next((r for r in records if r["kind"] == "header"), None)
            document["children"].append({"framework": framework, "group": group, "exit_code": code,
                                         "header": header, "stderr_tail": stderr[-4000:]})
            document["results"] += [r for r in records if r["kind"] == "result"]
            document["errors"] += [r for r in records if r["kind"] == "error"]
            if code != 0 or header is None or any(r["kind"] == "error" for r in records):
                failed = True
                print(f"{framework} {group}: the child exited with status {code}; its stderr ends:\n"
                      f"{stderr[-3000:].rstrip()}", file=sys.stderr, flush=True)
            write_json(args.out, document)

    for result in document["results"]:
        print_configuration(result)
    requested = {(config, framework) for _, configs in groups for config in configs for framework in args.frameworks}
    ok = print_checks(document, requested, gpu)
    wall = time.monotonic() - started
    document["wall_s"] = wall
    print(f"wall: {wall:.0f} s")
    write_json(args.out, document)
    if args.out:
        print(f"results: {args.out}")
    return 0 if ok and not failed else 1


def print_checks(document: dict[str, Any], requested: set[tuple[Config, str]], gpu: bool) -> bool:
    """The acceptance lines; True when every check that applies here meets."""
    print("\nacceptance:")
    ok, any_shown = True, False
    document["checks"] = []
    for check in CHECKS:
        outcome = evaluate(check, document["results"], requested, gpu)
        if outcome is None:
            continue
        any_shown = True
        print(f"  {describe_check(check)}: {outcome['text']}")
        document["checks"].append({"check": asdict(check), **outcome})
        ok &= outcome["verdict"] in ("meets", "n/a")
    if not any_shown:
        print("  none applies: they need gpt2-small@16 and resnet50@256 (224 px) in bf16")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=None, metavar="MODEL",
                        help=f"groups ({', '.join(MODEL_GROUPS)}) or PRESET:BATCH; default {' '.join(GPU_MODELS)} "
                             f"on a GPU, {' '.join(CPU_MODELS)} on a CPU")
    parser.add_argument("--frameworks", nargs="+", choices=tuple(LINEUPS), default=list(LINEUPS))
    parser.add_argument("--programs", nargs="+", default=None, metavar="PATTERN",
                        help="time only programs whose names match (fnmatch, or a substring: 'cudnn', "
                             "'jax plain*'); the reference minimal loop always runs; see --list")
    parser.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default=None,
                        help="override every configuration's precision (the checks then do not apply)")
    parser.add_argument("--image", type=int, default=None, help="CNN image size, e.g. 32 for a CPU")
    parser.add_argument("--platform", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"interleaved windows per program (default {ROUNDS}; --quick {QUICK_ROUNDS})")
    parser.add_argument("--window-s", type=float, default=None,
                        help=f"seconds per window, about (default {WINDOW_S:g}; --quick {QUICK_WINDOW_S:g})")
    parser.add_argument("--warmup", type=int, default=None,
                        help=f"untimed steps after the first call (default {WARMUP}; --quick {QUICK_WARMUP})")
    parser.add_argument("--samples", type=int, default=None,
                        help="rows of data (default: 512, the MLPs 4096; at least two global batches)")
    parser.add_argument("--dp", action="store_true", help="also xbench's data-parallel program on one device")
    parser.add_argument("--deadline-s", type=float, default=DEFAULT_DEADLINE_S,
                        help=f"skip what would end later than this after the start (default {DEFAULT_DEADLINE_S:g}; "
                             "0: none)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: CPU-sized models, fewer and shorter windows")
    parser.add_argument("--list", action="store_true", help="print the programs of each framework and exit")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here too")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if args.list:
        print_lineups()
        return 0
    defaults = (QUICK_ROUNDS, QUICK_WINDOW_S, QUICK_WARMUP) if args.quick else (ROUNDS, WINDOW_S, WARMUP)
    args.rounds, args.window_s, args.warmup = (given if given is not None else default for given, default
                                               in zip((args.rounds, args.window_s, args.warmup), defaults))
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    for model in args.models or ():
        try:
            parse_model(model)
        except argparse.ArgumentTypeError as err:
            parser.error(str(err))
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
