"""`forget_trial` (the contract's `ForgetsTrials`): on CPUs the jax backends drop jax's caches of a
finished trial's compiled programs, and a trial prepared afterwards compiles afresh and trains
exactly as the first did."""

from __future__ import annotations

import pytest

from xbench.contract import AS_WRITTEN, DATA_PARALLEL, PLAIN, ForgetsTrials, Trial
from xbench.contract.timing import TimingProtocol
from xbench.contract.work import build_work
from xbench.models.model_spec import ModelSpec

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

from tests.backends.jax.cpu_devices import DEVICES, simulated_devices  # noqa: E402
from xbench_backends.jax.pmap import JaxPmapBackend  # noqa: E402
from xbench_backends.jax.shardmap import JaxShardMapBackend  # noqa: E402

BATCH = 8
MODEL = ModelSpec(name="forget-test", widths=(16,), batch_sizes=(BATCH,))


@pytest.fixture(scope="module")
def devices():
    return simulated_devices(DEVICES)


def _trial(backend: str, devices: int, program: str) -> Trial:
    protocol = TimingProtocol(warmup_steps=0, steps=4, repeats=1, steps_per_call=1, trial_timeout_s=600)
    return Trial(backend=backend, model=MODEL, devices=devices, global_batch=BATCH, scaling="strong",
                 precision="fp32", platform="cpu", learning_rate=1e-3, seed=0, samples=4 * BATCH, protocol=protocol,
                 options={}, launcher="subprocess", variant=AS_WRITTEN, program=program)


def test_jax_backends_forget_trials():
    assert isinstance(JaxPmapBackend(), ForgetsTrials)
    assert isinstance(JaxShardMapBackend(), ForgetsTrials)


@pytest.mark.parametrize(("cls", "n", "program"), [
    pytest.param(JaxPmapBackend, 1, PLAIN, id="plain-nnx"),
    pytest.param(JaxPmapBackend, 2, DATA_PARALLEL, id="pmap"),
    pytest.param(JaxShardMapBackend, 2, DATA_PARALLEL, id="shardmap"),
])
def test_caches_dropped_and_the_next_trial_trains_the_same(devices, cls, n, program):
    import jax

    backend = cls()
    backend.devices = devices[:n]
    work = build_work(MODEL, 4 * BATCH, 0)
    probe = jax.jit(lambda x: x + 1)
    probe(1.0)
    first = backend.train(backend.prepare(_trial(backend.name, n, program), work), 3)
    assert probe._cache_size() == 1
    backend.forget_trial()
    assert probe._cache_size() == 0
    assert backend.train(backend.prepare(_trial(backend.name, n, program), work), 3) == first


def test_kept_on_gpus(devices):
    import types

    import jax

    backend = JaxPmapBackend()
    backend.devices = [types.SimpleNamespace(platform="gpu", process_index=0, memory_stats=lambda: None)]
    probe = jax.jit(lambda x: x * 2)
    probe(1.0)
    backend.forget_trial()
    assert probe._cache_size() == 1
