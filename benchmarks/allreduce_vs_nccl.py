"""Does xbench's all-reduce measurement reach NCCL's own figure? Both measured in one run.

Runs the torch.distributed NCCL reference (benchmarks/nccl_reference.py) and then
`xbench allreduce` for a backend on the same GPUs and sizes, and prints busbw side by side
with the ratio; the target is a ratio of at least 0.9 at 1 GiB.

    python benchmarks/allreduce_vs_nccl.py --backend jax --sizes 217612 8085516 64MiB 1GiB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = 0.9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="jax")
    parser.add_argument("--sizes", nargs="+", default=["1GiB"])
    parser.add_argument("--gpus", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    reference = json.loads(subprocess.run(
        [sys.executable, os.path.join(HERE, "nccl_reference.py"), "--gpus", str(args.gpus), "--sizes", *args.sizes],
        check=True, capture_output=True, text=True, env=env).stdout)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "xbench.json")
        subprocess.run([sys.executable, "-m", "xbench", "allreduce", "--backends", args.backend,
                        "--devices", str(args.gpus), "--sizes", *args.sizes, "--json", out],
                       check=True, env=env, cwd=os.path.dirname(HERE))
        measured = {r["nbytes"]: r for r in json.load(open(out))}
    print(f"\n{'size (bytes)':>14} {'NCCL busbw':>11} {args.backend + ' busbw':>12} {'ratio':>7}")
    worst = None
    for ref in reference:
        mine = measured.get(ref["nbytes"], {})
        ratio = mine.get("busbw_GBps", 0.0) / ref["busbw_GBps"]
        print(f"{ref['nbytes']:>14,} {ref['busbw_GBps']:>9.1f} GB/s "
              f"{mine.get('busbw_GBps', 0.0):>7.1f} GB/s {ratio:>7.3f}")
        if ref["nbytes"] >= 2**30:
            worst = ratio if worst is None else min(worst, ratio)
    if worst is not None:
        verdict = "meets" if worst >= TARGET else "misses"
        print(f"at >= 1 GiB: ratio {worst:.3f}, {verdict} the target of {TARGET}")
        return 0 if worst >= TARGET else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
