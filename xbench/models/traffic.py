"""What one training step moves between devices, in bytes, in pure arithmetic: the collective
sizes as nccl-tests counts them (`xbench allreduce`), from the parameter count, the precision
and whether the program is replicated or sharded.

A replicated data-parallel program all-reduces its float32 gradients once a step. A sharded
one (FSDP, ZeRO-3) moves no all-reduce: it all-gathers the parameters, in the compute dtype,
for the forward pass and again for the backward pass where it resharded them after the
forward (FSDP2's default), and reduce-scatters the float32 gradients (its reductions stay in
float32 under bf16). A program that keeps the forward's gathered parameters for the backward
gathers once; one that gathers its float32 masters moves 4 bytes a parameter, not 2: these
are the planned collectives, not a trace of what a compiler chose.
"""

from __future__ import annotations

from dataclasses import dataclass

from xbench.models.memory import COMPUTE_BYTES, STATE_BYTES

RESHARDED_GATHERS = 2  # forward, and backward after resharding


@dataclass(frozen=True)
class StepTraffic:
    """Bytes of one step's collectives, each the sum of nccl-tests' sizes: an all-reduce's
    buffer, an all-gather's output, a reduce-scatter's input."""

    all_reduce: int = 0
    all_gather: int = 0
    reduce_scatter: int = 0
    gathers: int = 0  # all-gathers of the whole parameters a step (all_gather holds them all)


def step_traffic(params: int, precision: str, sharded: bool, devices: int,
                 gathers: int = RESHARDED_GATHERS) -> StepTraffic:
    """The collectives of one step of a model of `params` parameters on `devices` devices:
    nothing on one device; the gradient all-reduce replicated; `gathers` all-gathers of the
    parameters in the compute dtype and a reduce-scatter of the gradients `sharded`."""
    if precision not in COMPUTE_BYTES:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(COMPUTE_BYTES)}")
    if devices < 2:
        return StepTraffic()
    gradient = params * (2 * STATE_BYTES if precision == "fp64" else STATE_BYTES)
    if not sharded:
        return StepTraffic(all_reduce=gradient)
    return StepTraffic(all_gather=gathers * params * COMPUTE_BYTES[precision], reduce_scatter=gradient,
                       gathers=gathers)
