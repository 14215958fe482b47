"""Devices' peak arithmetic rates, the denominator of model FLOPs utilisation (MFU).

Dense rates (no 2:4 structured sparsity, which vendors' headline figures often include), per
device, in FLOP/s, from the vendors' datasheets at boost clock. A device is matched by its name
as the frameworks report it (e.g. "NVIDIA H200", "NVIDIA H100 80GB HBM3"); a device not in the
table, and every CPU, has no peak: its MFU is "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass

TERA = 1e12


@dataclass(frozen=True)
class Peak:
    device: str  # the table's name for the device
    flops: float  # FLOP/s per device at the precision asked for
    unit: str  # which units deliver it: "CUDA cores" or "tensor cores"
    source: str


_HOPPER_SXM = "NVIDIA H100/H200 SXM datasheets (dense: half the sparse tensor figures)"
_HOPPER_PCIE = "NVIDIA H100 PCIe datasheet (dense)"
_HOPPER_NVL = "NVIDIA H100 NVL / H200 NVL datasheets (dense)"
_AMPERE = "NVIDIA A100 datasheet (dense)"

# (name fragment, table name, {precision: TFLOP/s}, source). Matched in order: the first
# fragment contained in the device's name wins, so the more specific names come first
# ("GH200" before "H200", "H100 PCIe" before "H100").
_TABLE: tuple[tuple[str, str, dict[str, float], str], ...] = (
    ("GH200", "GH200", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}, "NVIDIA GH200 datasheet (dense)"),
    ("H200 NVL", "H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5}, _HOPPER_NVL),
    ("H200", "H200 SXM", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}, _HOPPER_SXM),
    ("H100 NVL", "H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5}, _HOPPER_NVL),
    ("H100 PCIe", "H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0}, _HOPPER_PCIE),
    ("H100", "H100 SXM", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}, _HOPPER_SXM),
    ("A100", "A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0}, _AMPERE),
)
# fp32 runs on the CUDA cores; tf32 and bf16 matmuls on the tensor cores.
_UNITS = {"fp32": "CUDA cores", "tf32": "tensor cores", "bf16": "tensor cores"}


def peak_for(device_name: str, precision: str) -> Peak | None:
    """The device's dense peak at `precision` ("fp32", "tf32", "bf16"), or None where the
    device or the precision is not in the table."""
    for fragment, name, tflops, source in _TABLE:
        if fragment.lower() in device_name.lower():
            rate = tflops.get(precision)
            return None if rate is None else Peak(name, rate * TERA, _UNITS[precision], source)
    return None


