#!/usr/bin/env bash
# Bounded waits by hand on a GPU machine: a trial's worker (forked) stopped (SIGSTOP) 0.5 s after
# it appears, the device probe's worker likewise, and a fork server stopped mid-run, for jax and
# for torch; `CASES` picks some (default all). Each runs to its end under
# benchmarks/stop_a_child.py, which says how the run ended, after how long, and whether anything
# outlived it. Everything it writes is packed into $OUT/results.tgz.
set -uo pipefail
source "$(dirname "$0")/_gpu_setup.sh"
common=(--model medium --global-batch 256 1024 4096 --devices 1 --replicates 2 --repeats 2 --steps 10
        --warmup-steps 2 --no-verify --time-budget 0 --startup-timeout 30 --trial-timeout 30)

run_case() {
  local name=$1 what=$2 delay=$3 backend=$4 start=$SECONDS flags=()
  [[ " ${CASES:-$name} " == *" $name "* ]] || return 0
  [ "$what" = forked ] && { what=worker; flags=(--forked); }
  timeout 260 python3 benchmarks/stop_a_child.py --limit 240 "${flags[@]}" "$what" "$delay" -- compare \
    --backends "$backend" \
    "${common[@]}" --out "$out/run/$name" >"$out/run/$name.out" 2>"$out/run/$name.err"
  echo "$name: stop_a_child exit $?, $((SECONDS - start)) s" >>"$out/run/summary.txt"
  grep -a "^stopped\|^exit\|^left\|^still" "$out/run/$name.out" >>"$out/run/summary.txt"
  python3 - "$out/run/$name" >>"$out/run/summary.txt" <<'PY'
import json, sys
from pathlib import Path
path = Path(sys.argv[1]) / "records.jsonl"
records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
print(f"  {len(records)} records: " + ", ".join(f"{s} {sum(r['status'] == s for r in records)}"
                                             for s in sorted({r['status'] for r in records})))
for r in records:
    if r["status"] != "ok":
        print(f"  {r['trial_id']}: {r['status']}: {r['reason']}")
PY
}

run_case jax-worker forked 0.5 jax
run_case jax-probe worker 0.5 jax
run_case jax-server server 12 jax
run_case torch-worker forked 0.5 torch
run_case torch-probe worker 0.5 torch
run_case torch-server server 6 torch
cat "$out/run/summary.txt"
