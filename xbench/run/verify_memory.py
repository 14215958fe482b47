"""Verification's workers on shared GPUs: how many the devices' memory holds at once, each
worker's share of a GPU's memory (its backend caps its allocator to it), the runs that ran out
of memory beside others (run again alone, without a cap), and each run's framework peak."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from xbench.contract import MEMORY_SHARE_VARIABLE
from xbench.models.memory import GiB
from xbench.results.fit import MemoryCheck, out_of_memory
from xbench.results.records import Record
from xbench.run.plan import Group

# What a worker holds on its GPU besides the estimate of its step (CUDA context, kernels,
# the allocator's slack), outside the framework's pool: about a GiB each.
WORKER_CONTEXT_BYTES = GiB
# The most workers a GPU whose workers are capped at their share: where more fit, each run is
# small beside the GPU, and uncapped they fitted (GPT-2 small's and ResNet-50's runs, 8 and
# 16 workers on one and two H200s, 48-136 GiB at the busiest); where few fit, one allocator's
# overshoot is tens of GiB (gpt2-xl, 3 workers: two pools of 64.6 GiB each).
MOST_CAPPED_PER_GPU = 4


def memory_parallel(checks: Mapping[str, MemoryCheck], gpus: int, widest: int = 1) -> int | None:
    """How many verification workers the devices' memory holds at once, were each to hold
    the largest run's estimate (`checks`) and `WORKER_CONTEXT_BYTES` on each of its devices,
    over `gpus` GPUs with jobs of up to `widest` devices; None where the memory is not known.
    Side by side, workers that each fit would otherwise run out of memory together (what the
    estimate misses is run again alone afterwards)."""
    known = [check for check in checks.values() if check.usable_bytes is not None]
    if not known:
        return None
    usable = min(check.usable_bytes or 0 for check in known)
    largest = max(check.estimate.total for check in known) + WORKER_CONTEXT_BYTES
    return max(1, usable // largest * gpus // max(1, min(widest, gpus)))


def workers_per_gpu(workers: int, gpus: int, widest: int) -> int:
    """The most of `workers` side-by-side jobs of up to `widest` devices that one of `gpus`
    GPUs can hold: each job's devices start at its own GPU in turn
    (`launcher.spread_environment`), and a job of several devices spans that many."""
    return min(workers, -(-workers * max(1, min(widest, gpus)) // gpus))


def memory_share_environment(checks: Mapping[str, MemoryCheck], workers: int, gpus: int,
                             widest: int = 1) -> dict[str, str]:
    """Where `workers` run side by side over `gpus` GPUs and more than one can share a GPU
    (`workers_per_gpu`; `verification.verify` asks only where memory limited the workers),
    each worker's share of a GPU's memory for its backend to cap its allocator to
    (`MEMORY_SHARE_VARIABLE`): the usable memory split evenly, less each worker's
    `WORKER_CONTEXT_BYTES`, which lie outside the framework's pool. Without it, an allocator
    that grows its reservation geometrically held 64.6 GiB in each of two workers on one
    H200 where 39 GiB were planned for the largest run (gpt2-xl's full-size probe), and that
    probe ran out of memory beside them. Nothing for one worker a GPU, for more than
    `MOST_CAPPED_PER_GPU`, or where the memory is not known."""
    known = [check for check in checks.values() if check.usable_bytes and check.capacity_bytes]
    per_gpu = workers_per_gpu(workers, gpus, widest)
    if not known or not 1 < per_gpu <= MOST_CAPPED_PER_GPU:
        return {}
    capacity = min(check.capacity_bytes or 0 for check in known)
    usable = min(check.usable_bytes or 0 for check in known)
    share = max(usable // per_gpu - WORKER_CONTEXT_BYTES, 0) / capacity
    return {MEMORY_SHARE_VARIABLE: f"{share:.4f}"}


def out_of_memory_beside_others(groups: Sequence[Group], records: Sequence[Record], parallel: int) -> list[Group]:
    """The trials that ran out of memory while other workers shared the devices, each in a
    group of its own, to run again with nothing beside it: the others' memory (an allocator
    keeps what it freed until its process ends) is no verdict on the model. On one H200,
    gpt2-xl's full-size probe failed asking for 26 GiB while the GPU's 139 GiB were in use."""
    if min(parallel, len(groups)) <= 1:
        return []
    failed = {r["trial_id"] for r in records
              if r["status"] in ("failed", "crashed") and out_of_memory(r.get("reason"))}
    return [replace(group, trials=(trial,), positions=(position,)) for group in groups
            for trial, position in zip(group.trials, group.positions) if trial.id in failed]


def memory_peaks(records: Sequence[Record]) -> dict[str, int]:
    """Trial id -> the largest framework peak over its devices, for the ok runs whose peak is
    their own (scope "trial"; a framework whose counter cannot be reset may report an earlier
    run's of the same worker); the last record of a trial run twice (out of memory, then alone)."""
    return {r["trial_id"]: max(memory["peak_bytes"]) for r in records
            if r["status"] == "ok" and (memory := r.get("framework_memory")) and memory.get("peak_bytes")
            and memory.get("scope") == "trial"}
