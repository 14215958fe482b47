"""Before trials launch: each one's estimated memory per device against the memory of the
devices the run found (`xbench.results.fit`), so that a configuration that cannot fit is a
skipped row that says so, not a worker that dies of it.

The device memory is the smallest GPU's total as nvidia-smi reports it (the host environment of
every record), or `MEMORY_VARIABLE` in GiB where it is set, which also checks simulated CPU
devices (otherwise never checked: their memory is the host's, shared by all of them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from xbench.contract import DATA_PARALLEL, Trial
from xbench.errors import XbenchError, brief
from xbench.models.memory import GiB
from xbench.results.fit import MemoryCheck, check
from xbench.run.plan import Lineup

MEMORY_VARIABLE = "XBENCH_DEVICE_MEMORY_GIB"


def device_memory_bytes(device_info: Mapping[str, Any] | None, environment: Mapping[str, Any]) -> int | None:
    """One device's memory for the check: `MEMORY_VARIABLE` where set, else the smallest GPU's
    total for a backend on real GPUs, else None (not checked)."""
    given = pretended_memory_bytes()
    if given is not None:
        return given
    if device_info is None or device_info.get("simulated", True) or device_info.get("platform") != "gpu":
        return None
    totals = [_mib(gpu.get("memory.total")) for gpu in environment.get("gpus") or []]
    known = [mib for mib in totals if mib]
    return min(known) * 2**20 if known else None


def pretended_memory_bytes() -> int | None:
    """`MEMORY_VARIABLE` in bytes, or None where it is unset; a one-line XbenchError for a
    value that is not a positive, finite number of GiB. `ready_backends` asks first, so that a
    typo stops the run before any worker starts rather than when timing begins."""
    given = os.environ.get(MEMORY_VARIABLE, "").strip()
    if not given:
        return None
    try:
        gib = float(given)
    except ValueError:
        gib = math.nan
    if not 0 < gib < math.inf:
        raise XbenchError(f"{MEMORY_VARIABLE}={brief(given)} is not a positive number of GiB; set it to e.g. 16, "
                          "or unset it to check against the GPUs' own memory")
    return int(gib * GiB)


def _mib(text: Any) -> int | None:
    """nvidia-smi's "81559 MiB" as 81559; None where it says something else ("[N/A]")."""
    try:
        return int(str(text).split()[0])
    except (ValueError, IndexError):
        return None


def memory_checks(trials: Sequence[Trial], lineups: Mapping[str, Lineup],
                  devices: Mapping[str, Mapping[str, Any]], environment: Mapping[str, Any]
                  ) -> dict[str, MemoryCheck]:
    """Each trial's check by its configuration's id (`Trial.config_id`: every replicate's); a
    trial whose memory cannot be estimated has none."""
    capacity = {name: device_memory_bytes(info, environment) for name, info in devices.items()}
    variants = {(name, v.name): v for name, lineup in lineups.items() for v in lineup.variants}
    found = {}
    for trial in trials:
        variant = variants.get((trial.backend, trial.variant))
        buffers = (variant.reduction_buffers or 0) if variant is not None and trial.program == DATA_PARALLEL else 0
        result = check(trial.model, trial.global_batch, trial.devices, trial.precision,
                       variant is not None and variant.sharded, capacity.get(trial.backend),
                       recompute=variant is not None and variant.recompute,
                       fused_attention=variant is not None and variant.fused_attention is True,
                       reduction_buffers=buffers,
                       float32_softmax=variant is not None and variant.float32_softmax is True)
        if result is not None:
            found[trial.config_id] = result
    return found
