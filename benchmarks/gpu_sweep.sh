#!/usr/bin/env bash
# The step-model sweeps on a GPU machine, each followed by its held-out validation and two
# recommendations from the fit. Device counts: 1 and every GPU (1 alone on a one-GPU machine).
#   benchmarks/gpu_sweep.sh mlp OUT_DIR           # the MLP ladder (1 M-64 M parameters), tf32
#   benchmarks/gpu_sweep.sh transformer OUT_DIR   # configs/sweep-transformers.toml, bf16
set -euo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
what=${1:?usage: $0 mlp|transformer OUT_DIR}; out=${2:?usage: $0 mlp|transformer OUT_DIR}; shift 2
gpus=$(nvidia-smi -L | wc -l)
devices=$([ "$gpus" -gt 1 ] && echo "1,$gpus" || echo 1)
case "$what" in
  mlp)
    xbench sweep --backends jax torch --devices "$devices" --precision tf32 --out "$out" "$@" 2>&1 | tee "$out.sweep.txt"
    ask=(--params 5e6 --batch 1024 4096) ;;
  transformer)
    xbench sweep --config configs/sweep-transformers.toml --backends jax torch --devices "$devices" \
      --precision bf16 --out "$out" "$@" 2>&1 | tee "$out.sweep.txt"
    ask=(--model gpt2-small --batch 8 16) ;;
  *) echo "usage: $0 mlp|transformer OUT_DIR" >&2; exit 2 ;;
esac
python3 benchmarks/predict_heldout.py "$out" 2>&1 | tee "$out.heldout.txt" || true
xbench recommend "${ask[@]}" --fits "$out" 2>&1 | tee "$out.recommend.txt"
