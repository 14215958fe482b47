#!/usr/bin/env bash
# The GPU runs of "answers a user can act on", as run on the device machine: one step
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
#   benchmarks/gpu_intervals.sh seeds    3 invocations of the seed study's 1-device half as configured, run by run
#                                        into results/gpu-seeds (resumable likewise), then the analysis
#   benchmarks/gpu_intervals.sh fork     worker start-up with and without the fork server (5 processes of each
#                                        backend each), and jax's first call at each XLA autotuning level
set -uo pipefail
source "$(dirname "$0")/_gpu_setup.sh"

# runs DIR MIN_LEFT PLANTED COMPARE_ARGS...: invocations A, B, C (and, with PLANTED as
# BACKEND.extra_work=F, a planted run) of one `xbench compare`, run by run into DIR; a run starts
# only with MIN_LEFT s left of this call's $CALL_S (570 by default), one that finished leaves
# NAME.done, so a second call carrying DIR runs what the first had no time for; then the
# analysis of what finished.
CALL_S=${CALL_S:-570}
runs() {
  local dir=$1 min_left=$2 planted=$3; shift 3
  mkdir -p "$dir"
  local names=(A B C); [ -n "$planted" ] && names+=(planted)
  for name in "${names[@]}"; do
    [ -e "$dir/$name.done" ] && continue
    local left=$(( CALL_S - SECONDS )); [ "$left" -lt "$min_left" ] && break
    rm -rf "${dir:?}/$name"
    local extra=(); [ "$name" = planted ] && extra=(--option "$planted")
    local start=$SECONDS
    timeout "$left" xbench compare "$@" "${extra[@]}" --out "$dir/$name" >"$dir/$name.log" 2>&1
    local code=$?; echo "$name: exit $code after $((SECONDS - start)) s" | tee -a "$dir/walls.txt"
    [ "$code" = 0 ] && touch "$dir/$name.done"
  done
  local done_runs=0; for name in A B C; do [ -e "$dir/$name.done" ] || break; done_runs=$((done_runs + 1)); done
  local plant=(); [ -n "$planted" ] && [ -e "$dir/planted.done" ] && plant=(--planted "$planted")
  if [ "$done_runs" -ge 2 ] && [ "$SECONDS" -lt $(( CALL_S - 40 )) ]; then
    timeout 60 python3 benchmarks/repeatability.py --analyse-only --runs "$done_runs" "${plant[@]}" --out "$dir" \
      2>&1 | tee "$dir/repeat.txt"
  fi
  cp -r "$dir" "$out/run/"
}

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
    # call there compiles and autotunes for 14-37 s), jax and torch, the seed-study config's 2
    # replicates, no adaptive round; then a planted slowdown of jax. BATCH=8192 in the
    # environment: that batch; REPLICATES=3: that many replicates.
    batch=${BATCH:-16384}
    runs "results/gpu-bound${BATCH:+-$BATCH}" 150 jax.extra_work=0.2 --config configs/seed-study.toml \
      --backends jax torch --devices 1 --model large --global-batch "$batch" --samples 16384 --time-budget 0 --no-verify \
      ${REPLICATES:+--replicates "$REPLICATES"} ;;
  seeds)
    # The seed study's 1-device half as configured (verification, adaptive replicates), three
    # invocations: the wall time of each, and whether they agree.
    runs results/gpu-seeds 250 "" --config configs/seed-study.toml --backends jax torch --devices 1 ;;
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
  *) echo "usage: $0 seed|repeat|planted|bound|seeds|fork" >&2; exit 2 ;;
esac
