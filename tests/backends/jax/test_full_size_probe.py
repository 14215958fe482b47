"""A fault past the reduced instance's depth: a jax transformer program that runs only its
first two blocks is right on the 2-block instance verify trains, and the full-size probe
catches it (in-process, simulated CPU devices)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from xbench.contract import DATA_PARALLEL, Trial
from xbench.contract.timing import TimingProtocol
from xbench.contract.work import build_work
from xbench.models.model_spec import ModelSpec
from xbench.results.checks import run_checks, verification_model
from xbench.results.full_size import FULL_SIZE, full_size_checks, full_size_model
from xbench.worker.capture import SUMMARY_COLUMNS, reference_run

pytest.importorskip("jax")
pytest.importorskip("flax")

from tests.backends.jax.cpu_devices import simulated_devices  # noqa: E402
from xbench_backends.jax import nnx_transformer  # noqa: E402
from xbench_backends.jax.pmap import JaxPmapBackend  # noqa: E402

# Four blocks: verify's instance keeps two (`verification_dims`), the probe runs all four.
DEEP = ModelSpec(name="deep", family="transformer", batch_sizes=(8,),
                 dims=tuple(sorted(dict(layers=4, heads=2, width=32, context=16, vocab=64).items())))


@pytest.fixture(scope="module")
def backend():
    made = JaxPmapBackend()
    made.devices = simulated_devices(1)[:1]
    return made


def run(backend, model: ModelSpec, steps: int):
    protocol = TimingProtocol(warmup_steps=0, steps=steps, repeats=1, steps_per_call=1, trial_timeout_s=600)
    batch = model.batch_sizes[0]
    trial = Trial(backend="jax", model=model, devices=1, global_batch=batch, scaling="strong", precision="fp32",
                  platform="cpu", learning_rate=1e-3, seed=0, samples=batch * max(steps, 1), protocol=protocol,
                  options={}, launcher="subprocess", program=DATA_PARALLEL)
    return reference_run(backend, backend.prepare(trial, build_work(model, trial.samples, trial.seed)), steps, trial)


def first_two_blocks_only(real):
    """nnx_transformer.constructor, its GPT running blocks 0 and 1 and skipping the rest."""
    def constructor(trial, work, variant):
        make = real(trial, work, variant)

        def build():
            import jax.numpy as jnp

            model = make()

            def shallow(self, tokens, rngs=None):
                h = self.wte(tokens) + self.wpe(jnp.arange(tokens.shape[1]))
                for block in list(self.blocks)[:2]:
                    h = block(h)
                return self.wte.attend(self.lnf(h))
            type(model).__call__ = shallow  # the class is made anew by each constructor call
            return model
        return build
    return constructor


def test_a_block_past_the_reduced_depth_skipped_passes_the_trained_instance_and_fails_the_probe(backend,
                                                                                              monkeypatch):
    reduced, full = verification_model(DEEP, [1]), full_size_model(DEEP, [1])
    assert dict(reduced.dims)["layers"] == 2 and full is not None
    right = {("jax", 1, "deep"): run(backend, reduced, 2)}
    right_probe = {("jax", 1, "deep"): run(backend, full, 0)}
    monkeypatch.setattr(nnx_transformer, "constructor", first_two_blocks_only(nnx_transformer.constructor))
    wrong = {("shallow", 1, "deep"): run(backend, reduced, 2)}
    wrong_probe = {("shallow", 1, "deep"): run(backend, full, 0)}

    trained = run_checks({**right, **wrong}, reference_backend="jax")
    assert trained and all(c.passed for c in trained), trained
    probes = {**right_probe, **wrong_probe}
    [probe] = full_size_checks(probes, dict.fromkeys(probes, "fp32"), "jax")
    assert probe.check.startswith(FULL_SIZE) and not probe.passed and probe.norm_rel > 0.1, probe


def test_the_probe_of_a_right_program_passes_and_keeps_no_arrays(backend):
    full = full_size_model(DEEP, [1, 2])
    one = run(backend, replace(full, batch_sizes=(4,)), 0)
    again = run(backend, replace(full, batch_sizes=(4,)), 0)
    [check] = full_size_checks({("jax", 1, "deep"): one, ("other", 1, "deep"): again},
                               {("jax", 1, "deep"): "fp32", ("other", 1, "deep"): "fp32"}, "jax")
    tensors = len(DEEP.kind.parameters(full.shape))
    assert check.passed and one.gradients == [] and one.summaries.shape == (tensors, len(SUMMARY_COLUMNS))
