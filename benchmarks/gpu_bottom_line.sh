#!/usr/bin/env bash
# The README's sample on two GPUs, as run on the device machine within its 10-minute limit: the
# compact table and the bottom line of jax and torch on 1 and 2 GPUs (each data-parallel program
# on 1 and 2, each plain program on 1), with the report's plots; `ALLREDUCE=1` adds `xbench
# allreduce` in nccl-tests' format. Everything it writes is packed into $OUT/results.tgz (only a
# few files come back from that machine).
set -uo pipefail
source "$(dirname "$0")/_gpu_setup.sh"
export NCCL_NVLS_ENABLE=0 COLUMNS=100  # NVLink multicast off (the device notes); a 100-column terminal
nvidia-smi topo -m >"$out/run/topo.txt" 2>&1
start=$SECONDS
timeout -s INT 520 xbench compare --backends jax torch --model large --global-batch 2048 65536 --samples 65536 \
  --devices 1 2 --time-budget "${BUDGET:-30}" --out "$out/run/compare" >"$out/run/compare.txt" 2>"$out/run/compare.err"
echo "exit $? wall $((SECONDS - start)) s" >>"$out/run/compare.err"
if [ "${ALLREDUCE:-0}" = 1 ]; then
  timeout 90 xbench allreduce --backends jax torch --devices 2 --sizes 4KiB 1MiB 64MiB 256MiB \
    >"$out/run/allreduce.txt" 2>"$out/run/allreduce.err"
  echo "exit $?" >>"$out/run/allreduce.err"
fi
