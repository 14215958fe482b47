"""Each backend's own all-reduce (and all-gather, reduce-scatter), timed on each device count
and buffer size: `xbench allreduce`, and a --breakdown run's measurement at its models'
gradient sizes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xbench.contract import ALL_REDUCE
from xbench.results.allreduce import collective_size, sizes_for
from xbench.results.records import ALLREDUCE_FILE, AllReduceRecord, RecordWriter
from xbench.run import launcher, probes
from xbench.run.cluster import Launch
from xbench.run.comparison import Comparison
from xbench.run.registry import BackendEntry
from xbench.run.zygote import ForkServers


def measure_allreduce(entries: Sequence[BackendEntry], device_counts: Sequence[int], platform: str,
                      sizes: Sequence[int], options: Mapping[str, Mapping[str, Any]], log_dir: Path,
                      environment: dict[str, Any], write=None, timeout_s: float = 600,
                      devices: Mapping[str, Mapping[str, Any]] | None = None,
                      launchers: Mapping[str, str] | None = None, launch: Launch | None = None,
                      startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S,
                      collectives: Sequence[str] = (ALL_REDUCE,),
                      servers: ForkServers | None = None) -> list[AllReduceRecord]:
    """Each backend's own collectives on each device count and buffer size (nccl-tests' size,
    rounded per `collective_size`); one record each, with the platform the backend found
    (`devices`, from probe_devices); the workers fork from `servers` where they can."""
    records = []
    for entry in entries:
        how = (launchers or {}).get(entry.name, "subprocess")
        for count in device_counts:
            items = _items(collectives, sizes, count)
            events = probes.allreduce_events(entry.target, count, platform, [n for _, n in items],
                                               dict(options.get(entry.name, {})), log_dir / launcher.LOG_FILE,
                                               timeout_s, how, launch, startup_timeout_s,
                                               collectives=[c for c, _ in items], servers=servers)
            for event in events:
                info = (devices or {}).get(entry.name) or {}
                record: AllReduceRecord = {
                    "kind": "allreduce", "backend": entry.name, "devices": count, "launcher": how,
                    "platform": "simulated CPU" if info.get("simulated") else info.get("platform"),
                    "nbytes": event["nbytes"], "status": event["status"], "reason": event.get("reason"),
                    "timing": event.get("timing"), "environment": environment,
                    "collective": event.get("collective", ALL_REDUCE)}
                if write is not None:
                    write(record)
                records.append(record)
    return records


def _items(collectives: Sequence[str], sizes: Sequence[int], devices: int) -> list[tuple[str, int]]:
    """(collective, size) in the order they are timed, each size as that collective moves it
    on `devices`, once."""
    return list(dict.fromkeys((c, collective_size(c, n, devices)) for c in collectives for n in sizes))


def breakdown_allreduce(comparison: Comparison, environment: dict[str, Any],
                        servers: ForkServers | None = None) -> list[AllReduceRecord]:
    """--breakdown: the all-reduce at each model's gradient size (and a sweep), multi-device."""
    counts = [n for n in comparison.spec.devices if n > 1]
    if not counts:
        return []
    gradient_bytes = [4 * model.params for model in comparison.spec.models]
    gpu = any(not info["simulated"] for info in comparison.devices.values())
    return measure_allreduce(comparison.entries, counts, comparison.spec.platform, sizes_for(gradient_bytes, gpu),
                             comparison.spec.options, comparison.run_dir, environment,
                             write=RecordWriter(comparison.run_dir, ALLREDUCE_FILE).append,
                             devices=comparison.devices, launchers=comparison.launchers, launch=comparison.launch,
                             startup_timeout_s=comparison.startup_timeout_s, servers=servers)
