"""`torch:fsdp-remat`, FSDP2 with each transformer block wrapped in checkpoint_wrapper
(non-reentrant torch.utils.checkpoint) before fully_shard, on one CPU process and on two ranks
(gloo): verified by the real check code against the replicated program without remat
(transformer-tiny: N devices = 1 device, across programs, ten steps, replicas, each rank's
share), its parameters really divided and each block's forward really run again in the backward
pass, its notes saying both, and the refusals of either part (the MLP, the plain program).

The trials run in child processes (this module as a script), one per rank, so that torch and
its process group stay out of the pytest process."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.support.children import child_log, child_main, run_children
from tests.support.remat_checks import CHECKS, verification_trial
from xbench.results.checks import VERIFY_STEPS
from xbench.run.cluster import free_port_block

CHILD_TIMEOUT_S = 400  # a loaded 2-core machine; a hang fails the test instead of blocking CI
WARNINGS = ("-W", "error", "-W", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
FSDP_REMAT = "fsdp-remat"
MODEL = "transformer-tiny"


def _trial(name: str, devices: int, variant: str, program: str = "data-parallel"):
    from xbench.models.model_spec import preset_model
    from xbench.results.checks import verification_batch, verification_model

    batch = verification_batch([1, 2])
    return verification_trial("torch", verification_model(preset_model(name), [1, 2]), devices, batch, variant,
                              program)


# -- what each child process does --------------------------------------------------------------


def _child(job: dict) -> dict:
    from xbench.contract import Process
    from xbench.contract.work import build_work
    from xbench.worker.capture import reference_run
    from xbench_backends.torch.ddp import TorchDdpBackend

    backend, world = TorchDdpBackend(), job["world"]
    if world == 1:
        backend.setup(1, "cpu")
    else:
        backend.setup_process(Process(rank=job["rank"], world_size=world, local_rank=job["rank"],
                                      local_world_size=world, node_rank=0, nnodes=1,
                                      coordinator=f"127.0.0.1:{job['port']}", hosts=("127.0.0.1",)), "cpu")
    out: dict = {"refusals": _refusals(backend) if world == 1 else {}}
    for variant in job["runs"]:
        trial = _trial(MODEL, world, variant)
        prepared = backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
        block = prepared.model.blocks[0]
        block = getattr(block, "_checkpoint_wrapped_module", block)  # the block itself, inside the wrapper
        calls: list[int] = []
        hook = block.register_forward_pre_hook(lambda module, args, seen=calls: seen.append(1))
        backend.gradients(prepared)  # one forward and backward, no step taken
        hook.remove()
        held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in prepared.model.parameters())
        reference = reference_run(backend, prepared, VERIFY_STEPS, trial, shard_counts=(2,))
        out[variant] = {"reference": reference, "info": prepared.info, "held": held, "block_calls": len(calls)}
    return out


def _refusals(backend) -> dict:
    from xbench.contract import Unsupported
    from xbench.contract.work import build_work

    found = {}
    for name, program in (("medium", "data-parallel"), (MODEL, "plain")):
        trial = _trial(name, 1, FSDP_REMAT, program)
        try:
            backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
        except Unsupported as err:
            found[name, program] = str(err)
    return found


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    pytest.importorskip("torch")
    tmp_path = tmp_path_factory.mktemp("fsdp_remat_torch")
    port = free_port_block(1)
    jobs = {"one": {"world": 1, "runs": ["as-written", FSDP_REMAT]},
            **{f"rank{r}": {"world": 2, "rank": r, "port": port, "gang": "ranks", "runs": [FSDP_REMAT]}
               for r in (0, 1)}}
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    found = run_children(__file__, jobs, tmp_path, CHILD_TIMEOUT_S, env={"PYTHONPATH": path}, python_flags=WARNINGS)
    for name in jobs:
        print(name, child_log(tmp_path, name))  # shown by pytest only on failure
    return found


def test_fsdp_remat_verifies_against_the_replicated_program_without_remat(results):
    from xbench.results.checks import run_checks

    one, rank0 = results["one"], results["rank0"]
    refs = {("torch", 1, MODEL): one["as-written"]["reference"],
            (f"torch+{FSDP_REMAT}", 1, MODEL): one[FSDP_REMAT]["reference"],
            (f"torch+{FSDP_REMAT}", 2, MODEL): rank0[FSDP_REMAT]["reference"]}
    checks = run_checks(refs, "torch")
    assert {c.check for c in checks} >= CHECKS
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    shares = rank0[FSDP_REMAT]["reference"].shard_losses[2]
    assert np.allclose(shares, one[FSDP_REMAT]["reference"].shard_losses[2], rtol=1e-5)


def test_each_rank_holds_half_and_each_block_runs_again_in_the_backward_pass(results):
    one, rank0 = results["one"], results["rank0"][FSDP_REMAT]
    params = one[FSDP_REMAT]["info"].params
    assert rank0["info"].weights_hash == one[FSDP_REMAT]["info"].weights_hash
    assert params / 2 <= rank0["held"] < params / 2 + 300  # dimension 0 split, the last share padded
    assert one["as-written"]["block_calls"] == 1
    assert one[FSDP_REMAT]["block_calls"] == 2 and rank0["block_calls"] == 2


def test_the_notes_say_what_is_sharded_and_what_is_recomputed(results):
    notes = results["rank0"][FSDP_REMAT]["info"].notes
    assert any(note.startswith("fsdp: FSDP2 fully_shard over 2 rank(s) (3 units: 2 and the root)") for note in notes)
    assert any(note.startswith("remat: each of the 2 blocks wrapped in checkpoint_wrapper(NO_REENTRANT") and
               "before fully_shard" in note for note in notes)


def test_the_mlp_and_the_plain_program_are_refused_in_one_line(results):
    refusals = results["one"]["refusals"]
    assert f"{FSDP_REMAT} checkpoints each transformer block; the mlp family has no blocks" in \
        refusals["medium", "data-parallel"]
    assert f"{FSDP_REMAT} shards the data-parallel program over its ranks; the plain program has none" in \
        refusals[MODEL, "plain"]
    assert all("\n" not in why for why in refusals.values())


def test_fsdp_remat_is_declared_sharded_and_recomputed_for_the_transformer():
    from xbench.contract import variants_of
    from xbench_backends.torch.ddp import TorchDdpBackend

    declared = variants_of(TorchDdpBackend)[FSDP_REMAT]
    assert declared.sharded and declared.recompute and declared.same_formula
    assert declared.families == ("transformer",) and "checkpoint_wrapper" in declared.description


if __name__ == "__main__":
    child_main(_child)
