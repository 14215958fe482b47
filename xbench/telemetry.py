"""GPU telemetry through NVML (nvidia-ml-py): utilisation, memory, power and energy, sampled
in a thread during an untimed stretch of training after the timed windows (see
`xbench.measure.observe`). On machines without NVML it says why, and samples nothing.

NVML's "memory used" counts what a framework reserved, not what it needs (frameworks may
preallocate most of the card), so records also carry each framework's own peak counter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

INTERVAL_S = 0.05


def open_sampler(indices: Sequence[int]) -> GpuSampler | str:
    """A sampler for GPUs `indices` (NVML order), or the reason there can be none."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
    except pynvml.NVMLError as err:
        return f"NVML: {err}"
    return GpuSampler(pynvml, handles)


class GpuSampler:
    def __init__(self, nvml, handles) -> None:
        self.nvml = nvml
        self.handles = handles
        self.samples: list[list[tuple[float, float, float]]] = [[] for _ in handles]  # util %, MiB, W
        self.energy_j: list[float | None] = [None for _ in handles]  # from NVML's energy counter
        self.active_s = 0.0
        self.error: str | None = None

    @contextmanager
    def sampling(self):
        """Sample in a background thread for the duration of the block, and read each GPU's
        energy counter at both ends."""
        stop = threading.Event()
        thread = threading.Thread(target=self._loop, args=(stop,), daemon=True)
        energy_start = [self._energy_mj(h) for h in self.handles]
        start = time.perf_counter()
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.active_s += time.perf_counter() - start
            for i, (handle, before) in enumerate(zip(self.handles, energy_start)):
                after = self._energy_mj(handle)
                if before is not None and after is not None:
                    self.energy_j[i] = (after - before) / 1000

    def _loop(self, stop: threading.Event) -> None:
        try:
            while True:
                for handle, series in zip(self.handles, self.samples):
                    series.append(self._read(handle))
                if stop.wait(INTERVAL_S):
                    return
        except Exception as err:  # MIG, VMs: say what failed instead of dying silently
            self.error = f"{type(err).__name__}: {err}"

    def _read(self, handle) -> tuple[float, float, float]:
        nvml = self.nvml
        util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
        used = nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        try:
            watts = nvml.nvmlDeviceGetPowerUsage(handle) / 1000
        except nvml.NVMLError:
            watts = float("nan")
        return float(util), float(used), watts

    def _energy_mj(self, handle) -> float | None:
        try:
            return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except Exception:  # not supported on this GPU or binding
            return None

    def summary(self, samples_processed: int) -> dict[str, Any]:
        """Per device: mean utilisation, peak NVML memory, mean power; and energy per sample
        (NVML's energy counter where it exists, else mean power x time)."""
        devices = []
        for series in self.samples:
            util, used, watts = zip(*series) if series else ((), (), ())
            devices.append({
                "util_mean_pct": sum(util) / len(util) if util else None,
                "nvml_memory_max_mib": max(used) if used else None,
                "power_mean_w": sum(watts) / len(watts) if watts else None,
            })
        if all(e is not None for e in self.energy_j):
            energy, source = sum(self.energy_j), "energy counter"
        else:
            powers = [d["power_mean_w"] for d in devices]
            ok = powers and all(p is not None and p == p for p in powers)
            energy, source = (sum(powers) * self.active_s if ok else None), "mean power x time"
        return {"available": self.error is None or any(self.samples), "error": self.error,
                "interval_s": INTERVAL_S, "sampled_s": self.active_s, "samples": [len(s) for s in self.samples],
                "devices": devices, "energy_source": source,
                "energy_per_sample_j": energy / samples_processed if energy and samples_processed else None}

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass
