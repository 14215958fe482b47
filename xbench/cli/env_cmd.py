"""`xbench env`: the machine, its GPUs and how they are linked, and the frameworks installed."""

from __future__ import annotations

import os
from collections.abc import Mapping

from rich.markup import escape
from rich.table import Table

from xbench.cli.consoles import data_console
from xbench.results.links import nccl_variables, p2p_disabled
from xbench.run.environment import host_environment
from xbench.run.registry import discover


def env() -> int:
    """Devices, driver, CUDA, GPU-to-GPU links (NVLink, P2P, PCIe) and framework versions."""
    info = host_environment()
    console = data_console()
    console.print(f"host {info['host']}: {info['os']}, Python {info['python']}, xbench {info['xbench']}")
    console.print(f"CPU: {info['cpu']} ({info['cpu_count']} logical cores), memory {info['memory_gib']} GiB")
    if not info["gpus"]:
        console.print("GPUs: none found (no nvidia-smi, or it lists none); backends use simulated CPU devices")
    else:
        console.print(gpu_table(info))
        topo = info["gpu_topology"] or {}
        console.print(link_table(topo))
    console.print(escape(p2p_line(len(info["gpus"]), os.environ)))
    console.print(backend_table())
    return 0


def p2p_line(gpus: int, environ: Mapping[str, str]) -> str:
    """Which links a run's collectives would use here: P2P on or off, and what decides it."""
    nccl = " ".join(f"{k}={v}" for k, v in nccl_variables(environ).items())
    if p2p_disabled(environ):
        state = f"P2P off: NCCL_P2P_DISABLE={environ['NCCL_P2P_DISABLE']} in the environment stages GPU-to-GPU " \
                "traffic through host memory in every run (as --p2p off does)"
    else:
        state = ("P2P on: runs use the links above (NVLink, PCIe peer-to-peer); --p2p off stages GPU-to-GPU traffic "
                 "through host memory (NCCL_P2P_DISABLE=1, NCCL_NVLS_ENABLE=0)")
    if gpus < 2:
        state += f"; with {'one GPU' if gpus else 'no GPU'} the switch changes nothing here"
    return f"GPU-to-GPU links: {state}" + (f" [NCCL variables: {nccl}]" if nccl else "")


def gpu_table(info: dict) -> Table:
    links = (info.get("gpu_topology") or {}).get("links", {})
    cuda = links.get("cuda_driver", "?") if links.get("available") else "?"
    table = Table(title=f"GPUs (CUDA driver API {cuda})", title_justify="left")
    for column in ("index", "name", "driver", "memory", "PCI bus"):
        table.add_column(column)
    for gpu in info["gpus"]:
        table.add_row(gpu.get("index", ""), gpu.get("name", ""), gpu.get("driver_version", ""),
                      gpu.get("memory.total", ""), gpu.get("pci.bus_id", ""))
    return table


def link_table(topo: dict) -> Table:
    """nvidia-smi's matrix (NV# = bonded NVLinks, PIX/PXB/PHB/NODE/SYS = PCIe paths), with NVML's
    P2P status and common ancestor per pair."""
    matrix = topo.get("matrix", {})
    table = Table(title="GPU links (nvidia-smi topo -m): NV# = # bonded NVLinks; SYS, NODE, PHB, PXB, PIX = PCIe paths",
                  title_justify="left", min_width=60)
    if not matrix.get("available"):
        table.add_column("links")
        table.add_row(escape(matrix.get("reason", "not available")))
        return table
    gpus = matrix["gpus"]
    table.add_column("")
    for gpu in gpus:
        table.add_column(gpu, justify="center")
    for gpu in gpus:
        table.add_row(gpu, *(matrix["links"].get(gpu, {}).get(other, "") for other in gpus))
    pairs = topo.get("links", {})
    if pairs.get("available"):
        lines = [f"GPU{p['gpus'][0]}–GPU{p['gpus'][1]}: P2P read {p['p2p_read']}, "
                 f"common PCIe ancestor: {p['common_ancestor']}" for p in pairs["pairs"]]
        lines += [f"GPU{i}: {n} active NVLinks" for i, n in enumerate(pairs.get("active_nvlinks", []))]
        table.caption = "\n".join(lines)
        table.caption_justify = "left"
    return table


def backend_table() -> Table:
    table = Table(title="frameworks (installed versions; not imported)", title_justify="left")
    for column in ("backend", "version", "status"):
        table.add_column(column)
    for entry in discover().values():
        table.add_row(entry.name, entry.availability.version or "",
                      "available" if entry.usable else escape(entry.availability.reason or ""))
    return table
