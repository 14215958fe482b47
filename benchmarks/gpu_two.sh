#!/usr/bin/env bash
# The seed study's question on two GPUs, with the machine's own links (NVLink) and with the
# seed's topology (P2P off: NCCL stages GPU-to-GPU traffic through host memory), in calls of at
# most 9.5 minutes sent to one warm machine: send the same command again until it says "all
# done". Every run lives on the machine's disk; the next call finishes it (`--resume`).
#
#   allreduce      xbench allreduce --p2p on off: jax's and torch's busbw, both topologies side by
#                  side, with NCCL's own account of the transports each worker used
#   verify         xbench verify --config configs/families.toml --model gpt2-small resnet50
#                  --backends jax torch --devices 2 --variants all: wall time and each GPU's peak
#                  memory (issue "Verified in a minute at any size"; its target: 2 minutes)
#   mlp-p2p-on     xbench sweep of the MLP ladder 1 M, 4 M, 16 M, 64 M parameters x per-device
#                  batches 256, 2,048, 16,384 on 1 and 2 GPUs, jax and torch, tf32, verification
#                  on: the fit `xbench recommend` and the break-even answer from
#   mlp-p2p-off    the same sweep with P2P off (the programs are those verified above; the switch
#                  changes the links, not the arithmetic, so it runs --no-verify)
#   transformer    xbench sweep --config configs/sweep-transformers.toml on 1 and 2 GPUs, bf16
#   seed           configs/seed-study.toml on 1 and 2 GPUs: jax, jax-shardmap and torch
#
#   step           timeout          measured on 2 x H200 (2026-11-28)
#   install, env     ~40 s
#   allreduce        80 s           52 s
#   verify          200 s           cut at 200 s (93 of 147 runs)
#   mlp-p2p-on      what is left    703 s over two calls (verification 35 s, 192 trial replicates, the fit)
#   mlp-p2p-off     what is left    579 s over two calls
#   transformer     what is left    565 + 567 + 388 s over three calls (a second session; plan: 22 min)
#   seed            what is left    not reached
# Six calls over two sessions reached the seed step; expect seven or more for everything. Steps named on
# the command line run alone (the MLP and transformer sweeps and the all-reduce are committed:
# results/2026-11-28-h200x2-seed-question):
#   bash benchmarks/gpu_two.sh                          # every step
#   bash benchmarks/gpu_two.sh verify seed          # what the calls so far did not reach
set -uo pipefail
steps=" $* "
wanted() { [ "$steps" = "  " ] || [[ "$steps" == *" $1 "* ]]; }
source "$(dirname "$0")/_gpu_setup.sh"
# NVLink multicast stays off in both topologies (the device notes), so P2P is the one difference.
export NCCL_NVLS_ENABLE=0 COLUMNS=120
mkdir -p "$keep"

[ -f "$keep/env.txt" ] || timeout 30 sh -c 'nvidia-smi topo -m; xbench env' >"$keep/env.txt" 2>&1
cp "$keep/env.txt" "$out/run/"

# NCCL's INIT lines name each worker's transport: "via P2P/..." with P2P on, "via SHM/..." off.
wanted allreduce && NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_DEBUG_FILE="$keep/nccl.%h.%p.log" \
  once allreduce 80 xbench allreduce --backends jax torch --devices 2 --sizes 4KiB 1MiB 64MiB 1GiB \
  --p2p on off --json "$keep/allreduce.json"
if ls "$keep"/nccl.*.log >/dev/null 2>&1; then
  grep -h " via " "$keep"/nccl.*.log | sed 's/.*NCCL INFO //; s/^\[[0-9]*\] //' | sort | uniq -c >"$keep/nccl-transports.txt"
  rm -f "$keep"/nccl.*.log
fi
cp "$keep/allreduce.json" "$keep/nccl-transports.txt" "$out/run/" 2>/dev/null

if wanted verify && [ ! -f "$keep/verify.exit" ] && [ $((570 - SECONDS)) -ge 200 ]; then  # once's own test
  sample_memory verify
  once verify 200 xbench verify --config configs/families.toml --model gpt2-small resnet50 --backends jax torch \
    --devices 2 --variants all
  memory_peaks verify
  cp "$out/run/verify-memory.txt" "$keep/"
elif wanted verify && [ ! -f "$keep/verify.exit" ]; then
  pending=1
fi
cp "$keep/verify-memory.txt" "$out/run/" 2>/dev/null

ladder=(--backends jax torch --params 1e6 4e6 1.6e7 6.4e7 --per-device-batch 256 2048 16384 --devices 1 2
  --precision tf32 --replicates 2 --window-budget 0.5 --time-budget 60)
wanted mlp-p2p-on && resumable sweep mlp-p2p-on "${ladder[@]}" --p2p on
wanted mlp-p2p-off && resumable sweep mlp-p2p-off "${ladder[@]}" --p2p off --no-verify
wanted transformer && resumable sweep transformer --config configs/sweep-transformers.toml --backends jax torch --devices 1 2 \
  --precision bf16 --replicates 2 --window-budget 1 --time-budget 0
wanted seed && resumable compare seed --config configs/seed-study.toml --backends jax jax-shardmap torch --devices 1 2 --time-budget 0

for name in allreduce verify; do
  [ -f "$keep/$name.txt" ] && { echo "== $name"; grep -v "^\[" "$keep/$name.err" | tail -6; tail -22 "$keep/$name.txt"; }
done
cat "$keep/verify-memory.txt" "$keep/nccl-transports.txt" 2>/dev/null | head -12
for f in "$out/run"/*.err; do echo "== $f"; grep -v "^\[" "$f" | tail -4; done
[ "$pending" = 0 ] && echo "all done" || echo "send it again: steps left"
