"""`jax:fsdp-remat`, the sharded program with each transformer block under nnx.remat,
in-process on 2 simulated CPU devices: verified by the real check code against the replicated
program without remat (transformer-tiny: N devices = 1 device, across programs, ten steps,
replicas, each device's share), its parameters and Adam's moments really divided and its
blocks really checkpointed, its notes saying both, and the refusals of either part (the MLP,
the plain program)."""

from __future__ import annotations

import numpy as np
import pytest

from xbench.contract import AS_WRITTEN, DATA_PARALLEL, PLAIN, Trial, Unsupported
from xbench.contract.work import build_work
from xbench.models.model_spec import ModelSpec, preset_model
from xbench.results.checks import VERIFY_STEPS, run_checks, verification_batch, verification_model
from xbench.worker.capture import reference_run

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

from tests.backends.jax.cpu_devices import DEVICES, simulated_devices  # noqa: E402
from tests.support.remat_checks import CHECKS, verification_trial  # noqa: E402
from xbench_backends.jax.pmap import JaxPmapBackend  # noqa: E402
from xbench_backends.sharding import FSDP_REMAT  # noqa: E402

BATCH = verification_batch([1, DEVICES])
MODEL = verification_model(preset_model("transformer-tiny"), [1, DEVICES])


@pytest.fixture(scope="module")
def devices():
    return simulated_devices(DEVICES)


def _backend(devices, count: int) -> JaxPmapBackend:
    backend = JaxPmapBackend()
    backend.devices = list(devices[:count])
    return backend


def _trial(model: ModelSpec, devices: int, variant: str = FSDP_REMAT, program: str = DATA_PARALLEL) -> Trial:
    return verification_trial("jax", model, devices, BATCH, variant, program)


def _prepared(devices, count: int, variant: str = FSDP_REMAT):
    backend = _backend(devices, count)
    trial = _trial(MODEL, count, variant)
    return backend, trial, backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))


@pytest.fixture(scope="module")
def references(devices):
    """verify's results of the replicated program on 1 device and of jax:fsdp-remat on 1 and 2."""
    found = {}
    for count, variant in ((1, AS_WRITTEN), (1, FSDP_REMAT), (DEVICES, FSDP_REMAT)):
        backend, trial, prepared = _prepared(devices, count, variant)
        found[count, variant] = reference_run(backend, prepared, VERIFY_STEPS, trial, shard_counts=(DEVICES,))
    return found


def test_fsdp_remat_verifies_against_the_replicated_program_without_remat(references):
    refs = {("jax", 1, MODEL.name): references[1, AS_WRITTEN],
            (f"jax+{FSDP_REMAT}", 1, MODEL.name): references[1, FSDP_REMAT],
            (f"jax+{FSDP_REMAT}", DEVICES, MODEL.name): references[DEVICES, FSDP_REMAT]}
    checks = run_checks(refs, "jax")
    assert {c.check for c in checks} >= CHECKS
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    # Each device's share of the batch: the 1-device run's losses of the same two slices.
    two, one = references[DEVICES, FSDP_REMAT], references[1, FSDP_REMAT]
    assert np.allclose(two.shard_losses[DEVICES], one.shard_losses[DEVICES], rtol=1e-5)


def test_the_state_is_divided_and_each_block_checkpointed_and_the_notes_say_both(devices):
    import jax

    _, _, prepared = _prepared(devices, DEVICES)
    params = prepared.state[0]
    held = sum(s.data.size for leaf in jax.tree.leaves(params) for s in leaf.addressable_shards
               if s.device == devices[0])
    assert held == prepared.info.params // DEVICES  # transformer-tiny: every tensor has an even dimension
    jaxpr = str(jax.make_jaxpr(prepared.grads)(prepared.state, prepared.xs, prepared.ys))
    assert jaxpr.count("checkpoint[") + jaxpr.count("remat") >= MODEL.shape["layers"], jaxpr[:2000]
    notes = prepared.info.notes
    assert any(note.startswith(f"fsdp: jax.jit with NamedShardings over {DEVICES} device(s)") for note in notes)
    assert any(note.startswith("remat: each of the 2 blocks called through nnx.remat") for note in notes)


def test_fsdp_remat_is_declared_sharded_and_recomputed_for_the_transformer():
    declared = {v.name: v for v in JaxPmapBackend.variants}[FSDP_REMAT]
    assert declared.sharded and declared.recompute and declared.same_formula
    assert declared.families == ("transformer",)
    assert "NamedSharding" in declared.description and "nnx.remat" in declared.description
    from xbench_backends.jax.shardmap import JaxAutoBackend, JaxShardMapBackend

    assert not {FSDP_REMAT} & {v.name for cls in (JaxAutoBackend, JaxShardMapBackend) for v in cls.variants}


def test_the_mlp_and_the_plain_program_are_refused_in_one_line(devices):
    mlp = _trial(preset_model("medium"), DEVICES)
    with pytest.raises(Unsupported, match=f"{FSDP_REMAT} checkpoints each transformer block; the mlp family "
                                          "has no blocks") as refused:
        _backend(devices, DEVICES).prepare(mlp, build_work(mlp.model, mlp.samples, mlp.seed))
    plain = _trial(MODEL, 1, program=PLAIN)
    with pytest.raises(Unsupported, match=f"{FSDP_REMAT} shards the data-parallel program over its devices; "
                                          "the plain program has no devices") as plainly:
        _backend(devices, 1).prepare(plain, build_work(plain.model, plain.samples, plain.seed))
    assert "\n" not in str(refused.value) + str(plainly.value)
