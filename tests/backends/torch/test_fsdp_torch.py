"""`torch:fsdp`, the sharded data-parallel program (FSDP2 `fully_shard` over gloo), on one CPU
process and on two ranks: verified by the real check code against the replicated program
(transformer-tiny and the medium MLP: N devices = 1 device, across programs, ten steps,
replicas, each rank's share), its parameters and Adam state really divided, a gradient
summed over the ranks instead of averaged caught, and the refusals; `torch:fsdp-compile` on one
process.

The trials run in child processes (this module as a script), one per rank, so that torch and
its process group stay out of the pytest process."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.support.children import child_log, child_main, run_children
from xbench.results.checks import VERIFY_STEPS
from xbench.run.cluster import free_port_block

CHILD_TIMEOUT_S = 400  # a loaded 2-core machine; a hang fails the test instead of blocking CI
# Dynamo reads `.grad` of every tensor it traces, FSDP2's unsharded (non-leaf) parameters
# included, and torch warns of that itself (fsdp-compile); nothing of ours reads it.
WARNINGS = ("-W", "error", "-W", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning",
            "-W", "ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning")
MODELS = ("transformer-tiny", "medium")
N_EQUALS_1 = "gradients: N devices = 1 device"


def _model(name: str):
    from xbench.models.model_spec import preset_model
    from xbench.results.checks import verification_model

    return verification_model(preset_model(name), [1, 2])


def _trial(name: str, devices: int, variant: str, program: str = "data-parallel"):
    from dataclasses import replace

    from xbench.contract import Trial
    from xbench.contract.timing import TimingProtocol
    from xbench.results.checks import verification_batch

    batch = verification_batch([1, 2])
    model = replace(_model(name), batch_sizes=(batch,)) if name != "odd" else _odd(batch)
    return Trial(backend="torch", model=model, devices=devices, global_batch=batch, scaling="strong",
                 precision="fp32", platform="cpu", learning_rate=1e-3, seed=0, samples=batch * VERIFY_STEPS,
                 protocol=TimingProtocol(warmup_steps=0, steps=VERIFY_STEPS, repeats=1), variant=variant,
                 program=program)


def _odd(batch: int):
    from xbench.models.model_spec import ModelSpec

    return ModelSpec(name="odd", widths=(3,), inputs=5, outputs=3, batch_sizes=(batch,))


# -- what each child process does --------------------------------------------------------------


def _child(job: dict) -> dict:
    from xbench.contract import Process, Unsupported
    from xbench.contract.work import build_work
    from xbench.worker.capture import reference_run
    from xbench_backends.torch import fsdp
    from xbench_backends.torch.ddp import TorchDdpBackend

    backend, world = TorchDdpBackend(), job["world"]
    if world == 1:
        backend.setup(1, "cpu")
    else:
        backend.setup_process(Process(rank=job["rank"], world_size=world, local_rank=job["rank"],
                                      local_world_size=world, node_rank=0, nnodes=1,
                                      coordinator=f"127.0.0.1:{job['port']}", hosts=("127.0.0.1",)), "cpu")
    out: dict = {"refusals": {}}
    for name, variant, summed in job["runs"]:
        fsdp.SUM_SHARD_GRADIENTS = summed
        trial = _trial(name, world, variant)
        prepared = backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
        held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in prepared.model.parameters())
        reference = reference_run(backend, prepared, VERIFY_STEPS, trial, shard_counts=(2,))
        adam_held = sum(v.to_local().numel() if hasattr(v, "to_local") else v.numel()
                        for state in prepared.optimizer.state.values() for k, v in state.items() if k == "exp_avg")
        out[name, variant, summed] = {"reference": reference, "info": prepared.info, "held": held,
                                      "adam_held": adam_held}
    fsdp.SUM_SHARD_GRADIENTS = False
    for name, program in (("odd", "data-parallel"), ("medium", "plain")):
        if world == 1 and name == "odd":
            continue  # one rank divides anything
        try:
            trial = _trial(name, world, "fsdp", program)
            backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
        except Unsupported as err:
            out["refusals"][name, program] = str(err)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    pytest.importorskip("torch")
    tmp_path = tmp_path_factory.mktemp("fsdp_torch")
    port = free_port_block(1)
    one = [[name, variant, False] for name in MODELS for variant in ("as-written", "fsdp")]
    one.append(["transformer-tiny", "fsdp-compile", False])  # one rank: its compile is the cost
    two = [[name, "fsdp", False] for name in MODELS] + [["medium", "fsdp", True]]
    jobs = {"one": {"world": 1, "runs": one},
            **{f"rank{r}": {"world": 2, "rank": r, "port": port, "gang": "ranks", "runs": two} for r in (0, 1)}}
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    found = run_children(__file__, jobs, tmp_path, CHILD_TIMEOUT_S, env={"PYTHONPATH": path}, python_flags=WARNINGS)
    for name in jobs:
        print(name, child_log(tmp_path, name))  # shown by pytest only on failure
    return found


def _refs(results, name: str, summed: bool = False):
    one, two = results["one"], results["rank0"]
    return {("torch", 1, name): one[name, "as-written", False]["reference"],
            ("torch+fsdp", 1, name): one[name, "fsdp", False]["reference"],
            ("torch+fsdp", 2, name): two[name, "fsdp", summed]["reference"]}


@pytest.mark.parametrize("name", MODELS)
def test_fsdp_verifies_against_the_replicated_program(results, name):
    from xbench.results.checks import run_checks

    checks = run_checks(_refs(results, name), "torch")
    assert {c.check for c in checks} >= {N_EQUALS_1, "initial loss and gradients across backends",
                                         "10 steps: losses and final weights", "replicas hold the same weights"}
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    shares = [results[f"rank{r}"][name, "fsdp", False]["reference"].shard_losses[2] for r in (0, 1)]
    assert shares[0] == shares[1]  # gathered: every rank reports both
    assert np.allclose(shares[0], results["one"][name, "fsdp", False]["reference"].shard_losses[2], rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_each_rank_holds_half_of_the_parameters_and_of_adams_moments(results, name):
    one, rank0 = results["one"][name, "fsdp", False], results["rank0"][name, "fsdp", False]
    params = one["info"].params
    assert rank0["info"].params == params and rank0["info"].weights_hash == one["info"].weights_hash
    assert one["held"] == params and one["adam_held"] == params
    # dimension 0 split, the last share padded: half, give or take a row per tensor
    assert params / 2 <= rank0["held"] < params / 2 + 300 and rank0["adam_held"] == rank0["held"]
    assert any(note.startswith("fsdp: FSDP2 fully_shard over 2 rank(s)") for note in rank0["info"].notes)


def test_fsdp_compile_compiles_each_block_and_verifies_against_the_replicated_program(results):
    """`fsdp-compile`: each block compiled in place before fully_shard (torchtitan's order),
    the same arithmetic as the eager program."""
    from xbench.results.checks import run_checks

    run = results["one"]["transformer-tiny", "fsdp-compile", False]
    refs = {("torch", 1, "transformer-tiny"): results["one"]["transformer-tiny", "as-written", False]["reference"],
            ("torch+fsdp-compile", 1, "transformer-tiny"): run["reference"]}
    checks = run_checks(refs, "torch")
    assert checks and all(c.passed for c in checks), [c for c in checks if not c.passed]
    assert run["info"].settings["compiled_region"] == "each sharded unit (mode=default)"
    compiled = "torch.compile(mode=default) of each of the 2 sharded units"
    assert any(note.startswith(compiled) for note in run["info"].notes)


def test_a_gradient_summed_over_the_ranks_fails_verification(results):
    """FSDP2's gradient divide factor set to 1: the reduce-scatter sums. Adam's steps hardly
    change, so only "N devices = 1 device" sees it."""
    from xbench.results.checks import run_checks

    failed = [c for c in run_checks(_refs(results, "medium", summed=True), "torch") if not c.passed]
    assert [c.check for c in failed] == [N_EQUALS_1], failed
    assert failed[0].norm_rel > 0.5


def test_refusals_are_one_line_reasons(results):
    refusals = results["rank0"]["refusals"]
    assert "no parameter of this model has a dimension that 2 devices divide" in refusals["odd", "data-parallel"]
    assert "the plain program has none" in results["one"]["refusals"]["medium", "plain"]
    assert all("\n" not in why for why in refusals.values())


if __name__ == "__main__":
    child_main(_child)
