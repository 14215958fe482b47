"""GPU telemetry through NVML (nvidia-ml-py).

Two ways to watch the GPUs:

- `open_window_watch` / `WindowWatch` (preferred): a few NVML reads just before the first
  timed window and just after the last one (outside the timed region), plus the driver's
  own sample buffer (`nvmlDeviceGetSamples`), read once afterwards, for utilisation, power
  and clocks *during* the windows. No thread runs while windows are timed, so nothing
  competes with the host-side dispatch being measured. It also records the confounders a
  reader needs to trust a replicate: SM/memory clocks, clock-event ("throttle") reasons,
  power/thermal violation time, and (`host_state`) host load.
- `open_sampler` / `GpuSampler` (fallback): utilisation, memory, power and energy sampled in
  a thread during an untimed stretch of training after the timed windows (see
  `xbench.worker.measure.observe`).

On machines without NVML both say why, and sample nothing.

NVML's "memory used" counts what a framework reserved, not what it needs (frameworks may
preallocate most of the card), so records also carry each framework's own peak counter.
"""

from __future__ import annotations

import os
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
        counted = [e for e in self.energy_j if e is not None]
        energy: float | None
        if len(counted) == len(self.energy_j):
            energy, source = sum(counted), "energy counter"
        else:
            powers = [p for p in (d["power_mean_w"] for d in devices) if p is not None and p == p]  # not None, not NaN
            ok = bool(powers) and len(powers) == len(devices)
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


# --- Bracketing the timed windows ---------------------------------------------------------

# NVML clock-event ("clocks throttle") reason bits, as nvml.h defines them (stable values; the
# binding's constants are nvmlClocksEventReason* in newer and nvmlClocksThrottleReason* in
# older releases). Bits not listed here are reported as hex.
CLOCK_EVENT_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),   # older bindings only (nvmlClocksThrottleReasonBoardLimit)
    (0x400, "reliability"),   # older bindings only (nvmlClocksThrottleReasonReliability)
)
# The reasons that mean the clocks were held down by power or heat; idle, application clock
# settings, sync boost and display clock settings are not throttling.
THROTTLING_EVENTS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")

# nvmlSamplingType_t and nvmlValueType_t values from nvml.h, used when a binding lacks the names.
_SAMPLE_TYPES = (  # (key, binding constant, nvml.h value)
    ("util", "NVML_GPU_UTILIZATION_SAMPLES", 1),
    ("power", "NVML_TOTAL_POWER_SAMPLES", 0),
    ("sm_clock", "NVML_PROCESSOR_CLK_SAMPLES", 5),
    ("mem_clock", "NVML_MEMORY_CLK_SAMPLES", 6),
)
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_NVML_ERROR_NOT_FOUND = 6  # nvmlDeviceGetSamples: no sample newer than lastSeenTimeStamp


def open_window_watch(indices: Sequence[int]) -> WindowWatch | str:
    """A watch over GPUs `indices` (NVML order) for the timed windows, or why there can be none
    (nvidia-ml-py missing, NVML init failure)."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError (no driver, no library) or anything odd from ctypes
        return f"NVML: {_describe(err)}"
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
    except Exception as err:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
        return f"NVML: {_describe(err)}"
    return WindowWatch(pynvml, handles, indices)


class WindowWatch:
    """NVML reads around the timed windows, and the driver's samples from within them.

    `watching()` brackets the windows: just before the block and just after it, each GPU's
    energy counter, SM and memory clocks, clock-event reasons and power/thermal violation
    counters are read, with a CPU timestamp; nothing runs during the block. `summary()` then
    reads the driver's sample buffers (`nvmlDeviceGetSamples`: utilisation, power, SM and
    memory clock) once per device and type, keeping only samples stamped inside the watched
    interval.

    Limits, stated in the record by counts and Nones rather than hidden:
    - The driver samples at its own period (utilisation every 1/6 s to 1 s, power and clocks
      every few tens of ms to 1 s depending on the GPU), so windows shorter than that period
      yield no samples: util/power are then None and util_samples 0. Each utilisation sample
      averages the period *before* its timestamp, so the first one may include a little time
      from before the windows.
    - The buffer holds only the last ~100 samples per type; if the windows outlast it, only
      their last part is seen unless `collect()` is called between windows (untimed).
    - Every NVML call may be unsupported (MIG, VMs, older GPUs) or missing from an older
      binding: its values are then None and the first error is kept under "error".
    """

    def __init__(self, nvml, handles, indices: Sequence[int] | None = None) -> None:
        self.nvml = nvml
        self.handles = list(handles)
        self.indices = list(indices) if indices is not None else list(range(len(self.handles)))
        self._reset()

    # -- per-entry state -------------------------------------------------------------------

    def _reset(self) -> None:
        self.error: str | None = None
        self._start: list[dict[str, Any]] | None = None
        self._end: list[dict[str, Any]] | None = None
        self._t0_us: float | None = None  # CPU clock (time.time) in µs, as the driver stamps samples
        self._t1_us: float | None = None
        self._watched_s: float | None = None
        self._samples: list[dict[str, list[tuple[int, float]]]] = [
            {key: [] for key, _, _ in _SAMPLE_TYPES} for _ in self.handles]
        self._last_seen: list[dict[str, int]] = [{} for _ in self.handles]
        self._failed: list[set[str]] = [set() for _ in self.handles]  # sample types that raised

    @contextmanager
    def watching(self):
        """Bracket the timed windows: NVML reads just before and just after the block
        (energy counter, SM/memory clocks, clock-event reasons, violation counters, a CPU
        timestamp in µs), nothing during it. May be entered several times (e.g. once per
        configuration); each entry starts afresh and summary() describes the last one."""
        self._reset()
        self._start = [self._bracket(h, end=False) for h in self.handles]
        self._t0_us = time.time() * 1e6
        t0 = time.perf_counter()
        try:
            yield self
        finally:
            t1 = time.perf_counter()
            self._t1_us = time.time() * 1e6
            self._watched_s = t1 - t0
            self._end = [self._bracket(h, end=True) for h in self.handles]

    def collect(self) -> None:
        """Read the driver's sample buffers now. Optional: summary() does it once itself;
        call it between timed windows (never inside one) only when the windows together
        outlast the driver's buffer (about 100 samples per type). Never raises."""
        if self._t0_us is None:
            return
        for i, handle in enumerate(self.handles):
            for key, name, default in _SAMPLE_TYPES:
                if key in self._failed[i]:
                    continue
                self._read_samples(i, handle, key, getattr(self.nvml, name, default))

    def summary(self, samples_processed: float) -> dict[str, Any]:
        """After watching(): per device and overall, JSON-serialisable; None wherever NVML
        cannot tell. `samples_processed`: training samples the watched GPUs processed during
        the block (for energy per sample). Never raises."""
        if self._start is None or self._end is None or self._t0_us is None or self._t1_us is None:
            return self._unavailable(self.error or "summary() before watching() ended")
        try:
            return self._summary(samples_processed)
        except Exception as err:  # a value of an unexpected shape from an odd binding or driver
            return self._unavailable(self.error or f"summary: {type(err).__name__}: {err}")

    @staticmethod
    def _unavailable(error: str) -> dict[str, Any]:
        return {"available": False, "source": "NVML driver samples over the timed windows",
                "watched_s": None, "devices": [], "throttled": False, "throttle_reasons": [],
                "energy_per_sample_j": None, "error": error}

    def _summary(self, samples_processed: float) -> dict[str, Any]:
        assert self._start is not None and self._end is not None
        self.collect()
        devices, reasons = [], []
        for i, (start, end) in enumerate(zip(self._start, self._end)):
            device = self._device_summary(i, start, end)
            devices.append(device)
            reasons += _throttle_reasons(self.indices[i], device)
        energies = [d["energy_j"] for d in devices]
        per_sample = None
        if energies and all(e is not None for e in energies) and samples_processed and samples_processed > 0:
            per_sample = float(sum(energies)) / float(samples_processed)
        return {"available": True, "source": "NVML driver samples over the timed windows",
                "watched_s": float(self._watched_s or 0.0), "devices": devices,
                "throttled": bool(reasons), "throttle_reasons": reasons,
                "energy_per_sample_j": per_sample, "error": self.error}

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass

    # -- NVML reads ------------------------------------------------------------------------

    def _call(self, names: Sequence[str], *args) -> Any:
        """The first of `names` the binding has, called; None (and the first error kept) if
        it raises. A function no binding name exists for is None too, noted as an error."""
        for name in names:
            fn = getattr(self.nvml, name, None)
            if fn is None:
                continue
            try:
                return fn(*args)
            except Exception as err:  # NVMLError_NotSupported and friends
                self._note(name, err)
                return None
        self._note(names[0], "not in this nvidia-ml-py")
        return None

    def _note(self, name: str, err: Any) -> None:
        if self.error is None:
            self.error = f"{name}: {err if isinstance(err, str) else _describe(err)}"

    def _bracket(self, handle, end: bool) -> dict[str, Any]:
        nvml = self.nvml
        read: dict[str, Any] = {
            "energy_mj": self._call(("nvmlDeviceGetTotalEnergyConsumption",), handle),
            "sm_clock": self._call(("nvmlDeviceGetClockInfo",), handle, getattr(nvml, "NVML_CLOCK_SM", 1)),
            "mem_clock": self._call(("nvmlDeviceGetClockInfo",), handle, getattr(nvml, "NVML_CLOCK_MEM", 2)),
            "reasons": self._call(("nvmlDeviceGetCurrentClocksEventReasons",
                                   "nvmlDeviceGetCurrentClocksThrottleReasons"), handle),
            "power_ns": _violation_ns(self._call(("nvmlDeviceGetViolationStatus",), handle,
                                                 getattr(nvml, "NVML_PERF_POLICY_POWER", 0))),
            "thermal_ns": _violation_ns(self._call(("nvmlDeviceGetViolationStatus",), handle,
                                                   getattr(nvml, "NVML_PERF_POLICY_THERMAL", 1))),
        }
        if end:
            memory = self._call(("nvmlDeviceGetMemoryInfo",), handle)
            read["memory_used"] = _number(getattr(memory, "used", None))
        return read

    def _read_samples(self, i: int, handle, key: str, sampling_type: int) -> None:
        fn = getattr(self.nvml, "nvmlDeviceGetSamples", None)
        if fn is None:
            self._failed[i].add(key)
            self._note("nvmlDeviceGetSamples", "not in this nvidia-ml-py")
            return
        t0 = self._t0_us or 0.0
        last_seen = self._last_seen[i].get(key, int(t0))
        try:
            value_type, samples = fn(handle, sampling_type, last_seen)
        except Exception as err:
            if getattr(err, "value", None) == getattr(self.nvml, "NVML_ERROR_NOT_FOUND", _NVML_ERROR_NOT_FOUND):
                return  # no sample newer than last_seen: not an error
            self._failed[i].add(key)
            self._note("nvmlDeviceGetSamples", err)
            return
        field = _VALUE_FIELDS.get(value_type, "uiVal")
        kept = self._samples[i][key]
        try:
            for sample in samples or ():
                stamp = int(sample.timeStamp)
                value = _number(getattr(sample.sampleValue, field, None))
                if stamp > last_seen:
                    self._last_seen[i][key] = max(stamp, self._last_seen[i].get(key, 0))
                if value is not None and stamp > t0 and (self._t1_us is None or stamp <= self._t1_us):
                    kept.append((stamp, value))
        except Exception as err:  # an unexpected shape from an odd binding
            self._failed[i].add(key)
            self._note("nvmlDeviceGetSamples", err)

    # -- summaries -------------------------------------------------------------------------

    def _in_interval(self, i: int, key: str) -> list[float]:
        assert self._t0_us is not None and self._t1_us is not None
        return [v for t, v in self._samples[i][key] if self._t0_us < t <= self._t1_us]

    def _device_summary(self, i: int, start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
        util = self._in_interval(i, "util")
        power_mw = _mean(self._in_interval(i, "power"))
        reasons = [r for r in (start["reasons"], end["reasons"]) if r is not None]
        energy = _delta(start["energy_mj"], end["energy_mj"])
        power_ns = _delta(start["power_ns"], end["power_ns"])
        thermal_ns = _delta(start["thermal_ns"], end["thermal_ns"])
        memory = end.get("memory_used")
        return {
            "util_mean_pct": _mean(util), "util_samples": len(util),
            "power_mean_w": None if power_mw is None else power_mw / 1000,
            "sm_clock_mhz": _clock(start["sm_clock"], end["sm_clock"], self._in_interval(i, "sm_clock")),
            "mem_clock_mhz": _clock(start["mem_clock"], end["mem_clock"], self._in_interval(i, "mem_clock")),
            "clock_events": event_names(_union(reasons)) if reasons else None,
            "throttle_ms": {"power": None if power_ns is None else power_ns / 1e6,
                            "thermal": None if thermal_ns is None else thermal_ns / 1e6},
            "nvml_memory_max_mib": None if memory is None else memory / 2**20,
            "energy_j": None if energy is None else energy / 1000,
        }


def _throttle_reasons(index: int, device: dict[str, Any]) -> list[str]:
    """What in one device's summary counts as throttling, e.g. "GPU1: sw_thermal"."""
    out = [f"GPU{index}: {name}" for name in device["clock_events"] or () if name in THROTTLING_EVENTS]
    for kind, ms in device["throttle_ms"].items():
        if ms is not None and ms > 0:
            out.append(f"GPU{index}: {kind} violation {ms:.1f} ms")
    return out


def event_names(bits: int) -> list[str]:
    """NVML clock-event reason bits by name, in bit order; unknown bits as hex."""
    names, known = [], 0
    for bit, name in CLOCK_EVENT_BITS:
        known |= bit
        if bits & bit:
            names.append(name)
    rest = bits & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(hex(bit))
            rest &= ~bit
        bit <<= 1
    return names


def host_state() -> dict[str, Any]:
    """Host load around a replicate: {"loadavg_1m", "loadavg_5m", "cpu_count", "cpus_allowed"}
    (None where the platform cannot tell); never raises."""
    try:
        load1, load5, _ = os.getloadavg()
        loads: tuple[float | None, float | None] = (float(load1), float(load5))
    except Exception:  # not on this platform
        loads = (None, None)
    try:
        allowed: int | None = len(os.sched_getaffinity(0))
    except Exception:  # macOS, Windows
        allowed = None
    try:
        count = os.cpu_count()
    except Exception:
        count = None
    return {"loadavg_1m": loads[0], "loadavg_5m": loads[1], "cpu_count": count, "cpus_allowed": allowed}


def _describe(err: BaseException) -> str:
    """An NVMLError's message (its __str__ asks the library, which may be gone); never raises."""
    try:
        text = str(err)
    except Exception:
        text = ""
    return text or type(err).__name__


def _number(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _violation_ns(status: Any) -> float | None:
    return _number(getattr(status, "violationTime", None))


def _delta(before: Any, after: Any) -> float | None:
    if before is None or after is None:
        return None
    return float(after) - float(before)


def _mean(values: Sequence[float]) -> float | None:
    return float(sum(values)) / len(values) if values else None


def _union(values: Sequence[Any]) -> int:
    bits = 0
    for value in values:
        bits |= int(value)
    return bits


def _clock(start: Any, end: Any, sampled: Sequence[float]) -> dict[str, float | None]:
    start_v, end_v = _number(start), _number(end)
    seen = [v for v in (start_v, end_v, *sampled) if v is not None]
    return {"start": start_v, "end": end_v,
            "min": min(seen) if seen else None, "max": max(seen) if seen else None}
