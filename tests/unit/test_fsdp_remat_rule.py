"""`fsdp-remat`, the sharded program with each transformer block recomputed, without a
framework: one declaration for jax and torch (both flags, the transformer only, each part's
description), TensorFlow's refusal before it is imported, and the memory check, which counts a
share of the state and one block's activations, so that GPT-3 13B fits where neither part does."""

from __future__ import annotations

from dataclasses import replace

import pytest

from xbench.contract import DATA_PARALLEL, TimingProtocol, Trial, Unsupported, variants_of
from xbench.contract.work import build_work
from xbench.models.memory import GiB
from xbench.models.model_spec import preset_model
from xbench_backends import recompute, sharding

H200 = 141 * GiB


def _backends():
    from xbench_backends.jax.pmap import JaxPmapBackend
    from xbench_backends.torch.ddp import TorchDdpBackend

    return {"jax": JaxPmapBackend, "torch": TorchDdpBackend}


def test_jax_and_torch_declare_it_sharded_and_recomputed_for_the_transformer_only():
    for name, backend in _backends().items():
        declared = variants_of(backend)
        combined, fsdp, remat = (declared[v] for v in (sharding.FSDP_REMAT, sharding.FSDP, recompute.REMAT))
        assert combined.sharded and combined.recompute and combined.same_formula, name
        assert combined.families == remat.families == ("transformer",), name
        # each part described as its own declaration says it (torch's remat: how before sharding)
        assert combined.description.startswith(f"{fsdp.description}; and "), name
        assert remat.description.split(" (")[0] in combined.description, name


def test_a_variant_that_checkpoints_blocks_is_refused_for_a_family_without_them_by_its_own_name():
    assert recompute.refusal("transformer", sharding.FSDP_REMAT) is None
    why = recompute.refusal("mlp", sharding.FSDP_REMAT)
    assert why == "fsdp-remat checkpoints each transformer block; the mlp family has no blocks (it runs on transformer)"
    assert recompute.refusal("mlp") == why.replace("fsdp-remat", "remat", 1)


def test_tf_declares_it_and_refuses_it_with_fsdps_reason_before_importing_tensorflow():
    from xbench_backends.tf.mirrored import FSDP_REASON, TfMirroredBackend

    assert variants_of(TfMirroredBackend)[sharding.FSDP_REMAT].families == ("transformer",)
    model = preset_model("transformer-tiny")
    trial = Trial(backend="tf", model=replace(model, batch_sizes=(8,)), devices=2, global_batch=8, scaling="strong",
                  precision="fp32", platform="cpu", learning_rate=1e-3, seed=0, samples=16, protocol=TimingProtocol(),
                  variant=sharding.FSDP_REMAT, program=DATA_PARALLEL)
    with pytest.raises(Unsupported) as refused:
        TfMirroredBackend().prepare(trial, build_work(trial.model, 16, 0))
    assert str(refused.value) == FSDP_REASON and "\n" not in FSDP_REASON


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_memory_check_counts_a_share_of_the_state_and_one_blocks_activations(backend, monkeypatch):
    """GPT-3 13B, 8 sequences of 2,048 tokens per H200 over 8: ~235 GiB a device sharded with
    every activation kept, ~197 GiB replicated and recomputed, ~40 GiB both."""
    from xbench.run.memory_check import MEMORY_VARIABLE, memory_checks
    from xbench.run.plan import AS_WRITTEN_VARIANT, Lineup

    monkeypatch.delenv(MEMORY_VARIABLE, raising=False)  # the GPUs' own memory, below
    model = preset_model("gpt3-13b")
    lineup = Lineup(variants=(AS_WRITTEN_VARIANT, *_backends()[backend].variants))
    names = (sharding.FSDP, recompute.REMAT, sharding.FSDP_REMAT)
    trials = {name: Trial(backend=backend, model=replace(model, batch_sizes=(64,)), devices=8, global_batch=64,
                          scaling="strong", precision="bf16", platform="gpu", learning_rate=1e-3, seed=0, samples=640,
                          protocol=TimingProtocol(warmup_steps=0, steps=10, repeats=1), variant=name)
              for name in names}
    gpu = {"simulated": False, "platform": "gpu"}
    found = memory_checks(list(trials.values()), {backend: lineup}, {backend: gpu},
                          {"gpus": [{"memory.total": f"{H200 // 2**20} MiB"}] * 8})
    checks = {name: found[trial.config_id] for name, trial in trials.items()}
    both = checks[sharding.FSDP_REMAT]
    assert both.estimate.sharded and both.estimate.recompute
    assert both.fits and not checks[sharding.FSDP].fits and not checks[recompute.REMAT].fits
    assert both.estimate.total < H200 / 3
