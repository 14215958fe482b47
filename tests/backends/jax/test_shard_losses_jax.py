"""`shard_losses` (`ReportsShardLosses`) of the jax backends, in-process on 2 simulated CPU
devices: every program and variant reports, for the current step's batch, the loss of each of
its two halves: on 2 devices each device's own (no pmean), on 1 device two forward passes of
the halves. They must agree with the 1-device data-parallel program's halves, average to the
global loss that `gradients` returns (families without batch statistics), differ from each
other, follow the step's batch, and change nothing. The ResNet's halves carry their own
BatchNorm statistics: the 2-device gradient's loss is their mean, the 1-device one is not."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from xbench.contract import AS_WRITTEN, DATA_PARALLEL, PLAIN, ReportsShardLosses, Trial
from xbench.contract.timing import TimingProtocol
from xbench.contract.work import build_work
from xbench.models.model_spec import ModelSpec, preset_model

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

from tests.backends.jax.cpu_devices import DEVICES, simulated_devices  # noqa: E402
from xbench_backends.jax.pmap import JaxPmapBackend  # noqa: E402
from xbench_backends.jax.shardmap import JaxAutoBackend, JaxShardMapBackend  # noqa: E402

BATCH = 8
STEPS = 2  # the second comparison is after this many steps: batch 2 of 3
AGREE = 1e-5  # relative, between two programs' values of one slice
MODELS = {
    "mlp": ModelSpec(name="mlp-test", widths=(32, 32), batch_sizes=(BATCH,), inputs=16, dropout=0.0),
    # transformer-tiny's blocks, a shorter context and vocabulary (a second to compile)
    "transformer": replace(preset_model("transformer-tiny", batch_sizes=(BATCH,)),
                           dims=tuple(sorted({**dict(preset_model("transformer-tiny").dims),
                                              "context": 16, "vocab": 64}.items()))),
    "cnn": ModelSpec(name="cnn-test", family="cnn", batch_sizes=(BATCH,),
                     dims=tuple(sorted(dict(depth=10, image=32, channels=3, classes=10).items()))),
}
# (backend, devices, program, variant, steps per call): every program and variant on CPU
PROGRAMS = [
    ("jax", 2, DATA_PARALLEL, AS_WRITTEN, 1),
    ("jax", 2, DATA_PARALLEL, "jnp", 1),
    ("jax", 2, DATA_PARALLEL, "fused", STEPS),
    ("jax", 1, PLAIN, AS_WRITTEN, 1),  # Flax NNX's nnx.jit program
    ("jax", 1, PLAIN, "functional", 1),
    ("jax", 1, PLAIN, "jnp", 1),
    ("jax-shardmap", 1, DATA_PARALLEL, AS_WRITTEN, 1),
    ("jax-shardmap", 2, DATA_PARALLEL, AS_WRITTEN, 1),
    ("jax-auto", 1, DATA_PARALLEL, AS_WRITTEN, 1),
    ("jax-auto", 2, DATA_PARALLEL, AS_WRITTEN, 1),
]
# The transformer (a few seconds to compile each): the as-written programs.
CASES = [("mlp", *p) for p in PROGRAMS] + [("transformer", *p) for p in PROGRAMS if p[3] == AS_WRITTEN and
                                           (p[1] == 2 or p[2] == PLAIN)]


@pytest.fixture(scope="module")
def backends() -> dict:
    """One instance of each jax backend; `prepare` gives it its device count for a trial."""
    devices = simulated_devices(DEVICES)
    return {"devices": devices, **{cls.name: cls() for cls in (JaxPmapBackend, JaxShardMapBackend, JaxAutoBackend)}}


def trial(model: ModelSpec, backend: str, devices: int, program: str = DATA_PARALLEL, variant: str = AS_WRITTEN,
          steps_per_call: int = 1, precision: str = "fp32") -> Trial:
    protocol = TimingProtocol(warmup_steps=0, steps=STEPS, repeats=1, steps_per_call=steps_per_call,
                              trial_timeout_s=600)
    return Trial(backend=backend, model=model, devices=devices, global_batch=BATCH, scaling="strong",
                 precision=precision, platform="cpu", learning_rate=1e-3, seed=0, samples=BATCH * 3,
                 protocol=protocol, options={}, launcher="subprocess", variant=variant, program=program)


def prepare(backends, model: ModelSpec, name: str, devices: int, **kwargs):
    backend = backends[name]
    backend.devices = list(backends["devices"][:devices])
    t = trial(model, name, devices, **kwargs)
    return backend, backend.prepare(t, build_work(model, t.samples, t.seed))


def observed(backend, prepared) -> dict:
    """The halves and the global loss now and after STEPS training steps."""
    found = {}
    for when in ("start", "later"):
        found[when] = backend.shard_losses(prepared, 2), backend.gradients(prepared)[0]
        backend.train(prepared, STEPS)
    return found


def relative(a, b) -> float:
    return float(np.max(np.abs(np.subtract(a, b)) / np.abs(b)))


@pytest.fixture(scope="module")
def reference(backends):
    """The 1-device data-parallel program's halves, per family."""
    cache: dict = {}

    def get(family: str) -> dict:
        if family not in cache:
            cache[family] = observed(*prepare(backends, MODELS[family], "jax", 1))
        return cache[family]

    return get


def test_backends_report_shard_losses():
    for cls in (JaxPmapBackend, JaxShardMapBackend, JaxAutoBackend):
        assert isinstance(cls(), ReportsShardLosses)


@pytest.mark.parametrize("family, name, devices, program, variant, steps_per_call", CASES,
                         ids=[f"{c[0]}-{c[1]}-d{c[2]}-{c[3]}-{c[4]}" for c in CASES])
def test_each_device_computes_its_own_half(backends, reference, family, name, devices, program, variant,
                                           steps_per_call):
    expected = reference(family)
    found = observed(*prepare(backends, MODELS[family], name, devices, program=program, variant=variant,
                              steps_per_call=steps_per_call))
    for when, (halves, loss) in found.items():
        wanted, _ = expected[when]
        assert len(halves) == 2 and relative(halves, wanted) <= AGREE, (when, halves, wanted)
        assert relative(np.mean(halves), loss) <= 1e-6, (when, halves, loss)
        assert relative(halves[0], halves[1]) > 1e-4, (when, halves)
    assert relative(found["start"][0], found["later"][0]) > 1e-4  # the step's batch, not a fixed one


@pytest.mark.parametrize("name", ["jax", "jax-shardmap", "jax-auto"])
def test_shards_that_do_not_fit_are_refused(backends, name):
    model = MODELS["mlp"]
    backend, one = prepare(backends, model, name, 1)
    assert len(backend.shard_losses(one, 4)) == 4 and len(backend.shard_losses(one, 1)) == 1
    with pytest.raises(ValueError, match="3 shards do not divide the global batch of 8"):
        backend.shard_losses(one, 3)
    backend, two = prepare(backends, model, name, 2)
    with pytest.raises(ValueError, match="a program on 2 devices reports 2 shards"):
        backend.shard_losses(two, 4)
    with pytest.raises(ValueError, match="a program on 2 devices reports 2 shards"):
        backend.shard_losses(two, 1)


def test_plain_nnx_program_refuses_shards_that_do_not_divide(backends):
    backend, prepared = prepare(backends, MODELS["mlp"], "jax", 1, program=PLAIN)
    with pytest.raises(ValueError, match="do not divide"):
        backend.shard_losses(prepared, 3)


def test_shard_losses_with_dropout_change_nothing(backends):
    """Dropout on: the pmap halves draw each device's stream (so they are the step's own masks:
    their mean is the global loss the gradient sees), and nothing of the state moves."""
    model = replace(MODELS["mlp"], dropout=0.3)
    backend, prepared = prepare(backends, model, "jax", 2)
    halves = backend.shard_losses(prepared, 2)
    assert backend.shard_losses(prepared, 2) == halves
    assert relative(np.mean(halves), backend.gradients(prepared)[0]) <= 1e-6
    before = backend.replica_weights(prepared)
    backend.shard_losses(prepared, 2)
    after = backend.replica_weights(prepared)
    assert all(np.array_equal(a, b) for r0, r1 in zip(before, after) for a, b in zip(r0, r1))
    for name, devices in (("jax-shardmap", 2), ("jax-auto", 2), ("jax-auto", 1)):
        other, state = prepare(backends, model, name, devices)
        assert np.all(np.isfinite(other.shard_losses(state, 2))), name


@pytest.mark.slow
def test_resnet_halves_carry_their_own_batch_statistics(backends):
    """The ResNet's halves on 2 devices are the 1-device program's halves (each normalised over
    its own 4 images) in every program, and their mean is the 2-device gradient's loss but not
    the 1-device one's (whose statistics cover all 8 images). The NNX program's BatchNorm
    running averages are not touched."""
    import jax
    from flax import nnx

    def statistics(prepared) -> list[np.ndarray]:
        return [np.asarray(a).copy() for a in jax.tree.leaves(nnx.state(prepared.model, nnx.BatchStat))]

    model = MODELS["cnn"]
    backend, one = prepare(backends, model, "jax", 1)
    wanted, whole = backend.shard_losses(one, 2), backend.gradients(one)[0]
    assert relative(np.mean(wanted), whole) > 1e-3 and relative(wanted[0], wanted[1]) > 1e-3
    for name, devices, program in (("jax", 2, DATA_PARALLEL), ("jax-auto", 2, DATA_PARALLEL), ("jax", 1, PLAIN)):
        backend, prepared = prepare(backends, model, name, devices, program=program)
        kept = statistics(prepared) if program == PLAIN else []
        halves = backend.shard_losses(prepared, 2)
        assert relative(halves, wanted) <= AGREE, (name, devices, program, halves, wanted)
        if devices == 2:
            assert relative(np.mean(halves), backend.gradients(prepared)[0]) <= 1e-6, name
        after = statistics(prepared) if program == PLAIN else []
        assert len(kept) == len(after) and all(np.array_equal(a, b) for a, b in zip(kept, after))
        assert program != PLAIN or kept  # the NNX module holds running averages to keep
