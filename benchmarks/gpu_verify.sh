#!/usr/bin/env bash
# Verification at the sizes teams train, on two GPUs, in one short call: `xbench verify` of
# configs/families.toml (GPT-2 small and ResNet-50 together, every variant, 1 and 2 GPUs) with
# its wall time and each GPU's peak memory (nvidia-smi every 100 ms, every process counted),
# then the all-reduce with P2P on and off side by side, with NCCL's own account of the
# transports each used. Everything it writes is packed into $OUT/results.tgz.
set -uo pipefail
source "$(dirname "$0")/_gpu_setup.sh"
export NCCL_NVLS_ENABLE=0 COLUMNS=120  # NVLink multicast off (the device notes)

nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 100 >"$out/run/verify-memory.csv" &
sampler=$!
start=$SECONDS
timeout -s INT 230 xbench verify --config configs/families.toml --backends jax torch --devices 2 --variants all \
  >"$out/run/verify.txt" 2>"$out/run/verify.err"
echo "exit $? wall $((SECONDS - start)) s" >>"$out/run/verify.err"
kill "$sampler"
awk -F', ' '{ if ($2 > peak[$1]) peak[$1] = $2 } END { for (g in peak) printf "gpu%s peak %.1f GiB\n", g, peak[g] / 1024 }' \
  "$out/run/verify-memory.csv" >"$out/run/verify-memory.txt"

start=$SECONDS
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_DEBUG_FILE="$out/run/nccl.%h.%p.log" \
  timeout -s INT 80 xbench allreduce --backends jax torch --devices 2 --sizes 1MiB 64MiB 1GiB --p2p on off \
  --json "$out/run/allreduce.json" >"$out/run/allreduce.txt" 2>"$out/run/allreduce.err"
echo "exit $? wall $((SECONDS - start)) s" >>"$out/run/allreduce.err"
grep -h " via " "$out/run"/nccl.*.log 2>/dev/null | sed 's/.*NCCL INFO //; s/^\[[0-9]*\] //' | sort | uniq -c \
  >"$out/run/nccl-transports.txt"
rm -f "$out/run"/nccl.*.log

grep -v "^\[" "$out/run/verify.err" | tail -12
cat "$out/run/verify-memory.txt"
tail -25 "$out/run/allreduce.txt"
tail -2 "$out/run/allreduce.err"
head -8 "$out/run/nccl-transports.txt"
