#!/usr/bin/env bash
# Sharded data parallelism at gpt2-xl (1.56 B parameters) in bf16 on 2 GPUs, in calls of at most
# 9.5 minutes sent to one warm machine: send the same command again until it says "all done".
#
#   loops-torch  benchmarks/fsdp_loops.py --frameworks torch: the minimal FSDP2 loop (per-block
#                torch.compile + fully_shard) and `xbench compare` torch, torch:fsdp, torch:fsdp-compile, global
#                batch 16 (8 sequences of 1,024 per GPU), the ratio xbench/minimal, same call
#   loops-jax    the same for jax (sharded jax.jit loop with cuDNN attention; jax, jax:fsdp)
#   acceptance   xbench compare --config configs/families.toml --backends jax torch --model gpt2-xl
#                --global-batch 8 --devices 1 2 --precision bf16 --variants jax:fsdp-cudnn torch:fsdp
#                --single-device data-parallel --replicates 2 --time-budget 0, verification on:
#                the replicated and each framework's fastest sharded program (measured by the
#                loops steps: torch's eager fsdp, jax's with cuDNN attention) on 1 and 2 GPUs,
#                the plain 1-GPU programs left out; its run dir stays on the machine's disk and
#                the next call finishes it (`--resume`)
#   big          the largest preset that does not fit one H200 replicated, gpt3-13b (2,048-token context),
#                sharded over 2 GPUs with each block recomputed: xbench compare --config configs/families.toml
#                --backends B --model gpt3-13b --global-batch 8 --devices 2 --precision bf16 --variants
#                B:fsdp-remat --replicates 2 --time-budget 0 --compile-cache run --no-verify for each B of
#                BIG_BACKENDS (default torch jax), one run each (a first look; BIG_ARGS adds to them),
#                resumable
#
# LOOPS_MEMORY_GIB=N: the loops steps time only the sharded programs, the replicated ones held
# back before launching by xbench's memory check against N GiB (XBENCH_DEVICE_MEMORY_GIB for
# those steps only; e.g. 60 at gpt2-xl: 100 GiB replicated, 33 sharded), which saves their minutes.
#
#   step         timeout      xbench's estimate (--platform gpu --dry-run)   ours
#   install, env   ~40 s
#   loops-torch    500 s      compare ~9 min (4 replicates)                  ~4-6 min: the minimal loop ~2 min
#                                                                            (1.56 B weights built in each rank,
#                                                                            one block compiled), 4 xbench
#                                                                            replicates ~40-70 s each
#   loops-jax      500 s      compare ~8 min (4 replicates)                  measured: 309 s with
#                                                                            LOOPS_MEMORY_GIB=60 and --compile-cache
#                                                                            run (2 sharded replicates); 500+ s
#                                                                            with the replicated rows
#   acceptance     what the   32 min: verify ~3 min, 16 replicates ~29 min   ~15-20 min
#                  call has
#                  left
#   big            what is    32 min a backend (~16 min a configuration)     measured: 8 min 21 s a torch
#                  left                                                      replicate, 45 s of it timed
#                                                                            (weights drawn on threads, hashed
#                                                                            on one, held twice in prepare)
# xbench's estimate assumes 40 % of 100 TFLOP/s per GPU (2.1 s a step at batch 16); an H100 at
# 30-40 % MFU runs a step in ~0.25 s, so the first calls (compilation, building 1.56 B weights)
# dominate and are the unknown. Expect 4-6 calls in all; a step that runs past its timeout is
# cut (SIGINT) and is not repeated; acceptance keeps what it recorded and resumes.
#   bash benchmarks/gpu_sharded.sh                  # every step
#   bash benchmarks/gpu_sharded.sh loops-torch      # only the steps named
set -uo pipefail
steps=" $* "
wanted() { [ "$steps" = "  " ] || [[ "$steps" == *" $1 "* ]]; }
source "$(dirname "$0")/_gpu_setup.sh"
export NCCL_NVLS_ENABLE=0 COLUMNS=120  # NVLink multicast off (the device notes); a 120-column terminal
mkdir -p "$keep"


[ -f "$keep/env.txt" ] || timeout 30 sh -c 'nvidia-smi topo -m; xbench env' >"$keep/env.txt" 2>&1
cp "$keep/env.txt" "$out/run/"
for framework in torch jax; do
  # LOOPS_TIMEOUT, LOOPS_ARGS: a shorter step, e.g. LOOPS_ARGS='--rounds 3 --xbench-args "--replicates 2 --repeats 3"'
  eval "loops_args=(${LOOPS_ARGS:-})"
  wanted "loops-$framework" && once "loops-$framework" "${LOOPS_TIMEOUT:-500}" \
    env ${LOOPS_MEMORY_GIB:+XBENCH_DEVICE_MEMORY_GIB=$LOOPS_MEMORY_GIB} python3 benchmarks/fsdp_loops.py \
    --platform gpu --frameworks "$framework" --out "$keep/loops-$framework" "${loops_args[@]}"
done
wanted acceptance && run_or_resume acceptance --config configs/families.toml --backends jax torch --model gpt2-xl --global-batch 8 \
  --devices 1 2 --precision bf16 --variants jax:fsdp-cudnn torch:fsdp --single-device data-parallel --replicates 2 \
  --time-budget 0
eval "big_args=(${BIG_ARGS:-})"
for backend in ${BIG_BACKENDS:-torch jax}; do  # one run each, torch's first: what a cut call keeps is whole
  wanted big && run_or_resume "big-$backend" --config configs/families.toml --backends "$backend" --model gpt3-13b \
    --global-batch 8 --devices 2 --precision bf16 --variants "$backend:fsdp-remat" --replicates 2 --time-budget 0 \
    --compile-cache run --no-verify "${big_args[@]}"
done
for f in "$keep"/loops-*.txt; do [ -f "$f" ] && { echo "== $f"; grep -E "^(minimal|xbench|ratio|wall)" "$f"; }; done
for f in "$out/run"/*.err; do echo "== $f"; grep -v "^\[" "$f" | tail -4; done
[ "$pending" = 0 ] && echo "all done" || echo "send it again: steps left"
