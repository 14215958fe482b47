#!/usr/bin/env bash
# The GPU runs of the baselines-and-variants work, as run on the device machine: the
# harness-overhead benchmark, verification of every program and variant, and the seed models
# at batch 128 and 65,536 through jax, jax-shardmap and torch with every variant and both
# 1-device programs.
#   benchmarks/gpu_variants.sh overhead OUT_DIR
#   benchmarks/gpu_variants.sh verify OUT_DIR [extra xbench verify flags]
#   benchmarks/gpu_variants.sh compare RUN_DIR [extra xbench compare flags, e.g. --devices 1,2]
#   benchmarks/gpu_variants.sh resume RUN_DIR
set -euo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
BACKENDS=(jax jax-shardmap torch)
what=${1:?usage: $0 overhead|verify|compare|resume DIR}; shift
case "$what" in
  overhead)
    python3 benchmarks/overhead.py --platform gpu --out "$1/overhead.json" 2>&1 | tee "$1/overhead.txt" ;;
  verify)
    out=$1; shift
    xbench verify --backends "${BACKENDS[@]}" --variants all --single-device both "$@" 2>&1 | tee "$out/verify.txt" ;;
  compare)
    run=$1; shift
    xbench compare --backends "${BACKENDS[@]}" --model medium large --batch-sizes 128,65536 --samples 262144 \
      --variants all --single-device both --out "$run" "$@" ;;
  resume)
    xbench compare --resume "$1" ;;
  *) echo "usage: $0 overhead|verify|compare|resume DIR" >&2; exit 2 ;;
esac
