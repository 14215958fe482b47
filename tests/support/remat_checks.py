"""What each framework's remat tests assert alike: recomputing the blocks' activations changes
no number, and the remat programs pass verification against the program without it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from xbench.contract import DATA_PARALLEL, Trial
from xbench.contract.timing import TimingProtocol
from xbench.models.model_spec import ModelSpec
from xbench.results.checks import VERIFY_STEPS, run_checks

CHECKS = {"gradients: N devices = 1 device", "initial loss and gradients across backends",
          "10 steps: losses and final weights", "replicas hold the same weights"}


def assert_same_loss_and_gradients(plain: Any, remat: Any) -> None:
    """Two reference runs of one step: remat's loss and gradients are the program's without it."""
    assert remat.loss == pytest.approx(plain.loss, rel=1e-6)
    for a, b in zip(remat.gradients, plain.gradients):
        assert np.allclose(a, b, rtol=1e-5, atol=1e-7)


def assert_remat_verifies(backend: str, model: str, devices: int, runs: Mapping[str, Any]) -> None:
    """`runs`: the reference runs "as written" (1 device), "remat" (1 device), "remat on N"
    (`devices`) and "plain remat" (1 device); every check of verification passes on them."""
    refs = {(backend, 1, model): runs["as written"],
            (f"{backend}+remat", 1, model): runs["remat"],
            (f"{backend}+remat", devices, model): runs["remat on N"],
            (f"{backend} plain+remat", 1, model): runs["plain remat"]}
    checks = run_checks(refs, backend)
    assert {c.check for c in checks} >= CHECKS
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]


def child_runs(one: Mapping[Any, Any], two: Mapping[Any, Any]) -> dict[str, Any]:
    """The reference runs `assert_remat_verifies` takes, from the results of test children (a
    1-device child's and one rank's of 2 devices, each keyed by (variant, program))."""
    return {"as written": one["as-written", "data-parallel"]["reference"],
            "remat": one["remat", "data-parallel"]["reference"],
            "remat on N": two["remat", "data-parallel"]["reference"],
            "plain remat": one["remat", "plain"]["reference"]}


def verification_trial(backend: str, model: ModelSpec, devices: int, batch: int, variant: str,
                       program: str = DATA_PARALLEL) -> Trial:
    """A trial as verify plans it (fp32, dropout's model, ten steps of one call each) for the
    remat and fsdp backend tests that prepare programs in their own processes."""
    protocol = TimingProtocol(warmup_steps=0, steps=VERIFY_STEPS, repeats=1, steps_per_call=1, trial_timeout_s=600)
    return Trial(backend=backend, model=replace(model, batch_sizes=(batch,)), devices=devices, global_batch=batch,
                 scaling="strong", precision="fp32", platform="cpu", learning_rate=1e-3, seed=0,
                 samples=batch * VERIFY_STEPS, protocol=protocol, variant=variant, program=program)
