#!/usr/bin/env bash
# A first four-GPU call (one machine, one call within its 10-minute limit): each backend's
# all-reduce on 4 GPUs beside a plain NCCL loop (benchmarks/allreduce_vs_nccl.py, 256 MiB and
# 1 GiB), then the like-with-like curve of the large seed MLP on 1, 2 and 4 GPUs for jax and
# torch (verification on, the planned replicates only). Everything it writes is packed into
# $OUT/results.tgz.
set -uo pipefail
source "$(dirname "$0")/_gpu_setup.sh"
export NCCL_NVLS_ENABLE=0 COLUMNS=120  # NVLink multicast off (the device notes); a 120-column terminal
nvidia-smi topo -m >"$out/run/topo.txt" 2>&1
for backend in jax torch; do
  timeout 120 python3 benchmarks/allreduce_vs_nccl.py --backend "$backend" --gpus 4 --sizes 256MiB 1GiB \
    >"$out/run/allreduce-$backend.txt" 2>&1
  echo "exit $?" >>"$out/run/allreduce-$backend.txt"
done
start=$SECONDS
timeout -s INT 330 xbench compare --backends jax torch --model large --global-batch 65536 --samples 65536 \
  --devices 1 2 4 --time-budget 0 --out "$out/run/compare" >"$out/run/compare.txt" 2>"$out/run/compare.err"
echo "exit $? wall $((SECONDS - start)) s" >>"$out/run/compare.err"
tail -3 "$out/run/allreduce-jax.txt" "$out/run/allreduce-torch.txt"
grep -v "^\[" "$out/run/compare.err" | tail -4
cat "$out/run/compare.txt"
