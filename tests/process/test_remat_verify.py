"""`xbench verify` of the activation-checkpointing variants (`jax:remat`, `torch:remat`) against
the programs without them, through the CLI, its workers (torch over gloo, one process per rank)
and the real checks: transformer-tiny on 1 and 2 devices, in the verify the fsdp variants share
(tests/process/conftest.py). (The plain program, tf:remat and the
refusals: tests/backends/*/test_remat_*.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("jax")
pytest.importorskip("torch")


@pytest.mark.slow
def test_the_remat_variants_verify_against_the_programs_without_them(transformer_variants_verified):
    code, out, err = transformer_variants_verified
    flat = " ".join(out.split())
    assert code == 0, out + err
    for subject in ("transformer-tiny: jax+remat d1 vs jax d1", "transformer-tiny: torch+remat d1 vs jax d1",
                    "transformer-tiny: jax+remat d2 vs jax+remat d1",
                    "transformer-tiny: torch+remat d2 vs torch+remat d1",
                    "transformer-tiny: torch+remat d2 vs jax d1", "transformer-tiny: jax+remat d2: replicas 1.. vs 0"):
        assert subject in flat, subject
    # the same formula: held to the program's own float64 run and floor, not a run of its own
    assert "torch+remat use torch's float64 run and floor" in " ".join(err.split())
    assert "FAIL" not in out and "checks passed" in err
