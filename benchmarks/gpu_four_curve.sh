#!/usr/bin/env bash
# Four GPUs, the curve past two, in calls of at most 9.5 minutes on one machine:
#
#   part a: the all-reduce at 2 GPUs beside a plain NCCL loop (jax, torch; 4 GPUs: the first
#           four-GPU call, results/2026-11-27-h100x4-first-four); the MLP sweeps that
#           `benchmarks/predict_heldout.py --fit-devices 2` fits on 1 and 2 GPUs and checks
#           against the 4-GPU rows (1 M and 30 M parameters x per-device batches 256, 2048,
#           16384 x 1, 2, 4 GPUs, compute-only twins, the all-reduce); `--devices 8` on this
#           machine (bad input: one line naming the devices found).
#   part b: scaling-wide's 50 M MLP at global batch 32,768, jax, jax-shardmap and torch on
#           1, 2 and 4 GPUs, verification on, compute-only twins (--breakdown).
#   part c: the families' GPT-2 small in bf16 on 1, 2 and 4 GPUs, jax and torch, with MFU,
#           verification on.
#   part d: what part c left unfinished (`--resume`), then the seed study on 1, 2 and 4 GPUs,
#           jax and torch, one run per model (the planned replicates only; its 1-GPU half alone
#           took 200-300 s on one H100); send it again to the same warm machine to finish.
#
# Each step runs under its own timeout with SIGINT: an interrupted run keeps its records and
# `--resume DIR` finishes it. Everything is packed into $OUT/results.tgz.
#   bash benchmarks/gpu_four_curve.sh a|b|c|d
set -uo pipefail
part=${1:?part a, b, c or d}
source "$(dirname "$0")/_gpu_setup.sh"
export NCCL_NVLS_ENABLE=0 COLUMNS=120  # NVLink multicast off (the device notes); a 120-column terminal



case $part in
a)
  timeout 30 sh -c 'nvidia-smi topo -m; xbench env' >"$out/run/env.txt" 2>&1
  for backend in jax torch; do
    step "allreduce-$backend-2" 60 python3 benchmarks/allreduce_vs_nccl.py --backend "$backend" --gpus 2 --sizes 256MiB 1GiB
  done
  step devices-8 40 xbench compare --backends torch --model medium --devices 8 --no-verify --out "$out/run/devices-8"
  # the sweeps live on the machine's disk, so that part b, sent at once to the same warm
  # machine, can finish one that ran out of time; their copies travel back with this call
  mkdir -p "$keep"
  step sweep-jax 190 xbench sweep --backends jax --params 1e6 3e7 --per-device-batch 256 2048 16384 \
    --devices 1 2 4 --replicates 2 --window-budget 0.5 --no-verify --out "$keep/sweep-jax"
  step sweep-torch 150 xbench sweep --backends torch --params 1e6 3e7 --per-device-batch 256 2048 16384 \
    --devices 1 2 4 --replicates 2 --window-budget 0.5 --no-verify --out "$keep/sweep-torch"
  cp -r "$keep"/sweep-* "$out/run/"
  ;;
b)
  for backend in jax torch; do  # an unfinished sweep of part a, when this is the same machine
    if [ -d "$keep/sweep-$backend" ] && [ ! -f "$keep/sweep-$backend/fit.json" ]; then
      step "sweep-$backend-resume" $((450 - SECONDS)) xbench sweep --resume "$keep/sweep-$backend"
      cp -r "$keep/sweep-$backend" "$out/run/"
    fi
  done
  step wide-50m $((550 - SECONDS)) xbench compare --config configs/scaling-wide.toml --backends jax jax-shardmap torch \
    --model wide-50m --global-batch 32768 --devices 1 2 4 --breakdown --replicates 2 --time-budget 0 ${WIDE_FLAGS:-} \
    --out "$out/run/wide-50m"
  ;;
c|d)  # each run lives on the machine's disk: the next call, sent at once to the same warm
  # machine, finishes what this one's time cut short (`--resume`), then starts the rest
  timeout 30 sh -c 'nvidia-smi topo -m; nvidia-smi -q -d PERFORMANCE,POWER | head -60; xbench env' >"$out/run/env.txt" 2>&1
  for name in gpt2-small seed-medium seed-large; do
    [ "$part" = c ] && [ "$name" != gpt2-small ] && break
    case $name in
      gpt2-small) args=(--config configs/families.toml --backends jax torch --model gpt2-small --precision bf16
                        --devices 1 2 4 --replicates 2 --time-budget 0 --wide) ;;
      seed-*) args=(--config configs/seed-study.toml --backends jax torch --model "${name#seed-}" --devices 1 2 4
                    --time-budget 0) ;;
    esac
    run_or_resume "$name" "${args[@]}"
  done
  ;;
esac
for f in "$out/run"/*.err; do echo "== $f"; grep -v "^\[" "$f" | tail -4; done
