#!/usr/bin/env bash
# The seed study's question on two GPUs, with the machine's own links and with the seed's
# topology (P2P off: NCCL stages GPU-to-GPU traffic through host memory), in one call of at
# most 9 minutes: the all-reduce busbw of jax and torch with P2P on and off side by side, then
# the break-even sweeps (MLPs of 1 M and 10 M parameters, around the seed's 10-20 M guess, at
# per-device batches 256, 2048 and 16384 (12 configurations: the fit's 9 terms need 9), on
# 1 and 2 GPUs), one step per backend and topology, each
# under its own timeout (SIGINT: an interrupted sweep keeps its records, and
# `xbench sweep --resume DIR` finishes it), so a step that runs long loses no other.
# Everything it writes is packed into $OUT/results.tgz.
#
#   step                                   timeout   expected
#   nvidia-smi topo -m, xbench env            30 s      ~10 s
#   xbench allreduce --p2p on off             75 s   ~40-60 s (2 backends x 2 topologies x 4 sizes)
#   xbench sweep, jax, P2P on                100 s  ~70-90 s (48 trial replicates, the all-reduce, the fit)
#   xbench sweep, jax, P2P off               100 s  ~70-90 s
#   xbench sweep, torch, P2P on              100 s  ~70-90 s
#   xbench sweep, torch, P2P off             100 s  ~70-90 s
#   at most 505 s of steps, plus the install (~20 s): within 9 minutes.
set -uo pipefail
source "$(dirname "$0")/_gpu_setup.sh"
# NVLink multicast stays off in both topologies (the device notes), so P2P is the one difference.
export NCCL_NVLS_ENABLE=0 COLUMNS=120
timeout 30 sh -c 'nvidia-smi topo -m; xbench env' >"$out/run/env.txt" 2>&1

# NCCL's own account of each worker's transports (INIT and ENV lines only, at start-up: the
# timed windows are not touched): "via P2P/..." with P2P on, "via SHM/..." with it off.
start=$SECONDS
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_DEBUG_FILE="$out/run/nccl.%h.%p.log" \
  timeout -s INT 75 xbench allreduce --backends jax torch --devices 2 --sizes 4KiB 1MiB 64MiB 1GiB \
  --p2p on off --json "$out/run/allreduce.json" >"$out/run/allreduce.txt" 2>"$out/run/allreduce.err"
echo "exit $? wall $((SECONDS - start)) s" >>"$out/run/allreduce.err"
grep -h " via " "$out/run"/nccl.*.log 2>/dev/null | sed 's/.*NCCL INFO //' | sort | uniq -c >"$out/run/nccl-transports.txt"

for backend in jax torch; do
  for p2p in on off; do
    name="sweep-$backend-p2p-$p2p"
    start=$SECONDS
    timeout -s INT 100 xbench sweep --backends "$backend" --params 1e6 1e7 --per-device-batch 256 2048 16384 \
      --devices 1 2 --replicates 2 --window-budget 0.5 --no-verify --p2p "$p2p" --out "$out/run/$name" \
      >"$out/run/$name.txt" 2>"$out/run/$name.err"
    echo "exit $? wall $((SECONDS - start)) s" >>"$out/run/$name.err"
  done
done

cat "$out/run/allreduce.txt" | grep -A20 "side by side"
tail -2 "$out/run/allreduce.err"
cat "$out/run/nccl-transports.txt" | head -12
for f in "$out/run"/sweep-*.err; do echo "== $f"; grep -v "^\[" "$f" | tail -3; done
