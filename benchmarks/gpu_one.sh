#!/usr/bin/env bash
# What one GPU can answer, in calls of at most 9.5 minutes sent to one warm machine: send the
# same command again until it says "all done".
#
#   verify-one   xbench verify --config configs/families.toml --backends jax torch --devices 1
#                --variants all: GPT-2 small and ResNet-50, every variant, on one GPU, with its
#                wall time, the GPU's peak memory (nvidia-smi every 100 ms) and the largest
#                single process's (verification runs jobs side by side; an 80 GB H100 must hold
#                all of them at once)
#   too-big      xbench compare --model gpt3-13b --devices 1: every replicated row says "does not
#                fit" (13 B parameters need ~200 GiB with Adam), nothing crashes; --no-verify: the
#                verification's full-size probe does not yet skip what cannot fit
#   xl-plan      the plan's estimate (--dry-run) of xl-one, to set beside its wall time
#   xl-one       xbench compare --config configs/families.toml --backends jax torch --model gpt2-xl
#                --global-batch 8 --devices 1 --precision bf16 --variants jax:cudnn jax:remat
#                torch:compile torch:remat --single-device plain --replicates 2 --time-budget 0,
#                verification on: tokens/s, MFU, and peak memory beside the estimate for the
#                replicated programs at 1.56 B parameters; its run dir stays on the machine's disk
#                and the next call finishes it (`--resume`)
#
#   step         timeout   ours
#   install, env   ~40 s
#   verify-one     200 s   ~2 min (previously ~4 min on 4 GPUs before verification shrank)
#   too-big         60 s   seconds (no worker is started for a row that does not fit)
#   xl-one         rest    ~10-15 min: verification ~3 min, 12 replicates of ~40-60 s
#   bash benchmarks/gpu_one.sh
set -uo pipefail
source "$(dirname "$0")/_gpu_setup.sh"
export COLUMNS=120
mkdir -p "$keep"

[ -f "$keep/env.txt" ] || timeout 30 sh -c 'nvidia-smi; xbench env' >"$keep/env.txt" 2>&1
cp "$keep/env.txt" "$out/run/"
if [ ! -f "$keep/verify-one.exit" ]; then
  sample_memory verify-one
  once verify-one 200 xbench verify --config configs/families.toml --backends jax torch --devices 1 --variants all
  memory_peaks verify-one
  cp "$out/run/verify-one-memory.txt" "$keep/"
fi
once too-big 60 xbench compare --config configs/families.toml --backends jax torch --model gpt3-13b --devices 1 \
  --precision bf16 --single-device plain --replicates 2 --time-budget 0 --no-verify --out "$keep/too-big"
xl_args=(--config configs/families.toml --backends jax torch --model gpt2-xl --global-batch 8 --devices 1
  --precision bf16 --variants jax:cudnn jax:remat torch:compile torch:remat --single-device plain
  --replicates 2 --time-budget 0)
once xl-plan 30 xbench compare "${xl_args[@]}" --dry-run
run_or_resume xl-one "${xl_args[@]}"

for f in "$keep"/*.txt "$out/run"/xl-one*.txt; do [ -f "$f" ] && { echo "== $f"; grep -v "^\[" "$f" | tail -14; }; done
for f in "$out/run"/*.err; do echo "== $f"; grep -v "^\[" "$f" | tail -4; done
[ "$pending" = 0 ] && echo "all done" || echo "send it again: steps left"
