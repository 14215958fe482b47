"""`tf:remat`, activation checkpointing per transformer block (`keras.remat`, TensorFlow's
`tf.recompute_grad`), on 1 and 2 simulated CPU devices (MirroredStrategy): the same loss,
gradients and ten steps as the program without it, by the real check code (transformer-tiny:
N devices = 1 device, across programs, replicas), the plain program too; each block's forward
really in the differentiated program twice; the MLP refused.

The trials run in child processes (this module as a script), one per device count, because
the number of simulated CPU devices is fixed at TensorFlow's start."""

from __future__ import annotations

import pytest

from tests.support.children import child_log, child_main, run_children
from tests.support.remat_checks import assert_remat_verifies, assert_same_loss_and_gradients, child_runs
from xbench.results.checks import VERIFY_STEPS

CHILD_TIMEOUT_S = 400  # a loaded 2-core machine; a hang fails the test instead of blocking CI
REMAT = "remat"
RUNS = {1: [("as-written", "data-parallel"), (REMAT, "data-parallel"), (REMAT, "plain")],
        2: [(REMAT, "data-parallel")]}


def _trial(name: str, devices: int, variant: str, program: str = "data-parallel"):
    from dataclasses import replace

    from xbench.contract import Trial
    from xbench.contract.timing import TimingProtocol
    from xbench.models.model_spec import preset_model
    from xbench.results.checks import verification_batch, verification_model

    batch = verification_batch([1, 2])
    model = replace(verification_model(preset_model(name), [1, 2]), batch_sizes=(batch,))
    return Trial(backend="tf", model=model, devices=devices, global_batch=batch, scaling="strong",
                 precision="fp32", platform="cpu", learning_rate=1e-3, seed=0, samples=batch * VERIFY_STEPS,
                 protocol=TimingProtocol(warmup_steps=0, steps=VERIFY_STEPS, repeats=1), variant=variant,
                 program=program)


# -- what each child process does --------------------------------------------------------------


def _child(job: dict) -> dict:
    from xbench.contract import Unsupported
    from xbench.contract.work import build_work
    from xbench.worker.capture import reference_run
    from xbench_backends.tf.mirrored import TfMirroredBackend

    devices = job["devices"]
    backend = TfMirroredBackend()
    backend.setup(devices, "cpu")
    out: dict = {}
    for variant, program in RUNS[devices]:
        trial = _trial("transformer-tiny", devices, variant, program)
        prepared = backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
        matmuls = _matmuls(prepared)
        out[variant, program] = {"reference": reference_run(backend, prepared, VERIFY_STEPS, trial),
                                 "notes": prepared.info.notes, "matmuls": matmuls}
    if devices == 1:
        try:
            trial = _trial("medium", 1, REMAT)
            backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
        except Unsupported as err:
            out["refusal"] = str(err)
    return out


def _matmuls(prepared) -> int:
    """The matrix products in the timed loop's graph and the functions it calls: a block
    recomputed in the backward pass adds its forward's."""
    import tensorflow as tf

    graph = prepared.train.get_concrete_function(tf.constant(0, dtype=tf.int64)).graph.as_graph_def()
    nodes = [*graph.node, *(node for function in graph.library.function for node in function.node_def)]
    return sum(1 for node in nodes if node.op in ("MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    pytest.importorskip("tensorflow")
    tmp_path = tmp_path_factory.mktemp("remat_tf")
    jobs = {f"d{d}": {"devices": d} for d in RUNS}
    found = run_children(__file__, jobs, tmp_path, CHILD_TIMEOUT_S)
    for name in jobs:
        print(name, child_log(tmp_path, name))  # shown by pytest only on failure
    return found


def test_remat_computes_the_loss_and_gradients_of_the_program_without_it(results):
    runs = child_runs(results["d1"], results["d2"])
    assert_same_loss_and_gradients(runs["as written"], runs["remat"])


def test_remat_verifies_against_the_program_without_it(results):
    assert_remat_verifies("tf", "transformer-tiny", 2, child_runs(results["d1"], results["d2"]))


def test_each_block_is_computed_again_in_the_backward_pass(results):
    one = results["d1"]
    assert one[REMAT, "data-parallel"]["matmuls"] > one["as-written", "data-parallel"]["matmuls"]
    assert any(note.startswith("remat: each of the 2 blocks one Keras layer whose computation runs through keras.remat")
               for note in one[REMAT, "data-parallel"]["notes"])


def test_remat_is_refused_for_the_mlp(results):
    assert "the mlp family has no blocks" in results["d1"]["refusal"]


if __name__ == "__main__":
    child_main(_child)
