"""Whether a configuration fits in device memory: the estimate (`xbench.models.memory`) against
the device's memory before a trial is launched, a framework's out-of-memory error after, and
the words both leave in a record's reason ("does not fit: ..."), which rows, tables and the
bottom line read back.

The estimate leaves out what a framework holds besides the training step (its CUDA context,
kernels' workspace, NCCL's buffers, the allocator's fragmentation), so a configuration counts
as not fitting only where the estimate passes the device's memory less `MARGIN` of it kept for
those: a margin, not a second estimate, so that a configuration near the edge is launched and
judged by the framework itself (an out-of-memory error then makes the same kind of row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xbench.errors import one_line
from xbench.models.memory import GiB, MemoryEstimate, estimate
from xbench.models.model_spec import ModelSpec
from xbench.results.records import MemoryFacts, Record
from xbench.results.rows import Row

DOES_NOT_FIT = "does not fit"
MARGIN = 0.05  # of the device's memory, kept for what the estimate leaves out (see above)
# A framework's own words for running out of device memory: torch's OutOfMemoryError ("CUDA out
# of memory"), XLA's RESOURCE_EXHAUSTED ("Out of memory while trying to allocate"), TF's
# ResourceExhaustedError ("OOM when allocating" comes with "resource exhausted").
OUT_OF_MEMORY_SIGNS = ("out of memory", "outofmemory", "resource_exhausted", "resource exhausted")
REASON_CHARS = 280  # of a framework's error kept in a measured does-not-fit reason: the whole under 400


@dataclass(frozen=True)
class MemoryCheck:
    """A trial's estimated memory per device against the device's (None: not checked)."""

    estimate: MemoryEstimate
    capacity_bytes: int | None

    @property
    def usable_bytes(self) -> int | None:
        return None if self.capacity_bytes is None else int(self.capacity_bytes * (1 - MARGIN))

    @property
    def fits(self) -> bool:
        usable = self.usable_bytes
        return usable is None or self.estimate.fits(usable)

    @property
    def reason(self) -> str:
        """Why a trial that does not fit was not launched."""
        held = "parameters, gradients, Adam state" + (" and activations" if self.estimate.activations is not None
                                                       else " (activations not modelled)")
        return (f"{DOES_NOT_FIT}: needs ~{gib_text(self.estimate.total)} GiB per device, has "
                f"{gib_text(self.capacity_bytes or 0)} GiB (estimated before launching: {held}; {MARGIN:.0%} of "
                "the device kept for the framework's context, workspace and buffers)")

    def facts(self) -> MemoryFacts:
        """What a record keeps of the check."""
        return {"estimate_bytes": self.estimate.total, "capacity_bytes": self.capacity_bytes,
                "sharded": self.estimate.sharded}


def check(model: ModelSpec, global_batch: int, devices: int, precision: str, sharded: bool,
          capacity_bytes: int | None, recompute: bool = False, fused_attention: bool = False,
          reduction_buffers: int = 0, float32_softmax: bool = False) -> MemoryCheck | None:
    """The check of one trial, or None where its memory cannot be estimated (a precision the
    estimate does not know). `sharded`, `recompute`, `fused_attention`, `reduction_buffers`,
    `float32_softmax`: the trial's variant's and program's."""
    try:
        found = estimate(model.family, model.shape, model.params, global_batch // devices, devices, sharded, precision,
                         recompute=recompute, fused_attention=fused_attention, reduction_buffers=reduction_buffers,
                         float32_softmax=float32_softmax)
    except (ValueError, KeyError, TypeError):
        return None
    return MemoryCheck(found, capacity_bytes)


def gib_text(nbytes: int) -> str:
    """e.g. "12.3", "0.41", "79.1"."""
    gib = nbytes / GiB
    return f"{gib:.3g}" if gib < 10 else f"{gib:.1f}"


def out_of_memory(text: str | None) -> bool:
    """Whether a trial's error is the framework running out of device memory."""
    lowered = (text or "").lower()
    return any(sign in lowered for sign in OUT_OF_MEMORY_SIGNS)


def measured_reason(global_batch: int, devices: int, error: str) -> str:
    """The reason of a trial that ran out of memory: the same kind of row as one the estimate
    kept from launching, with the framework's words."""
    return (f"{DOES_NOT_FIT}: out of memory at batch {global_batch // devices} per device on {devices} "
            f"device(s) (measured): {one_line(error, REASON_CHARS)}")


def fit_or_not(record: Record) -> Record:
    """A timed trial that failed because the framework ran out of device memory: its
    configuration does not fit this device, a skipped row that says so, not a failure of the
    run. Any other record as it is."""
    if record["status"] not in ("failed", "crashed") or not out_of_memory(record["reason"]):
        return record
    trial = record["trial"]
    return {**record, "status": "skipped",
            "reason": measured_reason(trial["global_batch"], trial["devices"], str(record["reason"]))}


def does_not_fit(row: Row) -> bool:
    """A row whose configuration did not fit in device memory, estimated or measured."""
    return row.throughput is None and (row.reason or "").startswith(DOES_NOT_FIT)


def fit_words(reason: str | None) -> str:
    """A does-not-fit reason's gist: "needs ~12.3 GiB per device, has 8 GiB", "out of memory at
    batch 64 per device on 2 device(s)"."""
    gist = (reason or "").removeprefix(f"{DOES_NOT_FIT}: ")
    return gist.split(" (", 1)[0]


def estimate_gib(records: Sequence[Record]) -> float | None:
    """The estimate the records of one configuration were checked with, in GiB."""
    found = next((r["memory"] for r in records if r.get("memory")), None)
    return None if found is None else found["estimate_bytes"] / GiB
