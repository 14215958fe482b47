"""Verification inside a worker: the loss, gradients, training curve and replica weights a
backend produces from the common start (`xbench.results.checks` compares them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from xbench.contract import Backend, Unsupported, Verifiable, missing_methods
from xbench.stats import relative_errors
from xbench.wire import Reference


def reference_run(backend: Backend, prepared: Any, steps: int) -> Reference:
    """Gradients at the start, then `steps` training steps; run inside a worker. Raises
    `Unsupported`, naming what is missing, for a backend that is not `Verifiable`."""
    if not isinstance(backend, Verifiable):
        missing = ", ".join(missing_methods(backend, Verifiable))
        raise Unsupported(f"backend {backend.name!r} lacks {missing}; it cannot be verified")
    loss, gradients = backend.gradients(prepared)
    losses = backend.train(prepared, steps)
    replicas = [[np.asarray(w) for w in r] for r in backend.replica_weights(prepared)]
    return Reference(float(loss), [np.asarray(g) for g in gradients], [float(x) for x in losses], replicas[:1],
                     tuple(relative_errors(r, replicas[0]) for r in replicas[1:]))
