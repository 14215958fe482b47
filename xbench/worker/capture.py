"""Verification inside a worker: the loss, gradients, training curve and replica weights a
backend produces from the common start, each device's loss on its own slice of the batch, and
for a full-size probe (no training steps) the gradients as per-tensor summaries
(`xbench.results.checks` and `xbench.results.full_size` compare them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from xbench.contract import Backend, ReportsShardLosses, Trial, Unsupported, Verifiable, missing_methods
from xbench.stats import relative_errors
from xbench.wire import Reference

# What a full-size probe keeps of each gradient tensor g (flattened, n values): its norm, its
# sum and its projections on two fixed random sign vectors. A projection moves by about
# ||g - g'|| when g does, so the columns' differences, divided by the norm, measure the
# tensor's normwise error (a skipped layer: 1; a wrong width: no match at all) without
# writing or comparing 124 M-parameter arrays.
SUMMARY_COLUMNS = ("norm", "sum", "projection 1", "projection 2")
MAX_SHARDS = 8  # a 1-device run reports its slice losses for every slice count up to this


def reference_run(backend: Backend, prepared: Any, steps: int, trial: Trial | None = None,
                  shard_counts: tuple[int, ...] | None = None) -> Reference:
    """Gradients at the start, each device's slice losses (given the `trial`; on 1 device for
    `shard_counts`, see `shard_losses`), then `steps` training steps; with none (a full-size
    probe), only the start, its gradients summarised. Raises `Unsupported`, naming what is
    missing, for a backend that is not `Verifiable`."""
    if not isinstance(backend, Verifiable):
        missing = ", ".join(missing_methods(backend, Verifiable))
        raise Unsupported(f"backend {backend.name!r} lacks {missing}; it cannot be verified")
    loss, gradients = backend.gradients(prepared)
    # A program's own run (replicate 0) and its probe report their devices' shares; its float64
    # referee and the precision references (replicates 1 and up) serve the trajectory checks only.
    proves_shares = trial is not None and (trial.replicate == 0 or steps == 0)
    shards = shard_losses(backend, prepared, trial, shard_counts) if trial is not None and proves_shares else {}
    if steps == 0:
        return Reference(float(loss), [], [], [], summaries=summarize(gradients), shard_losses=shards)
    losses = backend.train(prepared, steps)
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
    rows = []
    for index, gradient in enumerate(gradients):
        g = np.asarray(gradient, np.float64).ravel()
        rows.append([np.linalg.norm(g), g.sum(), *(g @ _signs(g.size, index, k) for k in (1, 2))])
    return np.asarray(rows, np.float64).reshape(-1, len(SUMMARY_COLUMNS))


def _signs(size: int, index: int, k: int) -> np.ndarray:
    """The fixed random signs of tensor `index`'s k-th projection: every backend's worker
    draws the same ones."""
    return np.where(np.random.default_rng((index, k)).random(size) < 0.5, -1.0, 1.0)
