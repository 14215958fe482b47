#!/usr/bin/env bash
# The GPU runs of "the programs experts write", as run on the device machine: one
# step per call, each within the machine's 10-minute limit, everything it writes packed into
# $OUT/results.tgz (only a few files come back from that machine).
#   benchmarks/gpu_experts.sh gpt2             expert loops on GPT-2 small, then verify on GPU
#   benchmarks/gpu_experts.sh resnet-mlp       expert loops on ResNet-50 and the seed MLPs
#   benchmarks/gpu_experts.sh compare MODEL    families.toml, --variants all, 1 device, bf16
#   benchmarks/gpu_experts.sh resume RUN_DIR   continue a compare cut short (its run dir carried back)
set -uo pipefail
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/_gpu_setup.sh"

what=${1:?usage: $0 gpt2|resnet-mlp|compare MODEL|resume RUN_DIR}
case "$what" in
  gpt2)
    timeout 390 python3 benchmarks/expert_loops.py --platform gpu --models gpt2-small --deadline-s 370 \
      --out "$out/run/expert-gpt2.json" 2>&1 | tee "$out/run/expert-gpt2.txt"
    timeout 170 xbench verify --backends jax torch --model transformer-tiny --devices 1 \
      --variants jax:cudnn,jax:functional,jax:jnp,torch:compile 2>&1 | tee "$out/run/verify-transformer-tiny.txt" ;;
  resnet-mlp)
    timeout 560 python3 benchmarks/expert_loops.py --platform gpu --models resnet50 mlp --deadline-s 540 \
      --out "$out/run/expert-resnet-mlp.json" 2>&1 | tee "$out/run/expert-resnet-mlp.txt" ;;
  compare)
    model=${2:?usage: $0 compare MODEL}
    timeout 560 xbench compare --config configs/families.toml --model "$model" --backends jax torch --devices 1 \
      --precision bf16 --variants all --replicates 2 --no-verify --out "$out/run/families-$model" 2>&1 \
      | tee "$out/run/families-$model.log" ;;
  resume)
    cp -r "${2:?usage: $0 resume RUN_DIR}" "$out/run/" && \
      timeout 560 xbench compare --resume "$out/run/$(basename "$2")" 2>&1 | tee "$out/run/$(basename "$2")-resume.log" ;;
  *) echo "usage: $0 gpt2|resnet-mlp|compare MODEL|resume RUN_DIR" >&2; exit 2 ;;
esac
