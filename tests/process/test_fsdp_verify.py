"""`xbench verify` of the sharded data-parallel programs (`jax:fsdp`, `torch:fsdp`) against each
other and against the replicated programs, through the CLI, its workers (torch over gloo, one
process per rank) and the real checks: transformer-tiny on 1 and 2 devices, in the verify the remat variants share
(tests/process/conftest.py). (The medium MLP, a
planted summed gradient and the refusals: tests/backends/jax/test_fsdp_jax.py and
tests/backends/torch/test_fsdp_torch.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("jax")
pytest.importorskip("torch")


@pytest.mark.slow
def test_the_sharded_programs_verify_against_each_other_and_the_replicated_ones(transformer_variants_verified):
    code, out, err = transformer_variants_verified
    flat = " ".join(out.split())
    assert code == 0, out + err
    for subject in ("transformer-tiny: jax+fsdp d2 vs jax+fsdp d1", "transformer-tiny: torch+fsdp d2 vs torch+fsdp d1",
                    "transformer-tiny: jax+fsdp d1 vs jax d1", "transformer-tiny: torch+fsdp d1 vs jax d1",
                    "transformer-tiny: torch+fsdp d2 vs jax d1", "transformer-tiny: jax+fsdp d2: replicas 1.. vs 0",
                    "transformer-tiny: torch+fsdp d2 vs d1, 2 slices"):
        assert subject in flat, subject
    assert "FAIL" not in out and "checks passed" in err
