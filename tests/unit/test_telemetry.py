"""WindowWatch: NVML reads bracketing the timed windows plus the driver's sample buffer,
against a fake NVML (no GPU here), and host_state."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from xbench.worker import telemetry
from xbench.worker.telemetry import THROTTLING_EVENTS, WindowWatch, event_names, host_state, open_window_watch

DEVICE_KEYS = {"util_mean_pct", "util_samples", "power_mean_w", "sm_clock_mhz", "mem_clock_mhz",
               "clock_events", "throttle_ms", "nvml_memory_max_mib", "energy_j"}
SUMMARY_KEYS = {"available", "source", "watched_s", "devices", "throttled", "throttle_reasons",
                "energy_per_sample_j", "error"}


class NVMLError(Exception):
    value = 999

    def __str__(self) -> str:
        return {3: "Not Supported", 6: "Not Found"}.get(self.value, "Unknown Error")


class NVMLError_NotSupported(NVMLError):
    value = 3


class NVMLError_NotFound(NVMLError):
    value = 6


class FakeNvml:
    """The parts of pynvml WindowWatch uses. Per-handle state is plain data that a test
    changes inside the `watching()` block, so start and end reads differ. Like the real
    driver, nvmlDeviceGetSamples returns samples newer than lastSeenTimeStamp, or raises
    NotFound when there are none (`sloppy` returns them all, to test our own filtering)."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NotFound = NVMLError_NotFound
    NVML_ERROR_NOT_FOUND = 6
    NVML_TOTAL_POWER_SAMPLES = 0
    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_PROCESSOR_CLK_SAMPLES = 5
    NVML_MEMORY_CLK_SAMPLES = 6
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_PERF_POLICY_POWER = 0
    NVML_PERF_POLICY_THERMAL = 1

    def __init__(self, devices: int = 1, sloppy: bool = False) -> None:
        self.sloppy = sloppy
        self.shutdowns = 0
        self.last_seen: list[int] = []
        self.state = [{"energy_mj": 1000, "sm": 1980, "mem": 2619, "reasons": 0, "power_ns": 0,
                       "thermal_ns": 0, "used": 40 * 2**30, "samples": {}} for _ in range(devices)]

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self.state[h]["energy_mj"]

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self.state[h]["sm" if kind == self.NVML_CLOCK_SM else "mem"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.state[h]["reasons"]

    def nvmlDeviceGetViolationStatus(self, h, policy):
        ns = self.state[h]["power_ns" if policy == self.NVML_PERF_POLICY_POWER else "thermal_ns"]
        return SimpleNamespace(referenceTime=0, violationTime=ns)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self.state[h]["used"], total=141 * 2**30, free=0)

    def nvmlDeviceGetSamples(self, h, kind, last_seen):
        self.last_seen.append(last_seen)
        stamped = self.state[h]["samples"].get(kind, [])
        out = [SimpleNamespace(timeStamp=int(t), sampleValue=SimpleNamespace(uiVal=v))
               for t, v in stamped if self.sloppy or t > last_seen]
        if not out:
            raise NVMLError_NotFound()
        return 1, out  # NVML_VALUE_TYPE_UNSIGNED_INT


def now_us() -> int:
    return int(time.time() * 1e6)


def inside_stamps() -> tuple[int, int]:
    """Two CPU timestamps (µs) strictly inside the enclosing watching() block."""
    time.sleep(0.001)
    a = now_us()
    time.sleep(0.001)
    b = now_us()
    time.sleep(0.001)
    return a, b


def test_samples_inside_the_interval_only_and_every_field():
    nvml = FakeNvml(devices=2, sloppy=True)
    watch = WindowWatch(nvml, [0, 1])
    with watch.watching():
        a, b = inside_stamps()
        before, after = a - 10_000_000, b + 10_000_000
        for h in (0, 1):
            nvml.state[h]["samples"] = {
                1: [(before, 5), (a, 80), (b, 100), (after, 7)],                # util %
                0: [(before, 90_000), (a, 600_000), (b, 700_000), (after, 1)],  # power mW
                5: [(before, 300), (a, 1755), (b, 1980), (after, 100)],         # SM clock MHz
                6: [(a, 2619)],                                                  # memory clock MHz
            }
            nvml.state[h].update(energy_mj=1000 + 500_000 * (h + 1), sm=1830, used=60 * 2**30, reasons=0x1)
    out = watch.summary(samples_processed=1000)

    assert set(out) == SUMMARY_KEYS
    assert out["available"] is True and out["error"] is None
    assert out["source"] == "NVML driver samples over the timed windows"
    assert 0.003 <= out["watched_s"] < 1.0
    json.dumps(out)  # plain JSON
    d0, d1 = out["devices"]
    assert set(d0) == DEVICE_KEYS
    assert d0["util_samples"] == 2 and d0["util_mean_pct"] == pytest.approx(90.0)
    assert d0["power_mean_w"] == pytest.approx(650.0)
    # start 1980 and end 1830 read directly, 1755 only from the driver's samples; 300 and
    # 100 lie outside the interval
    assert d0["sm_clock_mhz"] == {"start": 1980.0, "end": 1830.0, "min": 1755.0, "max": 1980.0}
    assert d0["mem_clock_mhz"] == {"start": 2619.0, "end": 2619.0, "min": 2619.0, "max": 2619.0}
    assert d0["clock_events"] == ["gpu_idle"]
    assert d0["throttle_ms"] == {"power": 0.0, "thermal": 0.0}
    assert d0["nvml_memory_max_mib"] == pytest.approx(60 * 1024)
    assert d0["energy_j"] == pytest.approx(500.0) and d1["energy_j"] == pytest.approx(1000.0)
    assert out["energy_per_sample_j"] == pytest.approx(1.5)
    assert out["throttled"] is False and out["throttle_reasons"] == []  # idle is no throttling


def test_last_seen_is_the_start_time_and_the_driver_filter_is_honoured():
    nvml = FakeNvml()
    watch = WindowWatch(nvml, [0])
    with watch.watching():
        a, b = inside_stamps()
        nvml.state[0]["samples"] = {1: [(a - 10_000_000, 0), (a, 50), (b, 70)]}
    entered = watch._t0_us
    out = watch.summary(10)
    assert out["devices"][0]["util_mean_pct"] == pytest.approx(60.0)
    assert out["devices"][0]["util_samples"] == 2
    assert nvml.last_seen and all(abs(t - entered) <= 1 for t in nvml.last_seen)
    assert out["devices"][0]["power_mean_w"] is None  # NotFound: no samples, and no error
    assert out["error"] is None


def test_sw_thermal_at_either_end_is_throttling():
    nvml = FakeNvml()
    watch = WindowWatch(nvml, [0], indices=[3])
    with watch.watching():
        nvml.state[0]["reasons"] = 0x20 | 0x1
    out = watch.summary(1)
    assert out["devices"][0]["clock_events"] == ["gpu_idle", "sw_thermal"]
    assert out["throttled"] is True
    assert out["throttle_reasons"] == ["GPU3: sw_thermal"]


@pytest.mark.parametrize("bits", [0x1, 0x2, 0x10, 0x100, 0x1 | 0x2 | 0x10 | 0x100])
def test_idle_and_clock_settings_are_not_throttling(bits):
    nvml = FakeNvml()
    nvml.state[0]["reasons"] = bits
    watch = WindowWatch(nvml, [0])
    with watch.watching():
        pass
    out = watch.summary(1)
    assert out["devices"][0]["clock_events"]
    assert out["throttled"] is False and out["throttle_reasons"] == []


def test_event_names():
    assert event_names(0) == []
    assert event_names(0x4 | 0x8 | 0x40 | 0x80) == ["sw_power_cap", "hw_slowdown", "hw_thermal", "hw_power_brake"]
    assert event_names(0x1000) == ["0x1000"]
    assert set(THROTTLING_EVENTS) == {"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"}


def test_violation_counter_delta_is_throttle_time():
    nvml = FakeNvml(devices=2)
    nvml.state[1].update(power_ns=1_000_000, thermal_ns=5_000_000)
    watch = WindowWatch(nvml, [0, 1])
    with watch.watching():
        nvml.state[1]["power_ns"] = 13_300_000
    out = watch.summary(1)
    assert out["devices"][1]["throttle_ms"] == {"power": pytest.approx(12.3), "thermal": 0.0}
    assert out["throttled"] is True
    assert out["throttle_reasons"] == ["GPU1: power violation 12.3 ms"]


def test_unsupported_samples_leave_util_none_and_record_the_error():
    nvml = FakeNvml()

    def unsupported(h, kind, last_seen):
        raise NVMLError_NotSupported()

    nvml.nvmlDeviceGetSamples = unsupported
    watch = WindowWatch(nvml, [0])
    with watch.watching():
        pass
    out = watch.summary(100)
    device = out["devices"][0]
    assert device["util_mean_pct"] is None and device["util_samples"] == 0 and device["power_mean_w"] is None
    assert device["sm_clock_mhz"]["min"] == 1980.0  # the bracketing reads still count
    assert out["error"] == "nvmlDeviceGetSamples: Not Supported"
    assert out["available"] is True


def test_old_binding_without_newer_functions():
    class OldNvml(FakeNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment]
        nvmlDeviceGetSamples = None  # type: ignore[assignment]
        nvmlDeviceGetTotalEnergyConsumption = None  # type: ignore[assignment]
        nvmlDeviceGetViolationStatus = None  # type: ignore[assignment]

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
            return 0x4

    nvml = OldNvml()
    watch = WindowWatch(nvml, [0])
    with watch.watching():
        pass
    out = watch.summary(100)
    device = out["devices"][0]
    assert device["clock_events"] == ["sw_power_cap"]  # through the older name
    assert device["energy_j"] is None and out["energy_per_sample_j"] is None
    assert device["throttle_ms"] == {"power": None, "thermal": None}
    assert device["util_mean_pct"] is None and device["util_samples"] == 0
    assert out["throttled"] is True and out["throttle_reasons"] == ["GPU0: sw_power_cap"]
    assert "not in this nvidia-ml-py" in out["error"]


def test_every_call_failing_gives_nones_not_exceptions():
    class Broken(FakeNvml):
        def __getattribute__(self, name):
            if name.startswith("nvmlDevice"):
                def fail(*args):
                    raise NVMLError_NotSupported()
                return fail
            return super().__getattribute__(name)

    watch = WindowWatch(Broken(devices=2), [0, 1])
    with watch.watching():
        pass
    out = watch.summary(100)
    json.dumps(out)
    assert out["error"] == "nvmlDeviceGetTotalEnergyConsumption: Not Supported"
    for device in out["devices"]:
        assert device["clock_events"] is None and device["energy_j"] is None
        assert device["nvml_memory_max_mib"] is None
        assert device["sm_clock_mhz"] == {"start": None, "end": None, "min": None, "max": None}
    assert out["throttled"] is False and out["energy_per_sample_j"] is None


def test_each_entry_starts_afresh():
    nvml = FakeNvml()
    watch = WindowWatch(nvml, [0])
    with watch.watching():
        a, _ = inside_stamps()
        nvml.state[0]["samples"] = {1: [(a, 10)]}
        nvml.state[0]["reasons"] = 0x20
    assert watch.summary(1)["throttled"] is True
    nvml.state[0]["reasons"] = 0
    with watch.watching():
        _, b = inside_stamps()
        nvml.state[0]["samples"] = {1: [(a, 10), (b, 30)]}
        nvml.state[0]["energy_mj"] += 2000
    out = watch.summary(4)
    assert out["throttled"] is False
    assert out["devices"][0]["util_samples"] == 1 and out["devices"][0]["util_mean_pct"] == 30.0
    assert out["energy_per_sample_j"] == pytest.approx(0.5)


def test_the_end_is_read_even_when_the_block_raises():
    nvml = FakeNvml()
    watch = WindowWatch(nvml, [0])
    with pytest.raises(RuntimeError):
        with watch.watching():
            nvml.state[0]["energy_mj"] += 3000
            raise RuntimeError("trial failed")
    assert watch.summary(3)["devices"][0]["energy_j"] == pytest.approx(3.0)


def test_summary_before_watching_says_so():
    out = WindowWatch(FakeNvml(), [0]).summary(1)
    assert set(out) == SUMMARY_KEYS and out["available"] is False and out["error"]


def test_close_shuts_nvml_down_and_ignores_errors():
    nvml = FakeNvml()
    WindowWatch(nvml, [0]).close()
    assert nvml.shutdowns == 1

    def fail():
        raise NVMLError()

    nvml.nvmlShutdown = fail
    WindowWatch(nvml, [0]).close()


def test_open_window_watch_without_a_gpu_says_why():
    watch = open_window_watch([0, 1])
    if not isinstance(watch, str):  # a machine with NVML after all
        watch.close()
        pytest.skip("NVML works here")
    assert watch.startswith("NVML: ") or watch == "nvidia-ml-py not installed"


def test_open_window_watch_reasons(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert open_window_watch([0]) == "nvidia-ml-py not installed"

    def no_driver():
        raise NVMLError()

    fake = FakeNvml()
    fake.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert open_window_watch([0]) == "NVML: Unknown Error"

    fake = FakeNvml(devices=2)
    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    watch = open_window_watch([1, 0])
    assert isinstance(watch, WindowWatch) and watch.indices == [1, 0] and watch.handles == [1, 0]


def test_host_state():
    state = host_state()
    assert set(state) == {"loadavg_1m", "loadavg_5m", "cpu_count", "cpus_allowed"}
    json.dumps(state)
    if hasattr(telemetry.os, "sched_getaffinity"):
        assert 1 <= state["cpus_allowed"] <= (state["cpu_count"] or state["cpus_allowed"])


def test_core_names_no_framework():
    source = Path(telemetry.__file__).read_text().lower()
    assert not any(name in source for name in ("jax", "torch", "tensorflow"))


def test_an_odd_value_from_the_binding_never_raises():
    nvml = FakeNvml()
    nvml.state[0]["reasons"] = "garbage"
    watch = WindowWatch(nvml, [0])
    with watch.watching():
        pass
    out = watch.summary(1)
    assert set(out) == SUMMARY_KEYS and out["available"] is False and "summary" in out["error"]
