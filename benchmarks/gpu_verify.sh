#!/usr/bin/env bash
# Verification at the sizes teams train, in one call, each step with its wall time, each GPU's
# peak memory (nvidia-smi every 100 ms, every process counted) and, per run, where its seconds
# went (the phases on each "verifying" line: work, prepare, gradients, shares, train, weights,
# summaries, save). Steps, all unless some are named:
#   families   xbench verify of configs/families.toml (GPT-2 small and ResNet-50 together, every
#              variant, 1 and 2 GPUs): issue "Verified in a minute at any size" asks <= 2 min
#   gpt2-xl    xbench verify of gpt2-xl with the sharded variants, 1 and 2 GPUs: the full-size
#              probes at 1.56 B parameters (2-3 minutes each on one H200 before)
#   memory     xbench compare of configs/families.toml in bf16, the as-written programs verified
#              then timed (2 replicates): the report sets the verification's largest run's
#              framework peak memory beside the timed programs' (the issue asks no more)
#   allreduce  the all-reduce with P2P on and off side by side, NCCL's own account of the
#              transports each used
# Everything it writes is packed into $OUT/results.tgz. FAMILIES_TIMEOUT, XL_TIMEOUT: the steps' limits;
# DEVICES: the verify steps' device count (default 2; 1 on a one-GPU machine). AS_GIB=79.6: the
# verify steps as on a card of that many GiB (an 80 GB H100's 81,559 MiB) where the GPUs have more:
# xbench plans for it (XBENCH_DEVICE_MEMORY_GIB) and a process holds the rest of each GPU's memory
# (its hold is printed; the peaks "all processes" include it, "largest single process" may be it;
# a step whose hold fails does not run).
#   bash benchmarks/gpu_verify.sh families gpt2-xl
set -uo pipefail
steps=" $* "
wanted() { [ "$steps" = "  " ] || [[ "$steps" == *" $1 "* ]]; }
source "$(dirname "$0")/_gpu_setup.sh"
export NCCL_NVLS_ENABLE=0 COLUMNS=120  # NVLink multicast off (the device notes)

verify_step() {  # verify_step NAME TIMEOUT VERIFY-ARGS...: xbench verify with its memory sampled, in what
  local name=$1 limit=$2  # the call has left (570 s in all): cut to that, not started under 60 s
  shift 2
  if [ -n "${AS_GIB:-}" ]; then
    hold_all_but "$AS_GIB" "$name" || { echo "== $name: not started, the memory hold failed"; return; }
  fi
  [ $((570 - SECONDS)) -lt "$limit" ] && limit=$((570 - SECONDS))
  [ "$limit" -lt 60 ] && { echo "== $name: not started, $((570 - SECONDS)) s left"; release_hold "$name"; return; }
  sample_memory "$name"
  XBENCH_DEVICE_MEMORY_GIB=${AS_GIB:-${XBENCH_DEVICE_MEMORY_GIB:-}} step "$name" "$limit" xbench verify "$@"
  memory_peaks "$name"
  release_hold "$name"
}

hold_all_but() {  # hold_all_but GIB NAME: a process holds each GPU's total memory less GIB until killed
  # (its own CUDA context, about 0.5 GiB, on top: a little tighter than the real card); waits at
  # most 60 s for it to say it holds it; non-zero if it cannot
  holder=
  python3 -c '
import sys, time, torch
keep, report = float(sys.argv[1]), open(sys.argv[2], "w")
if not torch.cuda.is_available():
    print("no GPU to hold", file=report, flush=True)
    sys.exit(1)
held = []
for gpu in range(torch.cuda.device_count()):
    free, total = torch.cuda.mem_get_info(gpu)
    size = max(int(total - keep * 2**30), 0)
    held.append(torch.empty(size, dtype=torch.uint8, device=f"cuda:{gpu}"))
    print(f"held on gpu{gpu}: {size / 2**30:.1f} GiB of {total / 2**30:.1f}, as on a {keep:g} GiB card; "
          f"{(total - free) / 2**30:.1f} GiB in use before (this context included)", file=report)
print("holding", file=report, flush=True)
time.sleep(3600)
' "$1" "$out/run/$2-held.txt" &
  holder=$!
  local waited=0
  until grep -q "^holding" "$out/run/$2-held.txt" 2>/dev/null; do
    if ! kill -0 "$holder" 2>/dev/null || [ "$waited" -ge 60 ]; then
      cat "$out/run/$2-held.txt" 2>/dev/null
      release_hold "$2"
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  grep -v "^holding" "$out/run/$2-held.txt"
}

release_hold() {  # release_hold NAME: end the holder, if any, and add what it held to NAME-memory.txt
  [ -n "${holder:-}" ] || return 0
  kill "$holder" 2>/dev/null
  wait "$holder" 2>/dev/null
  holder=
  [ -f "$out/run/$1-memory.txt" ] && grep -v "^holding" "$out/run/$1-held.txt" >>"$out/run/$1-memory.txt"
  return 0
}

wanted families && verify_step families "${FAMILIES_TIMEOUT:-300}" --config configs/families.toml --backends jax torch \
  --devices "${DEVICES:-2}" --variants all
wanted gpt2-xl && verify_step gpt2-xl "${XL_TIMEOUT:-220}" --config configs/families.toml --model gpt2-xl --backends jax torch \
  --devices "${DEVICES:-2}" --variants jax:fsdp torch:fsdp torch:fsdp-compile

if wanted memory; then
  limit=$((570 - SECONDS))
  if [ "$limit" -ge 120 ]; then
    step memory "$limit" xbench compare --config configs/families.toml --backends jax torch --precision bf16 \
      --devices "${DEVICES:-2}" --replicates 2 --repeats 3 --time-budget 0 --single-device data-parallel \
      --out "$out/run/memory"
    grep -h "Verification took" "$out/run/memory/report.md" 2>/dev/null
  else
    echo "== memory: not started, $limit s left"
  fi
fi

if wanted allreduce; then
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_DEBUG_FILE="$out/run/nccl.%h.%p.log" \
    step allreduce 80 xbench allreduce --backends jax torch --devices 2 --sizes 1MiB 64MiB 1GiB --p2p on off \
    --json "$out/run/allreduce.json"
  grep -h " via " "$out/run"/nccl.*.log 2>/dev/null | sed 's/.*NCCL INFO //; s/^\[[0-9]*\] //' | sort | uniq -c \
    >"$out/run/nccl-transports.txt"
  rm -f "$out/run"/nccl.*.log
fi

for name in families gpt2-xl; do
  [ -f "$out/run/$name.err" ] || continue
  echo "== $name"; grep -v "^\[" "$out/run/$name.err" | grep -v "^verifying" | tail -8
  cat "$out/run/$name-memory.txt"
done
[ -f "$out/run/allreduce.txt" ] && { tail -25 "$out/run/allreduce.txt"; head -8 "$out/run/nccl-transports.txt"; }
true
