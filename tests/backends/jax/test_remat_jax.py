"""`jax:remat`, activation checkpointing per transformer block (`nnx.remat`), in-process on 2
simulated CPU devices: the same loss, gradients and ten steps as the program without it, by the
real check code (transformer-tiny: N devices = 1 device, across programs, replicas), the plain
program too; the blocks really checkpointed in the differentiated program; the MLP refused."""

from __future__ import annotations

import pytest

from xbench.contract import AS_WRITTEN, DATA_PARALLEL, PLAIN, Trial, Unsupported
from xbench.contract.work import build_work
from xbench.models.model_spec import ModelSpec, preset_model
from xbench.results.checks import VERIFY_STEPS, verification_batch, verification_model
from xbench.worker.capture import reference_run

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

from tests.backends.jax.cpu_devices import DEVICES, simulated_devices  # noqa: E402
from tests.support.remat_checks import assert_remat_verifies, assert_same_loss_and_gradients, verification_trial  # noqa: E402
from xbench_backends.jax.pmap import JaxPmapBackend  # noqa: E402
from xbench_backends.recompute import REMAT  # noqa: E402

BATCH = verification_batch([1, DEVICES])
MODEL = verification_model(preset_model("transformer-tiny"), [1, DEVICES])


@pytest.fixture(scope="module")
def devices():
    return simulated_devices(DEVICES)


def _backend(devices, count: int) -> JaxPmapBackend:
    backend = JaxPmapBackend()
    backend.devices = list(devices[:count])
    return backend


def _trial(model: ModelSpec, devices: int, variant: str = REMAT, program: str = DATA_PARALLEL) -> Trial:
    return verification_trial("jax", model, devices, BATCH, variant, program)


def _prepared(devices, count: int, variant: str = REMAT, program: str = DATA_PARALLEL):
    backend = _backend(devices, count)
    trial = _trial(MODEL, count, variant, program)
    return backend, trial, backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))


@pytest.fixture(scope="module")
def references(devices):
    """verify's results of the program without remat on 1 device and with it on 1 and 2, and
    of the plain program with it."""
    found = {}
    for count, variant, program in ((1, AS_WRITTEN, DATA_PARALLEL), (1, REMAT, DATA_PARALLEL),
                                    (DEVICES, REMAT, DATA_PARALLEL), (1, REMAT, PLAIN)):
        backend, trial, prepared = _prepared(devices, count, variant, program)
        found[count, variant, program] = reference_run(backend, prepared, VERIFY_STEPS, trial)
    return found


def test_remat_computes_the_loss_and_gradients_of_the_program_without_it(references):
    assert_same_loss_and_gradients(references[1, AS_WRITTEN, DATA_PARALLEL], references[1, REMAT, DATA_PARALLEL])


def test_remat_verifies_against_the_program_without_it(references):
    assert_remat_verifies("jax", MODEL.name, DEVICES, {
        "as written": references[1, AS_WRITTEN, DATA_PARALLEL], "remat": references[1, REMAT, DATA_PARALLEL],
        "remat on N": references[DEVICES, REMAT, DATA_PARALLEL], "plain remat": references[1, REMAT, PLAIN]})


def test_each_block_is_checkpointed_in_the_differentiated_program(devices):
    import jax

    _, _, prepared = _prepared(devices, 1)
    jaxpr = str(jax.make_jaxpr(prepared.grads)(prepared.state, prepared.xs, prepared.ys))
    assert jaxpr.count("checkpoint[") + jaxpr.count("remat") >= MODEL.shape["layers"], jaxpr[:2000]
    assert any(note.startswith("remat: each of the 2 blocks called through nnx.remat") for note in prepared.info.notes)
    _, _, without = _prepared(devices, 1, AS_WRITTEN)
    assert "checkpoint[" not in str(jax.make_jaxpr(without.grads)(without.state, without.xs, without.ys))


def test_remat_is_declared_for_the_transformer_and_refused_for_the_mlp(devices):
    declared = {v.name: v for v in JaxPmapBackend.variants}[REMAT]
    assert declared.recompute and declared.families == ("transformer",) and "nnx.remat" in declared.description
    trial = _trial(preset_model("medium"), 1)
    with pytest.raises(Unsupported, match="the mlp family has no blocks"):
        _backend(devices, 1).prepare(trial, build_work(trial.model, trial.samples, trial.seed))
