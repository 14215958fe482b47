"""The GPU-to-GPU links of a run, as its records keep them (`environment["links"]`) and as
outputs name them: P2P on (the machine's own links: NVLink, PCIe peer-to-peer) or off (NCCL's
collectives stage GPU-to-GPU traffic through host memory, as on a PCIe machine without
peer-to-peer such as the seed study's). `xbench.run.links` puts the switch into the workers'
environment."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

P2P_CHOICES = ("on", "off")
# NCCL_P2P_DISABLE: no direct GPU-to-GPU transport (NVLink or PCIe); NCCL_NVLS_ENABLE=0: no
# NVLink SHARP, which on NVSwitch machines would still reduce over NVLink.
P2P_OFF = {"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}
HOST_MEMORY_PATH = "NCCL_SHM_DISABLE"  # unset under P2P off: host shared memory, not the network
HOST_MEMORY = "GPU-to-GPU traffic through host memory"
NO_EFFECT = "changes nothing here"  # in `short`'s words where P2P off reached no collective
NOT_A_PCIE_BOX = ("host-memory staging on this machine, not a PCIe machine's own bandwidth: a real PCIe box "
                  "without peer-to-peer differs in its PCIe generation, lanes and CPU")


def nccl_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """NCCL's variables in an environment, which decide the links its collectives use."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith("NCCL_")}


def p2p_disabled(environ: Mapping[str, str]) -> bool:
    """Whether NCCL would leave out its peer-to-peer transport (any non-zero integer)."""
    try:
        return int(environ.get("NCCL_P2P_DISABLE", "0") or "0") != 0
    except ValueError:
        return False  # NCCL reads a non-number as its default: P2P on


def links_record(p2p: bool, variables: Mapping[str, str], devices: Mapping[str, Mapping[str, Any]],
                 counts: tuple[int, ...] | list[int]) -> dict[str, Any]:
    """What a run records of its links (`environment["links"]` of every record): P2P as asked
    and as in force, who turned it off, NCCL's variables in the workers, and what it changed."""
    off = p2p_disabled(variables)
    by = None if not off else ("--p2p off" if not p2p else
                               f"NCCL_P2P_DISABLE={variables.get('NCCL_P2P_DISABLE')} in the environment")
    return {"p2p": "off" if off else "on", "asked": "on" if p2p else "off", "turned_off_by": by,
            "nccl": dict(variables), "effect": effect(off, devices, counts)}


def effect(off: bool, devices: Mapping[str, Mapping[str, Any]], counts: tuple[int, ...] | list[int]) -> str:
    """What P2P off changes in this run, in a few words ("" for P2P on)."""
    if not off:
        return ""
    simulated = [name for name, info in devices.items() if info.get("simulated")]
    if devices and len(simulated) == len(devices):
        return ("nothing: simulated CPU devices, whose collectives (in-process, or gloo) do not use NCCL; no "
                "host-memory topology was measured")
    gpus = max((int(info.get("available") or 0) for info in devices.values() if not info.get("simulated")),
               default=0)
    if devices and (gpus < 2 or max(counts or [1]) < 2):
        return "nothing: one GPU, so no GPU-to-GPU traffic"
    ignored = f"; not {', '.join(sorted(simulated))} (simulated CPU devices: no NCCL)" if simulated else ""
    return f"{HOST_MEMORY} for collectives through NCCL{ignored}"


def notes(record: Mapping[str, Any]) -> list[str]:
    """One line per thing a user must know about the links of a run with P2P off."""
    if not record or record.get("p2p") != "off":
        return []
    said = record.get("effect") or ""
    who = record.get("turned_off_by") or "--p2p off"
    if said.startswith("nothing"):
        return [f"P2P off ({who}) changes {said}; the run goes on"]
    variables = ", ".join(f"{k}={v}" for k, v in (record.get("nccl") or {}).items() if k in P2P_OFF)
    return [f"P2P off ({who}; {variables}): {said}, as on a PCIe machine without peer-to-peer "
            f"({NOT_A_PCIE_BOX})"]


def short(record: Mapping[str, Any] | None) -> str:
    """A few words for a table's title or a block's head: "" where P2P was on."""
    if not record or record.get("p2p") != "off":
        return ""
    if (record.get("effect") or "").startswith("nothing"):
        return f"P2P off asked, {NO_EFFECT}"
    return "P2P off: GPU-to-GPU traffic through host memory"
