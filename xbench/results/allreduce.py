"""The collectives microbenchmark: each backend's own all-reduce (and all-gather,
reduce-scatter) on float32 buffers.

Sizes and bandwidths follow nccl-tests (its doc/PERFORMANCE.md): the size is the whole buffer
(all-reduce's buffer on each device, all-gather's output, reduce-scatter's input), algbw =
size / time, and busbw = algbw × 2(n-1)/n for all-reduce, × (n-1)/n for all-gather and
reduce-scatter: the rate each link must carry in a ring, comparable across device counts (0
on one device).
The time is the median per operation over one worker's windows; its interval is the
distribution-free interval of that median (`stats.median_interval`), not of the mean.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from xbench import stats
from xbench.contract import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, backend_label
from xbench.errors import brief
from xbench.results.records import AllReduceRecord

_UNITS = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
SWEEP = (2**12, 2**18, 2**24)  # 4 KiB, 256 KiB, 16 MiB; with gradient sizes in --breakdown
GPU_SWEEP = (2**28, 2**30)  # 256 MiB and 1 GiB where real GPUs are


def parse_size(text: str) -> int:
    """'1GiB', '64MiB', '4KiB', '217612' -> bytes (a multiple of 4: float32 elements)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"not a size: {brief(text)} (use e.g. 4KiB, 64MiB, 1GiB or bytes)")
    nbytes = int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])
    if nbytes < 4:
        raise ValueError(f"size {brief(text)} is smaller than one float32")
    return nbytes - nbytes % 4


def format_size(nbytes: int) -> str:
    """Exact binary units where they fit (4 KiB, 1.5 GiB), else bytes (217,612 B)."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        value = nbytes / factor
        if value >= 1 and (value * 4).is_integer():
            return f"{value:g} {unit}"
    return f"{nbytes:,} B"


# Per collective: nccl-tests' program, its redop column, and the name a reader knows it by.
NCCL_PROGRAMS = {ALL_REDUCE: "all_reduce_perf", ALL_GATHER: "all_gather_perf", REDUCE_SCATTER: "reduce_scatter_perf"}
REDOPS = {ALL_REDUCE: "sum", ALL_GATHER: "none", REDUCE_SCATTER: "sum"}
TITLES = {ALL_REDUCE: "all-reduce", ALL_GATHER: "all-gather", REDUCE_SCATTER: "reduce-scatter"}


def bus_factor(devices: int, collective: str = ALL_REDUCE) -> float:
    """busbw / algbw: 2(n-1)/n for an all-reduce, (n-1)/n for an all-gather or a
    reduce-scatter, each of which is half an all-reduce's traffic."""
    share = (devices - 1) / devices
    return 2 * share if collective == ALL_REDUCE else share


def collective_size(collective: str, nbytes: int, devices: int) -> int:
    """The size timed for `nbytes` asked: an all-gather or reduce-scatter moves whole float32
    elements per device, so its size falls to a multiple of 4 × devices (as nccl-tests
    rounds its count), at least one element each."""
    if collective == ALL_REDUCE:
        return nbytes
    return max(nbytes // (4 * devices), 1) * 4 * devices


def element_count(collective: str, nbytes: int, devices: int) -> int:
    """nccl-tests' count column: the buffer's elements for an all-reduce, each device's share
    for an all-gather (what it sends) or a reduce-scatter (what it receives)."""
    return nbytes // 4 if collective == ALL_REDUCE else nbytes // 4 // devices


@dataclass(frozen=True)
class AllReduceResult:
    backend: str
    devices: int
    nbytes: int
    time: stats.Summary  # seconds per all-reduce, outliers removed
    launcher: str = "subprocess"
    median_ci: tuple[float, float] | None = None  # 95% interval of time.median; None: too few windows
    collective: str = ALL_REDUCE

    @property
    def label(self) -> str:
        return backend_label(self.backend, self.launcher)

    @property
    def algbw(self) -> float:
        """Bytes per second at the median time."""
        return self.nbytes / self.time.median

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.devices, self.collective)


def result_from_record(record: AllReduceRecord) -> AllReduceResult:
    """An ok record's result (a failed size has no timing: ValueError)."""
    timing = record["timing"]
    if timing is None:
        raise ValueError(f"the all-reduce of {record['nbytes']} bytes has no timing ({record['status']})")
    per_op = [window / timing["steps_per_window"] for window in timing["window_s"]]  # seconds per all-reduce
    kept, removed = stats.remove_outliers(per_op)
    # The interval is of the median printed, so it is taken over the same windows.
    return AllReduceResult(record["backend"], record["devices"], record["nbytes"], stats.describe(kept, removed),
                           record.get("launcher", "subprocess"), stats.median_interval(kept), collective_of(record))


def collective_of(record: AllReduceRecord) -> str:
    """A record's collective ("allreduce" for records written before there were others)."""
    return record.get("collective", ALL_REDUCE)


def ok_results(records: Sequence[AllReduceRecord]) -> list[AllReduceResult]:
    return [result_from_record(r) for r in records if r["status"] == "ok"]


def sizes_for(gradient_bytes: Sequence[int], gpu: bool) -> list[int]:
    """The models' gradient sizes and a sweep, ascending, without repeats."""
    return sorted({*gradient_bytes, *SWEEP, *(GPU_SWEEP if gpu else ())})
