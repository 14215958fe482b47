"""`torch:remat`, activation checkpointing per transformer block (`torch.utils.checkpoint`,
use_reentrant=False), on one CPU process and on two ranks (DDP over gloo): the same loss,
gradients and ten steps as the program without it, by the real check code (transformer-tiny:
N devices = 1 device, across programs, replicas), the plain program too; each block's forward
really run again in the backward pass; the MLP refused.

The trials run in child processes (this module as a script), one per rank, so that torch and
its process group stay out of the pytest process."""

from __future__ import annotations

import os

import pytest

from tests.conftest import ROOT
from tests.support.children import child_log, child_main, run_children
from tests.support.remat_checks import (
    assert_remat_verifies,
    assert_same_loss_and_gradients,
    child_runs,
    verification_trial,
)
from xbench.results.checks import VERIFY_STEPS
from xbench.run.cluster import free_port_block

CHILD_TIMEOUT_S = 400  # a loaded 2-core machine; a hang fails the test instead of blocking CI
WARNINGS = ("-W", "error", "-W", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
REMAT = "remat"


def _trial(name: str, devices: int, variant: str, program: str = "data-parallel"):
    from xbench.models.model_spec import preset_model
    from xbench.results.checks import verification_batch, verification_model

    batch = verification_batch([1, 2])
    return verification_trial("torch", verification_model(preset_model(name), [1, 2]), devices, batch, variant,
                              program)


# -- what each child process does --------------------------------------------------------------


def _child(job: dict) -> dict:
    from xbench.contract import Process, Unsupported
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
    out: dict = {}
    for variant, program in job["runs"]:
        trial = _trial("transformer-tiny", world, variant, program)
        prepared = backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
        calls: list[int] = []
        hook = prepared.model.blocks[0].register_forward_pre_hook(lambda module, args, seen=calls: seen.append(1))
        backend.gradients(prepared)  # one forward and backward, no step taken
        hook.remove()
        reference = reference_run(backend, prepared, VERIFY_STEPS, trial)
        out[variant, program] = {"reference": reference, "notes": prepared.info.notes, "block_calls": len(calls)}
    if world == 1:
        try:
            trial = _trial("medium", 1, REMAT)
            backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
        except Unsupported as err:
            out["refusal"] = str(err)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    pytest.importorskip("torch")
    tmp_path = tmp_path_factory.mktemp("remat_torch")
    port = free_port_block(1)
    one = [["as-written", "data-parallel"], [REMAT, "data-parallel"], [REMAT, "plain"]]
    jobs = {"one": {"world": 1, "runs": one},
            **{f"rank{r}": {"world": 2, "rank": r, "port": port, "gang": "ranks", "runs": [[REMAT, "data-parallel"]]}
               for r in (0, 1)}}
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    found = run_children(__file__, jobs, tmp_path, CHILD_TIMEOUT_S, env={"PYTHONPATH": path}, python_flags=WARNINGS)
    for name in jobs:
        print(name, child_log(tmp_path, name))  # shown by pytest only on failure
    return found


def test_remat_computes_the_loss_and_gradients_of_the_program_without_it(results):
    runs = child_runs(results["one"], results["rank0"])
    assert_same_loss_and_gradients(runs["as written"], runs["remat"])


def test_remat_verifies_against_the_program_without_it(results):
    assert_remat_verifies("torch", "transformer-tiny", 2, child_runs(results["one"], results["rank0"]))


def test_each_block_runs_again_in_the_backward_pass(results):
    one = results["one"]
    assert one["as-written", "data-parallel"]["block_calls"] == 1
    assert one[REMAT, "data-parallel"]["block_calls"] == 2 and one[REMAT, "plain"]["block_calls"] == 2
    assert results["rank0"][REMAT, "data-parallel"]["block_calls"] == 2
    said = "remat: each of the 2 blocks under torch.utils.checkpoint.checkpoint(use_reentrant=False"
    assert any(note.startswith(said) for note in one[REMAT, "data-parallel"]["notes"])


def test_remat_is_refused_for_the_mlp(results):
    assert "the mlp family has no blocks" in results["one"]["refusal"]


if __name__ == "__main__":
    child_main(_child)
