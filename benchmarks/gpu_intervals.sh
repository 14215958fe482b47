#!/usr/bin/env bash
# The GPU runs of issue 25 ("answers a user can act on"), as run on the device machine: one step
# per call, each within the machine's 10-minute limit, everything it writes packed into
# $OUT/results.tgz (only a few files come back from that machine).
#   benchmarks/gpu_intervals.sh seed [NAME [ARGS]]  the seed study's 1-device half (jax, torch), timed; where a
#                                        replicate's seconds go; torch's first seconds in forked workers
#   benchmarks/gpu_intervals.sh repeat   3 invocations of the large seed model at a host-bound and a GPU-bound
#                                        batch, pairwise diffs, and a planted 20 % slowdown of jax
#   benchmarks/gpu_intervals.sh planted  jax alone, 4 replicates, then the same with a planted 20 % slowdown; diff
#   benchmarks/gpu_intervals.sh bound    3 invocations and a planted 20 % slowdown of jax on GPU-bound rows, run
#                                        by run into results/gpu-bound (a second call carrying that folder runs
#                                        what the first had no time for), then the analysis
#   benchmarks/gpu_intervals.sh fork     worker start-up with and without the fork server (5 processes of each
#                                        backend each), and jax's first call at each XLA autotuning level
set -uo pipefail
source "$(dirname "$0")/_gpu_setup.sh"

case "${1:-}" in
  seed)
    # seed [NAME [COMPARE ARGS...]]: XBENCH_WORKER_START=exec in the environment times the
    # workers started from scratch (the fork server's baseline)
    name=${2:-seed-1gpu}; shift $(( $# > 1 ? 2 : 1 ))
    start=$SECONDS
    timeout 330 xbench compare --config configs/seed-study.toml --backends jax torch --devices 1 "$@" \
      --out "$out/run/$name" 2>&1 | tee "$out/run/$name.log"
    echo "wall $((SECONDS - start)) s" | tee -a "$out/run/$name.log"
    python3 benchmarks/replicate_cost.py "$out/run/$name" 2>&1 | tee "$out/run/$name-cost.txt"
    # where torch's per-process seconds before its first step go, forked as the fork server does
    [ -n "${NO_PROBE:-}" ] || timeout 90 python3 benchmarks/first_call.py --backend torch --model large --batch 64 --samples 2 --fork \
      >"$out/run/$name-torch-fork.txt" 2>&1 ;;
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
  bound)
    # The large seed model at global batch 16,384 (GPU-bound on an H100 or H200; jax's first
    # call there compiles and autotunes for 14-32 s, so one batch is what four runs' time
    # allows), jax and torch, the GPU default of 3 replicates, no adaptive round. A run starts
    # only with 150 s left of this call's 570; one that finished leaves NAME.done.
    dir=results/gpu-bound; mkdir -p "$dir"
    args=(--config configs/seed-study.toml --backends jax torch --devices 1 --model large
          --global-batch 16384 --samples 16384 --time-budget 0 --no-verify)
    for name in A B C planted; do
      [ -e "$dir/$name.done" ] && continue
      left=$(( 570 - SECONDS )); [ "$left" -lt 150 ] && break
      rm -rf "${dir:?}/$name"
      extra=(); [ "$name" = planted ] && extra=(--option jax.extra_work=0.2)
      start=$SECONDS
      timeout "$left" xbench compare "${args[@]}" "${extra[@]}" --out "$dir/$name" >"$dir/$name.log" 2>&1
      code=$?; echo "$name: exit $code after $((SECONDS - start)) s" | tee -a "$dir/walls.txt"
      [ "$code" = 0 ] && touch "$dir/$name.done"
    done
    runs=0; for name in A B C; do [ -e "$dir/$name.done" ] || break; runs=$((runs + 1)); done  # A, B, ... in order
    if [ -e "$dir/planted.done" ] && [ "$runs" -ge 2 ] && [ "$SECONDS" -lt 530 ]; then
      timeout 60 python3 benchmarks/repeatability.py --analyse-only --runs "$runs" --planted jax.extra_work=0.2 \
        --out "$dir" 2>&1 | tee "$dir/repeat.txt"
    fi
    cp -r "$dir" "$out/run/" ;;
  fork)
    args=(--config configs/seed-study.toml --backends jax torch --devices 1 --model medium --batch-sizes 64
          --replicates 5 --time-budget 0 --no-verify)
    for mode in exec fork; do
      XBENCH_WORKER_START=$mode timeout 200 xbench compare "${args[@]}" --out "$out/run/start-$mode" \
        >"$out/run/start-$mode.log" 2>&1
      echo "== XBENCH_WORKER_START=$mode"; python3 benchmarks/replicate_cost.py "$out/run/start-$mode"
    done 2>&1 | tee "$out/run/start.txt"
    for level in 4 3 2 1 0; do
      XLA_FLAGS=--xla_gpu_autotune_level=$level timeout 90 python3 benchmarks/first_call.py --backend jax \
        --model large --batch 128 --samples 2 --steps 500 | sed "s/^/level $level /"
    done 2>&1 | tee "$out/run/autotune.txt" ;;
  *) echo "usage: $0 seed|repeat|planted|bound|fork" >&2; exit 2 ;;
esac
