"""GPU-to-GPU links, read without any ML framework: `nvidia-smi topo -m` and NVML.

Everything here degrades to an explicit "not available, because ..." on machines without
NVIDIA GPUs, nvidia-smi or nvidia-ml-py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ANCESTORS = {0: "same board", 10: "single PCIe switch", 20: "multiple PCIe switches",
              30: "PCIe host bridge", 40: "NUMA node (SMP interconnect inside a node)",
              50: "system (across NUMA nodes)"}


def topology() -> dict[str, Any]:
    """The link matrix from nvidia-smi and pairwise facts from NVML, or why not."""
    matrix = smi_matrix()
    links = nvml_links()
    return {"matrix": matrix, "links": links}


def smi_matrix() -> dict[str, Any]:
    if shutil.which("nvidia-smi") is None:
        return {"available": False, "reason": "nvidia-smi not found"}
    try:
        text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return {"available": False, "reason": f"nvidia-smi topo -m failed: {err}"}
    return {"available": True, **parse_topo_matrix(text)}


def parse_topo_matrix(text: str) -> dict[str, Any]:
    """{"gpus": ["GPU0", ...], "links": {"GPU0": {"GPU1": "NV18", ...}, ...}} from `topo -m`."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header = next((line.split() for line in lines if line.strip().startswith("GPU0")), [])
    gpus = [name for name in header if re.fullmatch(r"GPU\d+", name)]
    links: dict[str, dict[str, str]] = {}
    for line in lines:
        cells = line.split()
        if cells and cells[0] in gpus and len(cells) > len(gpus):
            links[cells[0]] = dict(zip(gpus, cells[1:1 + len(gpus)]))
    return {"gpus": gpus, "links": links}


def nvml_links() -> dict[str, Any]:
    """Per GPU pair: P2P read status and closest common ancestor; per GPU: active NVLinks."""
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return {"available": False, "reason": f"NVML: {err}"}
    try:
        return _pairs(pynvml)
    except Exception as err:  # the environment record must never stop a run
        return {"available": False, "reason": f"NVML query failed: {type(err).__name__}: {err}"}
    finally:
        pynvml.nvmlShutdown()


def _pairs(pynvml) -> dict[str, Any]:
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    pairs = [{"gpus": [i, j], "p2p_read": _p2p(pynvml, handles[i], handles[j]),
              "common_ancestor": _ancestor(pynvml, handles[i], handles[j])}
             for i in range(len(handles)) for j in range(i + 1, len(handles))]
    return {"available": True, "cuda_driver": _cuda_version(pynvml), "pairs": pairs,
            "active_nvlinks": [_active_nvlinks(pynvml, h) for h in handles]}


def _active_nvlinks(pynvml, handle) -> int:
    """Active NVLinks of one GPU. (Not matched to the remote GPU's PCI id: inside a VM the
    remote id is the host's, not the guest's; nvidia-smi's matrix gives the pairs.)"""
    count = 0
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            count += pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
        except Exception:  # NVMLError for links that do not exist; ctypes errors
            continue
    return count


def _p2p(pynvml, a, b) -> str:
    try:
        index = pynvml.NVML_P2P_CAPS_INDEX_READ
        index = index[0] if isinstance(index, tuple) else index  # a 1-tuple in some bindings
        status = pynvml.nvmlDeviceGetP2PStatus(a, b, int(index))
    except Exception as err:  # NVMLError, or ctypes errors from binding versions
        return f"unknown ({err})"
    return "ok" if status == pynvml.NVML_P2P_STATUS_OK else f"not supported (status {status})"


def _ancestor(pynvml, a, b) -> str:
    try:
        level = pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b)
    except Exception as err:  # NVMLError, or ctypes errors from binding versions
        return f"unknown ({err})"
    return _ANCESTORS.get(int(level), f"level {int(level)}")


def _cuda_version(pynvml) -> str:
    version = pynvml.nvmlSystemGetCudaDriverVersion()
    return f"{version // 1000}.{version % 1000 // 10}"
