#!/usr/bin/env bash
# The GPU runs of issue 25 ("answers a user can act on"), as run on the device machine: one step
# per call, each within the machine's 10-minute limit, everything it writes packed into
# $OUT/results.tgz (only a few files come back from that machine).
#   benchmarks/gpu_intervals.sh seed     the seed study's 1-device half (jax, torch), timed; where a replicate's seconds go
#   benchmarks/gpu_intervals.sh repeat   3 invocations of the large seed model at a host-bound and a GPU-bound
#                                        batch, pairwise diffs, and a planted 20 % slowdown of jax
#   benchmarks/gpu_intervals.sh planted  jax alone, 4 replicates, then the same with a planted 20 % slowdown; diff
set -uo pipefail
source "$(dirname "$0")/_gpu_setup.sh"

case "${1:-}" in
  seed)
    start=$SECONDS
    timeout 330 xbench compare --config configs/seed-study.toml --backends jax torch --devices 1 \
      --out "$out/run/seed-1gpu" 2>&1 | tee "$out/run/seed-1gpu.log"
    echo "wall $((SECONDS - start)) s" | tee -a "$out/run/seed-1gpu.log"
    python3 benchmarks/replicate_cost.py "$out/run/seed-1gpu" 2>&1 | tee "$out/run/seed-1gpu-cost.txt" ;;
  repeat)
    timeout 570 python3 benchmarks/repeatability.py --runs 3 --planted jax.extra_work=0.2 --out "$out/run/repeat" \
      -- --config configs/seed-study.toml --backends jax torch --devices 1 --model large --batch-sizes 128,16384 \
      --samples 16384 --time-budget 20 --no-verify 2>&1 | tee "$out/run/repeat.txt" ;;
  planted)
    args=(--config configs/seed-study.toml --backends jax --devices 1 --model large --batch-sizes 128,4096
          --samples 4096 --replicates 4 --time-budget 0 --no-verify)
    timeout 260 xbench compare "${args[@]}" --out "$out/run/base" >"$out/run/base.log" 2>&1
    timeout 260 xbench compare "${args[@]}" --option jax.extra_work=0.2 --out "$out/run/planted" \
      >"$out/run/planted.log" 2>&1
    xbench diff "$out/run/base" "$out/run/planted" 2>&1 | tee "$out/run/diff-base-planted.txt"
    tail -3 "$out/run/base.log" "$out/run/planted.log" ;;
  *) echo "usage: $0 seed|repeat|planted" >&2; exit 2 ;;
esac
