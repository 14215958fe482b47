"""`jax:fsdp`, the sharded data-parallel program, in-process on 2 simulated CPU devices:
parameters and Adam's moments really divided over the devices, verified by the real check code
against the replicated program (transformer-tiny and the medium MLP: N devices = 1 device,
across programs, ten steps, replicas, each device's share), a gradient summed over the shards
instead of averaged caught, and the refusals (the plain program, a model nothing divides)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from xbench.contract import AS_WRITTEN, DATA_PARALLEL, PLAIN, Trial, Unsupported
from xbench.contract.timing import TimingProtocol
from xbench.contract.work import build_work
from xbench.models.model_spec import ModelSpec, preset_model
from xbench.results.checks import VERIFY_STEPS, run_checks, verification_batch, verification_model
from xbench.worker.capture import reference_run

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

from tests.backends.jax.cpu_devices import DEVICES, simulated_devices  # noqa: E402
from xbench_backends import sharding  # noqa: E402
from xbench_backends.jax import sharded  # noqa: E402
from xbench_backends.jax.pmap import JaxPmapBackend  # noqa: E402

FSDP = sharding.FSDP
BATCH = verification_batch([1, DEVICES])
N_EQUALS_1 = "gradients: N devices = 1 device"


@pytest.fixture(scope="module")
def devices():
    return simulated_devices(DEVICES)


def _backend(devices, count: int) -> JaxPmapBackend:
    backend = JaxPmapBackend()
    backend.devices = list(devices[:count])
    return backend


def _trial(model: ModelSpec, devices: int, variant: str = FSDP, program: str = DATA_PARALLEL) -> Trial:
    protocol = TimingProtocol(warmup_steps=0, steps=VERIFY_STEPS, repeats=1, steps_per_call=1, trial_timeout_s=600)
    return Trial(backend="jax", model=replace(model, batch_sizes=(BATCH,)), devices=devices, global_batch=BATCH,
                 scaling="strong", precision="fp32", platform="cpu", learning_rate=1e-3, seed=0,
                 samples=BATCH * VERIFY_STEPS, protocol=protocol, options={}, launcher="subprocess",
                 variant=variant, program=program)


def _reference(devices, model: ModelSpec, count: int, variant: str = FSDP):
    backend = _backend(devices, count)
    trial = _trial(model, count, variant)
    prepared = backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
    return reference_run(backend, prepared, VERIFY_STEPS, trial, shard_counts=(DEVICES,))


MODELS = {"transformer-tiny": verification_model(preset_model("transformer-tiny"), [1, DEVICES]),
          "medium": preset_model("medium")}


@pytest.fixture(scope="module")
def references(devices):
    """verify's results of the replicated program on 1 device and of jax:fsdp on 1 and 2."""
    return {(name, count, variant): _reference(devices, model, count, variant)
            for name, model in MODELS.items()
            for count, variant in ((1, AS_WRITTEN), (1, FSDP), (DEVICES, FSDP))}


@pytest.mark.parametrize("name", list(MODELS))
def test_fsdp_verifies_against_the_replicated_program(references, name):
    refs = {("jax", 1, name): references[(name, 1, AS_WRITTEN)],
            ("jax+fsdp", 1, name): references[(name, 1, FSDP)],
            ("jax+fsdp", DEVICES, name): references[(name, DEVICES, FSDP)]}
    checks = run_checks(refs, "jax")
    assert {c.check for c in checks} >= {N_EQUALS_1, "initial loss and gradients across backends",
                                         "10 steps: losses and final weights", "replicas hold the same weights"}
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    two = references[(name, DEVICES, FSDP)]
    # Each device's share of the batch: the 1-device run's losses of the same two slices.
    assert np.allclose(two.shard_losses[DEVICES], references[(name, 1, FSDP)].shard_losses[DEVICES], rtol=1e-5)


def test_parameters_and_adam_moments_are_divided_over_the_devices(devices):
    model = MODELS["transformer-tiny"]
    backend = _backend(devices, DEVICES)
    trial = _trial(model, DEVICES)
    work = build_work(trial.model, trial.samples, trial.seed)
    prepared = backend.prepare(trial, work)
    assert prepared.info.weights_hash == work.weights_hash and prepared.info.params == work.params
    import jax

    params, opt_state = prepared.state[0], prepared.state[1]
    held = sum(s.data.size for leaf in jax.tree.leaves(params) for s in leaf.addressable_shards
               if s.device == devices[0])
    assert held == work.params // DEVICES  # transformer-tiny: every tensor has an even dimension
    moments = [leaf for leaf in jax.tree.leaves(opt_state) if np.ndim(leaf) > 0]
    assert moments and all(not leaf.sharding.is_fully_replicated for leaf in moments)
    assert any("fsdp: jax.jit with NamedShardings over 2 device(s)" in note for note in prepared.info.notes)
    replicas = backend.replica_weights(prepared)
    assert len(replicas) == DEVICES
    assert all(np.array_equal(a, b) for replica in replicas for a, b in zip(replica, work.arrays))


def test_a_gradient_summed_over_the_shards_fails_verification(devices, references, monkeypatch):
    """The classic slip: N times the gradient. Adam's steps hardly change (they divide by the
    gradient's own scale), so only "N devices = 1 device" catches it (0.92 normwise, the
    unchanged loss included); the ten steps pass."""
    name = "medium"
    monkeypatch.setattr(sharded, "SUM_SHARD_GRADIENTS", True)
    refs = {("jax", 1, name): references[(name, 1, AS_WRITTEN)],
            ("jax+fsdp", 1, name): references[(name, 1, FSDP)],
            ("jax+fsdp", DEVICES, name): _reference(devices, MODELS[name], DEVICES)}
    failed = [c for c in run_checks(refs, "jax") if not c.passed]
    assert [c.check for c in failed] == [N_EQUALS_1], failed
    assert failed[0].norm_rel > 0.5


def test_refusals_are_one_line_reasons(devices):
    backend = _backend(devices, DEVICES)
    odd = ModelSpec(name="odd", widths=(3,), inputs=5, outputs=3, batch_sizes=(BATCH,))
    trial = _trial(odd, DEVICES)
    with pytest.raises(Unsupported, match="no parameter of this model has a dimension that 2 devices divide"):
        backend.prepare(trial, build_work(odd, trial.samples, trial.seed))
    twin = replace(_trial(MODELS["medium"], DEVICES), all_reduce=False)  # --breakdown's compute-only twin
    with pytest.raises(Unsupported, match="fsdp has no compute-only twin"):
        backend.prepare(twin, build_work(twin.model, twin.samples, twin.seed))
    plain = _trial(MODELS["medium"], 1, program=PLAIN)
    with pytest.raises(Unsupported, match="the plain program has no devices to shard over"):
        _backend(devices, 1).prepare(plain, build_work(plain.model, plain.samples, plain.seed))
    assert sharding.FSDP in {v.name for v in JaxPmapBackend.variants}
    from xbench_backends.jax.shardmap import JaxAutoBackend, JaxShardMapBackend

    assert not {sharding.FSDP} & {v.name for cls in (JaxAutoBackend, JaxShardMapBackend) for v in cls.variants}
