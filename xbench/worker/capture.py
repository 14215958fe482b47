"""Verification inside a worker: the loss, gradients, training curve and replica weights a
backend produces from the common start, each device's loss on its own slice of the batch, and
for a full-size probe (no training steps) the gradients as per-tensor summaries
(`xbench.results.checks` and `xbench.results.full_size` compare them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from xbench.contract import Backend, ReportsShardLosses, Trial, Unsupported, Verifiable, missing_methods
from xbench.stats import relative_errors
from xbench.wire import SUMMARY_COLUMNS, Reference

# What a full-size probe keeps of each gradient tensor g (flattened, n values): its norm, its
# sum, its projections on two fixed random sign vectors and its absolute sum. A projection
# moves by about ||g - g'|| when g does, so the columns' differences, divided by the norm
# (the sum's and the absolute sum's by the absolute sum, `xbench.results.full_size`), measure
# the tensor's normwise error (a skipped layer: 1; a wrong width: no match at all) without
# writing or comparing 124 M-parameter arrays. The columns: `xbench.wire.SUMMARY_COLUMNS`.
MAX_SHARDS = 8  # a 1-device run reports its slice losses for every slice count up to this
SUMMARY_CHUNK = 1 << 22  # values of a gradient summarised at once (32 MiB in float64; a multiple of 8)
# Where a verification run's seconds go, in order (each includes the compilation its first
# call pays): the common start built, the program prepared, the gradients at the start, each
# device's slice losses, the training steps, the replicas' weights read back, the gradients
# summarised (a full-size probe), the arrays saved.
PHASES = ("work", "prepare", "gradients", "shares", "train", "weights", "summaries", "save")


@contextmanager
def timed(phases: dict[str, float] | None, name: str) -> Iterator[None]:
    """Adds the seconds of the block to `phases[name]` (nothing when `phases` is None)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        if phases is not None:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - start


def reference_run(backend: Backend, prepared: Any, steps: int, trial: Trial | None = None,
                  shard_counts: tuple[int, ...] | None = None, phases: dict[str, float] | None = None) -> Reference:
    """Gradients at the start, each device's slice losses (given the `trial`; on 1 device for
    `shard_counts`, see `shard_losses`), then `steps` training steps; with none (a full-size
    probe), only the start, its gradients summarised. Raises `Unsupported`, naming what is
    missing, for a backend that is not `Verifiable`. The seconds of each phase are added to
    `phases` (`PHASES`' names) when given."""
    if not isinstance(backend, Verifiable):
        missing = ", ".join(missing_methods(backend, Verifiable))
        raise Unsupported(f"backend {backend.name!r} lacks {missing}; it cannot be verified")
    with timed(phases, "gradients"):
        loss, gradients = backend.gradients(prepared)
    # A program's own run (replicate 0) and its probe report their devices' shares; its float64
    # referee and the precision references (replicates 1 and up) serve the trajectory checks only.
    proves_shares = trial is not None and (trial.replicate == 0 or steps == 0)
    with timed(phases, "shares"):
        shards = shard_losses(backend, prepared, trial, shard_counts) if trial is not None and proves_shares else {}
    if steps == 0:
        with timed(phases, "summaries"):
            summaries = summarize(gradients)
        return Reference(float(loss), [], [], [], summaries=summaries, shard_losses=shards)
    with timed(phases, "train"):
        losses = backend.train(prepared, steps)
    with timed(phases, "weights"):
        replicas = [[np.asarray(w) for w in r] for r in backend.replica_weights(prepared)]
    return Reference(float(loss), [np.asarray(g) for g in gradients], [float(x) for x in losses], replicas[:1],
                     tuple(relative_errors(r, replicas[0]) for r in replicas[1:]), shard_losses=shards)


def shard_losses(backend: Backend, prepared: Any, trial: Trial, wanted: tuple[int, ...] | None = None
                 ) -> dict[int, tuple[float, ...]]:
    """On N > 1 devices, each device's loss on its own slice; on one device, the slice losses
    for each of the `wanted` counts (the N-device runs it is compared with: none when no such
    run is planned; when not named, every count up to MAX_SHARDS) that divides the batch (each
    count compiles another forward pass, so only those); nothing from a backend without
    `ReportsShardLosses`. (A slice of one sample cannot train a BatchNorm model in torch, so a
    1-device verification must not ask for slices nothing compares.)"""
    if not isinstance(backend, ReportsShardLosses):
        return {}
    batch = trial.global_batch
    candidates = range(2, MAX_SHARDS + 1) if wanted is None else wanted
    counts = [trial.devices] if trial.devices > 1 else [n for n in candidates if n > 1 and batch % n == 0]
    return {n: tuple(float(x) for x in backend.shard_losses(prepared, n)) for n in counts}


def summarize(gradients: list[Any]) -> np.ndarray:
    """One row of `SUMMARY_COLUMNS` per gradient tensor, in float64."""
    rows = [_summary(np.asarray(gradient).ravel(), index) for index, gradient in enumerate(gradients)]
    return np.asarray(rows, np.float64).reshape(-1, len(SUMMARY_COLUMNS))


def _summary(g: np.ndarray, index: int) -> list[float]:
    """Norm, sum, projections and absolute sum of one flattened tensor, a chunk at a time: a
    1.5 B-parameter model's gradient is never held in float64 whole, nor are its signs (one
    random bit each)."""
    squares = total = absolute = 0.0
    projections = [0.0, 0.0]
    streams = [_sign_stream(index, k) for k in (1, 2)]
    for start in range(0, g.size, SUMMARY_CHUNK):
        part = g[start:start + SUMMARY_CHUNK].astype(np.float64)
        squares += float(part @ part)
        total += float(part.sum())
        absolute += float(np.abs(part).sum())
        for j, stream in enumerate(streams):
            projections[j] += float(part @ _signs(stream, part.size))
    return [squares ** 0.5, total, *projections, absolute]


def _sign_stream(index: int, k: int) -> np.random.Generator:
    """The generator of tensor `index`'s k-th projection: every backend's worker draws the same
    signs."""
    return np.random.default_rng((index, k))


def _signs(stream: np.random.Generator, size: int) -> np.ndarray:
    """The next `size` signs (+1.0 or -1.0) of a projection's stream, one random bit each."""
    bits = np.unpackbits(np.frombuffer(stream.bytes(-(-size // 8)), np.uint8))[:size]
    return bits * 2.0 - 1.0
