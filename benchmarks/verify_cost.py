"""What verification costs per model on this machine: the wall time of `xbench verify` for each
model alone, and the peak memory per device while it ran (GPUs: sampled through NVML every 50 ms,
every process on the device counted; CPUs: the largest resident set of a worker process).

    python benchmarks/verify_cost.py --config configs/families.toml --backends jax torch \
        --devices 1 2 --variants all

Extra arguments after the known ones go to `xbench verify` unchanged. Prints one line per model
and the verify command's last lines (its verdict)."""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import tomllib


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="a spec whose [[models]] are verified one at a time")
    parser.add_argument("--model", nargs="*", default=[], help="presets, when no --config names them")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed per model")
    parser.add_argument("--log", type=Path, help="a folder for each model's whole verify output (MODEL.log)")
    known, rest = parser.parse_known_args()
    models = known.model or _config_models(known.config)
    if not models:
        parser.error("name the models: --config FILE or --model NAME ...")
    failed = 0
    for model in models:
        failed += _verify_one(model, known.config, rest, known.timeout, known.log)
    return 1 if failed else 0


def _config_models(config: str | None) -> list[str]:
    if not config:
        return []
    tables = tomllib.loads(Path(config).read_text()).get("models", [])
    return [t.get("name") or t["preset"] for t in tables]


def _verify_one(model: str, config: str | None, rest: list[str], timeout: float, log: Path | None) -> int:
    spec = ["--config", config] if config else []
    command = [sys.executable, "-m", "xbench", "verify", *spec, "--model", model, *rest]
    sampler = _GpuPeaks()
    sampler.start()
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout + done.stderr
        tail = output.strip().splitlines()[-3:]
    except subprocess.TimeoutExpired as cut:
        code, tail = 124, [f"timed out after {timeout:g} s"]
        output = "".join(_text(part) for part in (cut.stdout, cut.stderr))
    wall = time.perf_counter() - start
    sampler.stop()
    if log:
        log.mkdir(parents=True, exist_ok=True)
        (log / f"{model}.log").write_text(output)
    peaks = sampler.peaks_gib()
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    memory = (", ".join(f"gpu{i} {p:.1f} GiB" for i, p in enumerate(peaks)) if peaks
              else f"CPU, largest process so far {rss:.2f} GiB RSS")
    print(f"{model}: verify {wall:.1f} s wall, exit {code}; peak memory per device: {memory}", flush=True)
    for line in tail:
        print(f"  {line}")
    return int(code != 0)


def _text(part: bytes | str | None) -> str:
    return part.decode(errors="replace") if isinstance(part, bytes) else part or ""


class _GpuPeaks:
    """The most memory each GPU had in use while running (none without NVML or GPUs)."""

    def __init__(self) -> None:
        self.handles: list = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no NVML here: a CPU machine
            self.handles = []
        self.peaks = [0] * len(self.handles)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        if self.handles:
            self.thread.start()

    def stop(self) -> None:
        self.done.set()
        if self.handles:
            self.thread.join(timeout=5)

    def _sample(self) -> None:
        while not self.done.wait(0.05):
            for i, handle in enumerate(self.handles):
                self.peaks[i] = max(self.peaks[i], self.nvml.nvmlDeviceGetMemoryInfo(handle).used)

    def peaks_gib(self) -> list[float]:
        return [p / 2**30 for p in self.peaks]


if __name__ == "__main__":
    sys.exit(main())
