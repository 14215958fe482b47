# Sourced by the benchmarks/gpu_*.sh scripts on the device machine: $out/run holds what a call
# writes, packed into $out/results.tgz when the script exits (only a few files come back);
# xbench installed from the working tree; the GPU and the framework versions recorded.
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/xbench-gpu}
mkdir -p "$out/run"
trap 'tar -C "$out" -czf "$out/results.tgz" run && rm -rf "$out/run"' EXIT

python3 -m pip install -q --no-deps --no-build-isolation --no-index . >"$out/run/install.log" 2>&1 \
  || { tail -20 "$out/run/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,power.limit --format=csv >"$out/run/gpu.csv"
python3 -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|flax|optax|torch|triton|numpy|scipy) ' >"$out/run/versions.txt"
