"""`ReportsShardLosses` in the numpy test backends: the correct data-parallel MLP reports each
device's share as the 1-device program's slices do, and the planted wrong program (the whole
global batch computed on its first device, copied to the others) passes what the other checks
compare, gradients, losses and replicas bit for bit, yet its shares give it away."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.fakes import FirstDeviceMlpBackend, NumpyMlpBackend
from xbench.contract import ReportsShardLosses, Trial, Verifiable
from xbench.contract.timing import TimingProtocol
from xbench.contract.work import build_work
from xbench.models.model_spec import ModelSpec
from xbench.worker.capture import PHASES, reference_run

BATCH = 8
MODEL = ModelSpec("mlp-shards", widths=(16, 8), batch_sizes=(BATCH,), inputs=5, outputs=3, dropout=0.0)


def prepared(backend, devices: int, precision: str = "fp32"):
    trial = Trial(backend.name, MODEL, devices, BATCH, "strong", precision, "cpu", 1e-3, 0, BATCH * 3,
                  TimingProtocol(replicates=2))
    return backend.prepare(trial, build_work(MODEL, trial.samples, trial.seed))


def relative(a, b) -> float:
    return float(np.max(np.abs(np.subtract(a, b)) / np.abs(b)))


@pytest.mark.parametrize("cls", [NumpyMlpBackend, FirstDeviceMlpBackend])
def test_the_fakes_report_shard_losses(cls):
    assert isinstance(cls(), ReportsShardLosses) and isinstance(cls(), Verifiable)


@pytest.mark.parametrize("precision", ["fp32", "fp64", "bf16"])
def test_each_device_computes_its_own_slice(precision):
    backend = NumpyMlpBackend()
    one, two = prepared(backend, 1, precision), prepared(backend, 2, precision)
    for step in range(2):  # the current step's batch, before and after a step
        slices, shares = backend.shard_losses(one, 2), backend.shard_losses(two, 2)
        assert len(shares) == 2 and relative(shares, slices) <= 1e-6, (step, shares, slices)
        assert relative(shares[0], shares[1]) > 1e-3  # two different slices
        loss, _ = backend.gradients(two)
        assert np.mean(shares) == pytest.approx(loss, rel=1e-6)  # equal shards: their mean is the global loss
        assert backend.shard_losses(one, 4) and len(backend.shard_losses(one, 8)) == 8
        backend.train(one, 1)
        backend.train(two, 1)


def test_shard_losses_change_nothing():
    backend = NumpyMlpBackend()
    state = prepared(backend, 2)
    before = backend.replica_weights(state), backend.gradients(state)
    backend.shard_losses(state, 2)
    after = backend.replica_weights(state), backend.gradients(state)
    assert all(np.array_equal(a, b) for r0, r1 in zip(before[0], after[0]) for a, b in zip(r0, r1))
    assert before[1][0] == after[1][0] and all(np.array_equal(a, b) for a, b in zip(before[1][1], after[1][1]))


@pytest.mark.parametrize("cls", [NumpyMlpBackend, FirstDeviceMlpBackend])
def test_shards_that_do_not_fit_are_refused(cls):
    backend = cls()
    with pytest.raises(ValueError, match="do not divide the global batch of 8"):
        backend.shard_losses(prepared(backend, 1), 3)
    with pytest.raises(ValueError, match="reports 2 shards"):
        backend.shard_losses(prepared(backend, 2), 4)
    with pytest.raises(ValueError, match="reports 2 shards"):
        backend.shard_losses(prepared(backend, 2), 1)


def test_the_planted_program_agrees_with_one_device_everywhere_but_its_shares():
    wrong, right = FirstDeviceMlpBackend(), NumpyMlpBackend()
    one, two = prepared(right, 1), prepared(wrong, 2)
    # What the other checks compare: the same bits as the correct 1-device program.
    (loss_one, grads_one), (loss_two, grads_two) = right.gradients(one), wrong.gradients(two)
    assert loss_one == loss_two and all(np.array_equal(a, b) for a, b in zip(grads_one, grads_two))
    slices, shares = right.shard_losses(one, 2), wrong.shard_losses(two, 2)
    assert shares == [loss_two, loss_two]  # every device computed the whole batch
    assert relative(shares, slices) > 1e-3  # which is not its share
    assert wrong.shard_losses(prepared(wrong, 1), 2) == slices  # on one device it is the correct program
    assert right.train(one, 3) == wrong.train(two, 3)
    replicas = wrong.replica_weights(two)
    assert len(replicas) == 2
    for replica in replicas:
        assert all(np.array_equal(a, b) for a, b in zip(replica, right.replica_weights(one)[0]))


def test_the_planted_program_passes_every_other_check_and_fails_verification_with_a_one_line_reason():
    """Through the worker's capture and the real checks: the copying program's gradients,
    ten steps and replicas agree with the correct program's, and only its shares fail."""
    from xbench.results.checks import run_checks
    from xbench.results.full_size import shard_checks
    from xbench.run.verification import Verification
    from xbench.worker.capture import reference_run

    refs = {}
    for cls in (NumpyMlpBackend, FirstDeviceMlpBackend):
        for devices in (1, 2):
            backend = cls()
            state = prepared(backend, devices)
            refs[(cls.name, devices, MODEL.name)] = reference_run(backend, state, 2, state.trial)
    others = run_checks(refs, reference_backend=NumpyMlpBackend.name)
    assert others and all(c.passed for c in others), [c for c in others if not c.passed]
    shares = shard_checks(refs, dict.fromkeys(refs, "fp32"), "")
    verification = Verification(tuple(others + shares), {}, frozenset(), {})
    assert verification.outcome(NumpyMlpBackend.name)["status"] == "passed"
    outcome = verification.outcome(FirstDeviceMlpBackend.name)
    assert outcome["status"] == "failed" and len(outcome["failed"]) == 1
    assert outcome["failed"][0].startswith("each device's share") and "\n" not in outcome["failed"][0]


def test_a_one_device_run_reports_the_slices_of_the_device_counts_planned_only():
    """Each slice count compiles another forward pass on a GPU: only the planned ones."""
    from xbench.worker.capture import shard_losses

    backend = NumpyMlpBackend()
    state = prepared(backend, 1)
    assert set(shard_losses(backend, state, state.trial, (2,))) == {2}
    assert set(shard_losses(backend, state, state.trial, (2, 3))) == {2}  # 3 does not divide 8
    assert set(shard_losses(backend, state, state.trial)) == {2, 4, 8}  # none named: every count up to 8
    assert shard_losses(backend, state, state.trial, ()) == {}  # no N-device run planned: nothing to compare
    two = prepared(backend, 2)
    assert set(shard_losses(backend, two, two.trial, (4,))) == {2}  # N devices: their own N


@pytest.mark.parametrize("steps, phases", [(2, ["gradients", "shares", "train", "weights"]),
                                           (0, ["gradients", "shares", "summaries"])], ids=["trained", "probe"])
def test_a_reference_run_says_where_its_seconds_went(steps, phases):
    state = prepared(NumpyMlpBackend(), 2)
    timed: dict[str, float] = {}
    reference_run(NumpyMlpBackend(), state, steps, state.trial, phases=timed)
    assert list(timed) == phases and set(timed) <= set(PHASES) and all(s >= 0 for s in timed.values())
