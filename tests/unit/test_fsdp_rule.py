"""The `fsdp` variant's shared parts, without a framework: how parameters are divided, which
models are refused, what each backend declares, and TensorFlow's refusal (before it is
imported)."""

from __future__ import annotations

import pytest

from xbench.contract import DATA_PARALLEL, TimingProtocol, Trial, Unsupported, variants_of
from xbench.contract.work import build_work
from xbench.models.model_spec import ModelSpec
from xbench_backends import sharding


def test_a_parameter_is_divided_along_its_largest_dimension_the_devices_divide():
    assert sharding.shard_dim((1024, 128), 2) == 0
    assert sharding.shard_dim((128, 384), 2) == 1
    assert sharding.shard_dim((64, 3), 2) == 0
    assert sharding.shard_dim((3,), 2) is None
    assert sharding.shard_dim((6, 6), 4) is None
    assert sharding.shard_dim((128, 128), 2) == 0  # the first of equals


def test_a_model_nothing_divides_is_refused_in_one_line():
    assert sharding.refusal([(5, 3), (3,)], 1) is None  # one device divides anything
    why = sharding.refusal([(5, 3), (3,)], 2)
    assert why and "\n" not in why and "no parameter of this model has a dimension that 2 devices divide" in why
    assert sharding.refusal([(5, 3), (4,)], 2) is None
    assert sharding.divided_share([(4, 4), (3,)], 2) == (1, 2, pytest.approx(16 / 19))


def test_jax_torch_and_tf_declare_the_variant_for_the_mlp_and_the_transformer():
    from xbench_backends.jax.pmap import JaxPmapBackend
    from xbench_backends.tf.mirrored import TfMirroredBackend
    from xbench_backends.torch.ddp import TorchDdpBackend

    for backend in (JaxPmapBackend, TorchDdpBackend, TfMirroredBackend):
        assert variants_of(backend)[sharding.FSDP].families == ("mlp", "transformer")


def test_tf_refuses_fsdp_with_the_reason_before_importing_tensorflow():
    from xbench_backends.tf.mirrored import TfMirroredBackend

    model = ModelSpec(name="medium", widths=(256, 128, 64), batch_sizes=(32,))
    trial = Trial(backend="tf", model=model, devices=2, global_batch=32, scaling="strong", precision="fp32",
                  platform="cpu", learning_rate=1e-3, seed=0, samples=64, protocol=TimingProtocol(),
                  variant=sharding.FSDP, program=DATA_PARALLEL)
    with pytest.raises(Unsupported, match="TensorFlow has no sharded data-parallel strategy") as refused:
        TfMirroredBackend().prepare(trial, build_work(model, 64, 0))
    assert "\n" not in str(refused.value)
