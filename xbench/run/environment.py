"""The machine a run happened on, gathered without importing any framework.

Framework versions and the devices a backend actually used come from the worker (its
`DeviceInfo`) and are stored beside this in each record.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import xbench
from xbench.run.topology import topology


def host_environment() -> dict[str, Any]:
    """Host, CPU, memory, GPUs (via nvidia-smi when present), Python and xbench versions."""
    return {
        "host": platform.node(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "xbench": xbench.__version__,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "memory_gib": memory_gib(),
        "gpus": nvidia_gpus(),
        "gpu_topology": topology() if shutil.which("nvidia-smi") else None,
    }


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def memory_gib() -> float | None:
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return None


def nvidia_gpus() -> list[dict[str, str]]:
    """Name, driver and memory of each NVIDIA GPU; empty when there is none or no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = "index,name,driver_version,memory.total,pci.bus_id"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    keys = query.split(",")
    return [dict(zip(keys, (field.strip() for field in line.split(","))))
            for line in out.splitlines() if line.strip()]


def command_line() -> str:
    """The command as a user would retype it (also when started as `python -m xbench`)."""
    return " ".join(["xbench", *sys.argv[1:]])
