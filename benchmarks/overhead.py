"""How much slower is xbench's step than the loop a user writes? Both timed in one process.

    python benchmarks/overhead.py --out results/overhead.json
    python benchmarks/overhead.py --frameworks jax --configs medium:128 large:65536 --precisions tf32
    python benchmarks/overhead.py --platform cpu --quick          # smoke test, < 1 min on a CPU

One child process per framework (jax and torch never share a process; the children run one
after the other), and in it, for each configuration (preset:global_batch) and precision, three
programs doing the same training work on the framework's first device:

- minimal: the loop written here, as a competent user writes it. jax: a plain jnp MLP (params
  a list of (kernel, bias) tuples), one `jax.jit` step per Python call with the state
  (params, optax.adam state, step counter) donated, dropout keys folded from one fixed key;
  torch: eager `nn.Sequential`, `torch.optim.Adam(fused=True)` (the default Adam where the
  device has no fused kernel), `zero_grad(set_to_none=True)`. Same model (the
  preset's MLP with ReLU and dropout p, xbench's initial weights), MSE loss, Adam (lr 1e-3,
  b1 0.9, b2 0.999, eps 1e-8), the same data resident on the device, and the batch index
  cycling as xbench's does (step k uses batch k mod batches, the step counter on the device
  for jax, a Python int for torch); matmul precision set alike for all three (jax:
  jax_default_matmul_precision; torch: matmul/cudnn allow_tf32 and
  set_float32_matmul_precision "high" or "highest").
- plain: xbench's plain single-device program through its backend (`setup(1, platform)`,
  `prepare(Trial(..., program="plain"), work)`, `run(prepared, steps)`).
- data-parallel: xbench's data-parallel program on one device (jax: pmap over 1 device;
  torch: DDP over a 1-process group), to show what going data-parallel at all costs.

Timing: each program is warmed up (compilation plus a few steps), the steps per window are
calibrated so the fastest program's window lasts about --window-s (0.2 s), then --rounds
rounds (default 20 on a GPU, 10 on a CPU) each time one window of every program, in
alternating order (plain, minimal, dp; then dp, minimal, plain; ...) so that drift falls on
all alike. Every window ends with a device sync (jax: block_until_ready on the state; torch:
torch.cuda.synchronize on CUDA); per-step time = window time / steps. Reported: median
ms/step of each program and, for plain/minimal and dp/minimal, the median of the per-round
ratios (a round's windows are adjacent, so drift cancels) with a distribution-free interval
(order statistics: 95 % or the nearest coverage above it; with too few rounds, as with
--quick, [min, max] and its lower coverage). The JSON also holds every window and the ratio
of the medians ("ratio_plain_of_medians"). A verdict marked "~" has the target inside that
interval: more --rounds would settle it.

Targets (issue: xbench's plain step costs no more than the minimal loop): plain/minimal
<= 1.05 at medium @ 128 and <= 1.02 at large @ 65,536, in tf32 and fp32, on a GPU. On a CPU
the figures only show whether xbench adds overhead of its own, and the default configurations
are medium:128 large:256 (large @ 65,536 takes seconds per step there). Exit status 0 when
every child ran and, on a GPU, every targeted ratio meets its target; 1 otherwise.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

from _interleave import (  # shared with expert_loops.py (the script's directory is on sys.path)
    child_records,
    median_interval,
    timed,
)

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax is imported: no preallocation
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off, as on the lent GPU machines

MARK = "OVERHEAD-JSON "  # the children's result lines start with this
TARGETS = {("medium", 128): 1.05, ("large", 65536): 1.02}
GPU_CONFIGS = ["medium:128", "large:65536"]
CPU_CONFIGS = ["medium:128", "large:256"]
LEARNING_RATE = 1e-3
SEED = 0


# -- timing, shared by both children ---------------------------------------------------------

def calibrate(runners: dict, window_s: float) -> tuple[int, dict[str, float]]:
    """Steps per window so that the fastest program's window lasts about `window_s`."""
    per_step = {}
    for name, run in runners.items():
        steps = 1
        while True:
            elapsed = timed(run, steps)
            if elapsed >= window_s / 4 or steps >= 1 << 16:
                break
            steps *= 2
        per_step[name] = elapsed / steps
    return max(1, math.ceil(window_s / min(per_step.values()))), per_step


def interleave(runners: dict, warmup: int, rounds: int, window_s: float) -> dict:
    """Warm every program up, calibrate, and time `rounds` rounds of one window each."""
    for run in runners.values():
        run(1)  # compilation (jax) or the first allocations (torch)
        run(warmup)
    steps, calibration = calibrate(runners, window_s)
    names = list(runners)
    per_step: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            gc.collect()
            per_step[name].append(timed(runners[name], steps) / steps)
    result = {"steps_per_window": steps, "rounds": rounds,
              "calibration_ms": {k: v * 1e3 for k, v in calibration.items()},
              "windows_ms": {k: [v * 1e3 for v in vs] for k, vs in per_step.items()},
              "ms": {k: statistics.median(vs) * 1e3 for k, vs in per_step.items()}}
    for name in ("plain", "dp"):
        if name not in per_step:
            continue
        pairs = [a / b for a, b in zip(per_step[name], per_step["minimal"])]
        low, high, coverage = median_interval(pairs)
        result[f"ratio_{name}"] = statistics.median(pairs)
        result[f"ratio_{name}_of_medians"] = statistics.median(per_step[name]) / statistics.median(per_step["minimal"])
        result[f"ratio_{name}_interval"] = [low, high]
        result["interval_coverage"] = coverage
    return result


def emit(record: dict) -> None:
    print(MARK + json.dumps(record), flush=True)


def trial_for(backend: str, preset: str, batch: int, precision: str, platform: str, samples: int,
              program: str):
    from xbench.contract import Trial
    from xbench.contract.timing import TimingProtocol

    return Trial(backend=backend, model=model_spec(preset, batch), devices=1, global_batch=batch,
                 scaling="strong", precision=precision, platform=platform, learning_rate=LEARNING_RATE,
                 seed=SEED, samples=samples, protocol=TimingProtocol(), program=program)


def model_spec(preset: str, batch: int):
    from xbench.models.model_spec import PRESETS, ModelSpec

    p = PRESETS[preset]
    return ModelSpec(name=preset, widths=tuple(p["widths"]), dropout=float(p["dropout"]), batch_sizes=(batch,))


def samples_for(batch: int, samples: int | None) -> int:
    """The data set: --samples, or 4096 rows (xbench's default) and at least two global batches."""
    return samples if samples else max(4096, 2 * batch)


def time_configs(args, framework: str, backend, configs: list[str], rounds: int, make_minimal, extra,
                 cleanup=None) -> None:
    """For each configuration and precision: xbench's plain and data-parallel programs through
    `backend` and the minimal loop (`make_minimal(work, batch, precision)` -> (run, params,
    precision read back)), timed by `interleave`; one result (or error) record each, with
    `extra(prepared)` added."""
    from xbench.contract import DATA_PARALLEL, PLAIN
    from xbench.contract.work import build_work

    for config in configs:
        preset, batch = parse_config(config)
        samples = samples_for(batch, args.samples)
        work = build_work(model_spec(preset, batch), samples, SEED)
        for precision in args.precisions:
            where = {"framework": framework, "config": config, "precision": precision}
            prepared, runners, minimal = {}, None, None
            try:
                for name, program in (("plain", PLAIN), ("dp", DATA_PARALLEL)):
                    trial = trial_for(framework, preset, batch, precision, args.platform, samples, program)
                    prepared[name] = backend.prepare(trial, work)
                minimal, params, minimal_precision = make_minimal(work, batch, precision)
                runners = {"plain": lambda s, p=prepared["plain"]: backend.run(p, s), "minimal": minimal,
                           "dp": lambda s, p=prepared["dp"]: backend.run(p, s)}
                result = interleave(runners, args.warmup, rounds, args.window_s)
                emit({"kind": "result", **where, "samples": samples, **result,
                      "params": {"minimal": params, **{k: v.info.params for k, v in prepared.items()}},
                      "precision_readback": {"minimal": minimal_precision,
                                             **{k: v.info.precision for k, v in prepared.items()}},
                      **extra(prepared)})
            except Exception as err:  # one failing combination does not stop the others
                traceback.print_exc()
                emit({"kind": "error", **where, "error": f"{type(err).__name__}: {err}"})
            finally:
                prepared = runners = minimal = None
                gc.collect()
                if cleanup is not None:
                    cleanup()


# -- jax child -----------------------------------------------------------------------------

JAX_PRECISION = {"tf32": "tensorfloat32", "fp32": "float32"}


def jax_minimal(work, batch: int, precision: str, device):
    """The minimal loop: plain jnp MLP, optax.adam, one jitted step per call, state donated."""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    jax.config.update("jax_default_matmul_precision", JAX_PRECISION[precision])
    rate = work.model.dropout
    tx = optax.adam(LEARNING_RATE, b1=0.9, b2=0.999, eps=1e-8)
    params = [(jnp.asarray(k), jnp.asarray(b)) for k, b in work.weights]
    params = jax.device_put(params, device)
    state = (params, tx.init(params), jax.device_put(np.int32(0), device))
    xs, ys = (jax.device_put(a[0], device) for a in work.shards(batch, 1))
    key = jax.device_put(jax.random.key(SEED), device)
    batches = xs.shape[0]

    def loss_fn(params, x, y, rng):
        for i, (w, b) in enumerate(params[:-1]):
            x = jax.nn.relu(x @ w + b)
            keep = jax.random.bernoulli(jax.random.fold_in(rng, i), 1 - rate, x.shape)
            x = jnp.where(keep, x / (1 - rate), 0)
        w, b = params[-1]
        return jnp.mean((x @ w + b - y) ** 2)

    @functools.partial(jax.jit, donate_argnums=0)
    def train_step(state, xs, ys, key):
        params, opt_state, step = state
        i = step % batches
        loss, grads = jax.value_and_grad(loss_fn)(params, xs[i], ys[i], jax.random.fold_in(key, step))
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, step + 1), loss

    holder = {"state": state}

    def run(steps: int) -> None:
        state = holder["state"]
        for _ in range(steps):
            state, loss = train_step(state, xs, ys, key)
        holder["state"] = state
        jax.block_until_ready(state)

    count = sum(int(a.size) for a in jax.tree.leaves(params))
    return run, count, {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision}


def jax_child(args) -> None:
    from xbench.contract import PLAIN, programs_of
    from xbench_backends.jax.pmap import JaxPmapBackend

    backend = JaxPmapBackend()
    info = backend.setup(1, args.platform)
    import jax

    device = backend.devices[0]
    configs, note = resolve_configs(args.configs, device.platform)
    rounds = resolve_rounds(args.rounds, device.platform)
    emit({"kind": "header", "framework": "jax", "version": jax.__version__, "platform": device.platform,
          "device": device.device_kind, "details": info.details, "configs": configs, "configs_note": note,
          "rounds": rounds, "window_s": args.window_s, "plain_offered": PLAIN in programs_of(backend)})
    time_configs(args, "jax", backend, configs, rounds,
                 lambda work, batch, precision: jax_minimal(work, batch, precision, device),
                 lambda prepared: {"sync_every_call": {k: v.info.sync_every_call for k, v in prepared.items()}})


# -- torch child ---------------------------------------------------------------------------

# (cuda matmul allow_tf32, cudnn allow_tf32, float32 matmul precision), as a user sets them.
TORCH_PRECISION = {"tf32": (True, True, "high"), "fp32": (False, False, "highest")}


def torch_adam(params, torch):
    """Adam with the fused kernel where torch has one for the device, else torch's default."""
    kwargs = {"lr": LEARNING_RATE, "betas": (0.9, 0.999), "eps": 1e-8}
    params = list(params)
    try:
        return torch.optim.Adam(params, fused=True, **kwargs), True
    except (RuntimeError, ValueError):
        return torch.optim.Adam(params, **kwargs), False


def torch_minimal(work, batch: int, precision: str, device):
    """The minimal loop: eager nn.Sequential, fused Adam, the batch index a Python int."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    matmul_tf32, cudnn_tf32, matmul_precision = TORCH_PRECISION[precision]
    torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    torch.set_float32_matmul_precision(matmul_precision)
    torch.manual_seed(SEED)
    layers: list = []
    for i, (kernel, bias) in enumerate(work.weights):
        linear = nn.Linear(kernel.shape[0], kernel.shape[1], device=device)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
            linear.bias.copy_(torch.from_numpy(bias))
        layers.append(linear)
        if i < len(work.weights) - 1:
            layers += [nn.ReLU(), nn.Dropout(work.model.dropout)]
    model = nn.Sequential(*layers).train()
    optimizer, fused = torch_adam(model.parameters(), torch)
    xs, ys = (torch.from_numpy(a[0]).to(device) for a in work.shards(batch, 1))
    batches = xs.shape[0]
    cuda = device.type == "cuda"
    counter = {"step": 0}

    def run(steps: int) -> None:
        step = counter["step"]
        for _ in range(steps):
            i = step % batches
            optimizer.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(xs[i]), ys[i])
            loss.backward()
            optimizer.step()
            step += 1
        counter["step"] = step
        if cuda:
            torch.cuda.synchronize(device)

    readback = {"cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
                "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
                "float32_matmul_precision": torch.get_float32_matmul_precision(), "adam_fused": fused}
    return run, sum(p.numel() for p in model.parameters()), readback


def torch_child(args) -> None:
    import torch

    from xbench.contract import PLAIN, programs_of
    from xbench_backends.torch.ddp import TorchDdpBackend

    backend = TorchDdpBackend()
    info = backend.setup(1, args.platform)
    device = backend.device
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        import platform

        name = platform.processor() or platform.machine() or "cpu"
    configs, note = resolve_configs(args.configs, "gpu" if device.type == "cuda" else "cpu")
    rounds = resolve_rounds(args.rounds, "gpu" if device.type == "cuda" else "cpu")
    plain_offered = PLAIN in programs_of(backend)
    emit({"kind": "header", "framework": "torch", "version": torch.__version__,
          "platform": "gpu" if device.type == "cuda" else "cpu", "device": name, "details": info.details,
          "configs": configs, "configs_note": note, "rounds": rounds, "window_s": args.window_s,
          "plain_offered": plain_offered})
    cleanup = torch.cuda.empty_cache if device.type == "cuda" else None
    time_configs(args, "torch", backend, configs, rounds,
                 lambda work, batch, precision: torch_minimal(work, batch, precision, device),
                 lambda prepared: {
                     "plain_is_ddp": (type(getattr(prepared["plain"], "ddp", None)).__name__
                                      == "DistributedDataParallel"),
                     "plain_notes": list(prepared["plain"].info.notes)},
                 cleanup)
    backend.teardown()


# -- configurations ------------------------------------------------------------------------

def parse_config(text: str) -> tuple[str, int]:
    from xbench.models.model_spec import PRESETS

    preset, _, batch = text.partition(":")
    if preset not in PRESETS or not batch.isdigit() or int(batch) < 1:
        raise argparse.ArgumentTypeError(f"config {text!r}: write PRESET:GLOBAL_BATCH with PRESET one of "
                                         f"{', '.join(PRESETS)}, e.g. medium:128")
    return preset, int(batch)


def config_arg(text: str) -> str:
    parse_config(text)
    return text


def resolve_rounds(given: int | None, platform: str) -> int:
    """Host-bound steps (medium @ 128 on a GPU) vary by 10-20 % from window to window: 20
    rounds there; 10 on a CPU, where steps are long."""
    return given or (10 if platform == "cpu" else 20)


def resolve_configs(given: list[str] | None, platform: str) -> tuple[list[str], str | None]:
    if given:
        return given, None
    if platform == "cpu":
        return CPU_CONFIGS, (f"on a CPU the default configurations are {' '.join(CPU_CONFIGS)} "
                             f"(large @ 65,536 takes seconds per step here; pass --configs to choose)")
    return GPU_CONFIGS, None


# -- parent --------------------------------------------------------------------------------

def run_child(framework: str, args) -> tuple[list[dict], int, str]:
    """One child process; its JSON records, exit status and stderr."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", framework, "--platform", args.platform,
               "--precisions", *args.precisions, "--window-s", str(args.window_s), "--warmup", str(args.warmup)]
    if args.rounds:
        command += ["--rounds", str(args.rounds)]
    if args.configs:
        command += ["--configs", *args.configs]
    if args.samples:
        command += ["--samples", str(args.samples)]
    started = time.monotonic()

    def show(record: dict) -> None:
        if record["kind"] == "header":
            print_header(record)
        elif record["kind"] == "result":
            print(f"  {framework} {record['config']} {record['precision']}: plain/minimal "
                  f"{record['ratio_plain']:.3f}, dp/minimal {record['ratio_dp']:.3f} "
                  f"({record['steps_per_window']} steps per window; {time.monotonic() - started:.0f} s)",
                  flush=True)
        elif record["kind"] == "error":
            print(f"  {framework} {record['config']} {record['precision']}: failed: {record['error']}", flush=True)

    return child_records(command, MARK, show)


def print_header(header: dict) -> None:
    extras = ", ".join(f"{k} {header['details'][k]}" for k in ("jaxlib", "flax", "optax", "cuda", "nccl")
                       if k in header["details"])
    print(f"{header['framework']} {header['version']}" + (f" ({extras})" if extras else "")
          + f" on {header['platform']}: {header['device']}; {header['rounds']} rounds of ~{header['window_s']:g} s "
          f"windows per program", flush=True)
    if header.get("configs_note"):
        print(f"  note: {header['configs_note']}")
    if not header.get("plain_offered"):
        print(f"  note: the {header['framework']} backend does not list the plain program")


def ms(value: float) -> str:
    return f"{value:.4f}" if value < 1 else f"{value:.3f}" if value < 100 else f"{value:.1f}"


def ratio(r: dict, name: str) -> str:
    low, high = r[f"ratio_{name}_interval"]
    return f"{r[f'ratio_{name}']:.3f} [{low:.3f}, {high:.3f}]"


def print_table(headers: list[dict], results: list[dict]) -> bool:
    """The table; True when every targeted plain ratio meets its target (GPU runs only)."""
    platform = {h["framework"]: h["platform"] for h in headers}
    print(f"\n{'framework':9s} {'model@batch':13s} {'prec':4s} {'minimal':>9s} {'plain':>9s} "
          f"{'plain/minimal [CI]':>24s} {'target':14s} {'dp(1 dev)':>9s} {'dp/minimal [CI]':>24s}")
    print(f"{'':9s} {'':13s} {'':4s} {'ms/step':>9s} {'ms/step':>9s} {'':>24s} {'':14s} {'ms/step':>9s}")
    ok, coverages, footnotes = True, set(), set()
    for r in results:
        preset, batch = parse_config(r["config"])
        target = TARGETS.get((preset, batch))
        verdict = "-"
        if target is not None:
            meets = r["ratio_plain"] <= target
            low, high = r["ratio_plain_interval"]
            unsure = "~" if low <= target <= high else ""
            verdict = f"{'meets' if meets else 'misses'}{unsure} <={target:.2f}"
            if platform.get(r["framework"]) == "gpu":
                ok &= meets
        plain_mark = ""
        if r.get("plain_is_ddp"):
            plain_mark = "*"
            footnotes.add("* the torch backend ignored program=\"plain\": its 'plain' column is DDP over 1 process")
        if r.get("sync_every_call", {}).get("dp"):
            plain_mark_dp = "+"
            footnotes.add("+ xbench's jax data-parallel program waits for every call on CPU devices "
                          "(lest the all-reduce deadlock)")
        else:
            plain_mark_dp = ""
        coverages.add(r["interval_coverage"])
        print(f"{r['framework']:9s} {preset + '@' + str(batch):13s} {r['precision']:4s} {ms(r['ms']['minimal']):>9s} "
              f"{ms(r['ms']['plain']) + plain_mark:>9s} {ratio(r, 'plain'):>24s} {verdict:14s} "
              f"{ms(r['ms']['dp']) + plain_mark_dp:>9s} {ratio(r, 'dp'):>24s}")
    for coverage in sorted(coverages):
        print(f"[CI]: order-statistic interval of the per-round ratios' median, coverage {coverage:.1%}"
              + (" (too few rounds for 95 %)" if coverage < 0.95 else "")
              + "; ~: the target lies inside it")
    print("ratios: median over rounds of (window / the same round's minimal window)")
    for footnote in sorted(footnotes):
        print(footnote)
    if any(p != "gpu" for p in platform.values()):
        print("targets apply on a GPU; on a CPU 'meets'/'misses' only shows whether xbench adds overhead")
    return ok


def parent(args) -> int:
    started = time.monotonic()
    headers, results, errors, failed = [], [], [], False
    print("overhead: xbench's plain step against a minimal loop, one process per framework")
    for framework in args.frameworks:
        records, code, stderr = run_child(framework, args)
        header = next((r for r in records if r["kind"] == "header"), None)
        if header:
            headers.append(header)
        results += [r for r in records if r["kind"] == "result"]
        errors += [r for r in records if r["kind"] == "error"]
        if code != 0 or any(r["kind"] == "error" for r in records) or header is None:
            failed = True
            print(f"{framework}: the child process exited with status {code}; its stderr:\n{stderr.rstrip()}",
                  file=sys.stderr)
    if results:
        ok = print_table(headers, results)
    else:
        ok = False
    wall = time.monotonic() - started
    print(f"wall: {wall:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"arguments": {k: (str(v) if isinstance(v, Path) else v)
                                                      for k, v in vars(args).items()},
                                        "headers": headers, "results": results, "errors": errors,
                                        "targets": {f"{p}:{b}": t for (p, b), t in TARGETS.items()},
                                        "wall_s": wall}, indent=1), encoding="utf-8")
        print(f"results: {args.out}")
    return 0 if ok and not failed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", nargs="+", choices=("jax", "torch"), default=["jax", "torch"])
    parser.add_argument("--configs", nargs="+", type=config_arg, default=None, metavar="PRESET:BATCH",
                        help=f"default: {' '.join(GPU_CONFIGS)} on a GPU, {' '.join(CPU_CONFIGS)} on a CPU")
    parser.add_argument("--precisions", nargs="+", choices=tuple(JAX_PRECISION), default=["tf32", "fp32"])
    parser.add_argument("--platform", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument("--rounds", type=int, default=None,
                        help="windows per program, interleaved (default 20 on a GPU, 10 on a CPU)")
    parser.add_argument("--window-s", type=float, default=0.2, help="seconds per window, about (default 0.2)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps after the first call (default 5)")
    parser.add_argument("--samples", type=int, default=None,
                        help="rows of data (default: 4096, at least two global batches)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of ~0.02 s windows: a smoke test")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here too")
    parser.add_argument("--child", choices=("jax", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.window_s, args.warmup = args.rounds or 3, 0.02, 1
    if args.rounds is not None and args.rounds < 2:
        parser.error("--rounds must be at least 2")
    if args.child:
        from xbench.contract import DeviceUnavailable

        try:
            (jax_child if args.child == "jax" else torch_child)(args)
        except DeviceUnavailable as err:
            print(f"{args.child}: {err}", file=sys.stderr)
            return 1
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
