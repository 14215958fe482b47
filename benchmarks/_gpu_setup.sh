# Sourced by the benchmarks/gpu_*.sh scripts on the device machine: $out/run holds what a call
# writes, packed into $out/results.tgz when the script exits (only a few files come back);
# xbench installed from the working tree; the GPU and the framework versions recorded.
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/xbench-gpu}
mkdir -p "$out/run"
# Two scripts in one call name their tarballs apart: XBENCH_TARBALL=NAME packs into $out/NAME.tgz.
trap 'tar -C "$out" -czf "$out/${XBENCH_TARBALL:-results}.tgz" run && rm -rf "$out/run"' EXIT

python3 -m pip install -q --no-deps --no-build-isolation --no-index . >"$out/run/install.log" 2>&1 \
  || { tail -20 "$out/run/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,power.limit --format=csv >"$out/run/gpu.csv"
python3 -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|flax|optax|torch|triton|numpy|scipy) ' >"$out/run/versions.txt"

# Steps of a call (the scripts that keep runs on the machine's disk, `$keep`, share these):
keep=/tmp/xbench-keep
pending=0  # set where something is left for the next call to the same warm machine

step() {  # step NAME TIMEOUT COMMAND...: stdout to NAME.txt, stderr to NAME.err, with exit and wall time
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout -s INT "$limit" "$@" >"$out/run/$name.txt" 2>"$out/run/$name.err"
  last_exit=$?
  echo "exit $last_exit wall $((SECONDS - start)) s" >>"$out/run/$name.err"
  echo "== $name: $(tail -1 "$out/run/$name.err")"
}

run_or_resume() {  # run_or_resume NAME COMPARE-ARGS...: an `xbench compare` that the next call finishes
  resumable compare "$@"
}

resumable() {  # resumable compare|sweep NAME ARGS...: in the time this call has left (570 s in all)
  local command=$1 name=$2 dir=$keep/$2 limit=$((570 - SECONDS))
  shift 2
  mkdir -p "$keep"
  [ -f "$dir.exit" ] && [ "$(cat "$dir.exit")" = 0 ] && return
  [ "$limit" -lt 60 ] && { echo "== $name: not started, ${limit} s left"; pending=1; return; }
  if [ -f "$dir.exit" ]; then
    step "$name-resumed" "$limit" xbench "$command" --resume "$dir"
  else
    step "$name" "$limit" xbench "$command" "$@" --out "$dir"
  fi
  echo "$last_exit" >"$dir.exit"
  [ "$last_exit" = 0 ] || pending=1
  rm -rf "$out/run/$name" && cp -r "$dir" "$out/run/$name"
}

once() {  # once NAME TIMEOUT COMMAND...: a step run in one call only, when its timeout fits what is left
  local name=$1 limit=$2
  shift 2
  [ -f "$keep/$name.exit" ] && return
  [ $((570 - SECONDS)) -lt "$limit" ] && { echo "== $name: not started, $((570 - SECONDS)) s left"; pending=1; return; }
  step "$name" "$limit" "$@"
  echo "$last_exit" >"$keep/$name.exit"
  cp "$out/run/$name.txt" "$out/run/$name.err" "$keep/"  # the next call prints its lines again
  cp -r "$keep/$name" "$out/run/" 2>/dev/null
}

sample_memory() {  # sample_memory NAME: each GPU's and every process's memory every 100 ms, in the background
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 100 >"$out/run/$1-gpu.csv" &
  gpu_sampler=$!
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 100 >"$out/run/$1-apps.csv" &
  apps_sampler=$!
  vmstat -n 1 >"$out/run/$1-cpu.txt" 2>/dev/null &  # the host's cores: verification compiles there
  cpu_sampler=$!
}

memory_peaks() {  # memory_peaks NAME: stop the samplers, write NAME-memory.txt
  kill "$gpu_sampler" "$apps_sampler" "$cpu_sampler" 2>/dev/null
  {
    awk -F', ' '{ if ($2 > peak[$1]) peak[$1] = $2 } END { for (g in peak) printf "gpu%s peak %.1f GiB (all processes)\n", g, peak[g] / 1024 }' "$out/run/$1-gpu.csv"
    awk -F', ' '$2 ~ /^[0-9]+$/ { if ($2 > peak) peak = $2 } END { printf "largest single process %.1f GiB\n", peak / 1024 }' "$out/run/$1-apps.csv"
    awk '$15 ~ /^[0-9]+$/ && seen++ { n++; idle += $15; if ($1 > most) most = $1 } END { if (n) printf "host cores %.0f %% busy on average over %d s, at most %d runnable\n", 100 - idle / n, n, most }' "$out/run/$1-cpu.txt"
  } >"$out/run/$1-memory.txt"
  gzip -f "$out/run/$1-gpu.csv" "$out/run/$1-apps.csv"
}
