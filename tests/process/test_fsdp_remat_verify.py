"""`xbench verify` of the sharded programs with each block recomputed (`jax:fsdp-remat`,
`torch:fsdp-remat`) against the programs without either, through the CLI, its workers (torch
over gloo, one process per rank) and the real checks: transformer-tiny on 1 and 2 devices, in
the verify the fsdp and remat variants share (tests/process/conftest.py). (The refusals, the
state divided and the blocks recomputed: tests/backends/*/test_fsdp_remat_*.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("jax")
pytest.importorskip("torch")


@pytest.mark.slow
def test_the_sharded_recomputed_programs_verify_against_the_programs_without_them(transformer_variants_verified):
    code, out, err = transformer_variants_verified
    flat = " ".join(out.split())
    assert code == 0, out + err
    for subject in ("transformer-tiny: jax+fsdp-remat d1 vs jax d1", "transformer-tiny: torch+fsdp-remat d1 vs jax d1",
                    "transformer-tiny: jax+fsdp-remat d2 vs jax+fsdp-remat d1",
                    "transformer-tiny: torch+fsdp-remat d2 vs torch+fsdp-remat d1",
                    "transformer-tiny: torch+fsdp-remat d2 vs jax d1",
                    "transformer-tiny: jax+fsdp-remat d2: replicas 1.. vs 0",
                    "transformer-tiny: torch+fsdp-remat d2: replicas 1.. vs 0",
                    "transformer-tiny: torch+fsdp-remat d2 vs d1, 2 slices"):
        assert subject in flat, subject
    assert "FAIL" not in out and "checks passed" in err
