"""The tf backend's programs (data-parallel, plain) and variants (as-written, xla), tested
directly on CPU without the core: this file starts two child processes, each running this
module as a script (`python tests/test_tf_variants.py JOB.json`), because the number of
simulated CPU devices is fixed at TensorFlow's start:
- 1 device: plain and data-parallel, each as written and with xla; an unknown variant,
- 2 simulated devices: data-parallel, as written and with xla.
Every run must match the plain as-written one in strict fp32 (medium MLP, dropout off, global
batch 32): the same initial loss and gradients, and the same 10-step trajectory. The children
run as run_children's share of the cores allows (one after another under `make test`); every
wait has a timeout and every child is killed in a `finally`.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.support.children import child_main, run_children

CHILD_TIMEOUT_S = 180  # for both children; a hang in a collective fails the test instead of blocking CI
STEPS = 10
RUNS = {1: [(program, variant) for program in ("plain", "data-parallel") for variant in ("as-written", "xla")],
        2: [("data-parallel", variant) for variant in ("as-written", "xla")]}
REFERENCE = (1, "plain", "as-written")


def _model():
    from xbench.models.model_spec import PRESETS, ModelSpec

    preset = PRESETS["medium"]
    return ModelSpec(name="medium", widths=preset["widths"], dropout=0.0, batch_sizes=preset["batch_sizes"])


def _trial(devices: int, program: str, variant: str):
    from xbench.contract import Trial
    from xbench.contract.timing import TimingProtocol

    return Trial(backend="tf", model=_model(), devices=devices, global_batch=32, scaling="strong", precision="fp32",
                 platform="cpu", learning_rate=1e-3, seed=0, samples=320,
                 protocol=TimingProtocol(warmup_steps=0, steps=STEPS, repeats=2), variant=variant, program=program)


# -- what each child process does --------------------------------------------------------------


def _child(devices: int) -> dict:
    from xbench.contract.work import build_work
    from xbench_backends.tf.mirrored import TfMirroredBackend

    backend = TfMirroredBackend()
    backend.setup(devices, "cpu")
    work = build_work(_model(), 320, 0)
    out: dict = {"weights_hash": work.weights_hash}
    for program, variant in RUNS[devices]:
        prepared = backend.prepare(_trial(devices, program, variant), work)
        loss, gradients = backend.gradients(prepared)
        losses = backend.train(prepared, STEPS)
        out[program, variant] = {"info": prepared.info, "loss": loss, "gradients": gradients, "losses": losses,
                                 "replicas": backend.replica_weights(prepared), "xla": _must_compile(prepared)}
    try:
        backend.prepare(_trial(devices, "plain", "fused"), work)
    except ValueError as err:
        out["refusal"] = str(err)
    return out


def _must_compile(prepared) -> bool:
    """Whether the timed loop's graph calls a function XLA must compile (jit_compile=True):
    proof that the variant really compiles, not only that it says so."""
    import tensorflow as tf

    graph = prepared.train.get_concrete_function(tf.constant(0, dtype=tf.int64)).graph.as_graph_def()
    nodes = [*graph.node, *(node for function in graph.library.function for node in function.node_def)]
    return any(node.attr["_XlaMustCompile"].b for node in nodes if "_XlaMustCompile" in node.attr)


# -- the parent: start both children, wait with a timeout, kill leftovers ---------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp_path = tmp_path_factory.mktemp("tf_variants")
    started = time.monotonic()
    results = run_children(__file__, {f"d{d}": {"devices": d} for d in RUNS}, tmp_path, CHILD_TIMEOUT_S)
    print(f"children took {time.monotonic() - started:.1f} s")
    return {devices: results[f"d{devices}"] for devices in RUNS}


def _errors(actual, expected) -> float:
    from xbench.stats import relative_errors

    return relative_errors(actual, expected)[2]  # normwise relative


def _each_run(runs):
    for devices, pairs in RUNS.items():
        for program, variant in pairs:
            yield (devices, program, variant), runs[devices][program, variant]


# -- fast checks: no tensorflow imported ------------------------------------------------------


def test_programs_and_variants_are_declared():
    from xbench.contract import programs_of, variants_of
    from xbench_backends.tf.mirrored import TfMirroredBackend

    backend = TfMirroredBackend()
    assert programs_of(backend) == ("data-parallel", "plain")
    assert list(variants_of(backend)) == ["xla", "fsdp", "remat", "fsdp-remat"]
    assert "jit_compile" in variants_of(backend)["xla"].description


# -- real processes ---------------------------------------------------------------------------


@pytest.mark.slow
def test_every_program_and_variant_gives_the_same_gradient(runs):
    reference = runs[REFERENCE[0]][REFERENCE[1:]]
    assert len(reference["gradients"]) == 8 and np.isfinite(reference["loss"])
    for key, run in _each_run(runs):
        error = _errors([run["loss"], *run["gradients"]], [reference["loss"], *reference["gradients"]])
        print(f"{key} vs {REFERENCE}: initial loss and gradients {error:.2e}")
        assert error <= 1e-4, key


@pytest.mark.slow
def test_every_program_and_variant_trains_the_same(runs):
    reference = runs[REFERENCE[0]][REFERENCE[1:]]
    assert len(reference["losses"]) == STEPS and reference["losses"][-1] < reference["losses"][0]
    for key, run in _each_run(runs):
        devices = key[0]
        loss_error = _errors([np.asarray(run["losses"])], [np.asarray(reference["losses"])])
        assert len(run["replicas"]) == devices, key  # plain: [[weights]]; mirrored: one per device
        weight_error = max(_errors(replica, reference["replicas"][0]) for replica in run["replicas"])
        print(f"{key} vs {REFERENCE} after {STEPS} steps: losses {loss_error:.2e}, weights {weight_error:.2e}")
        assert loss_error <= 1e-4 and weight_error <= 1e-4, key


@pytest.mark.slow
def test_program_and_variant_are_recorded(runs):
    for (devices, program, variant), run in _each_run(runs):
        info = run["info"]
        assert info.weights_hash == runs[devices]["weights_hash"]
        assert info.precision == {"tensor_float_32_execution": False, "keras_policy": "float32"}
        assert info.settings["variant"] == variant and info.settings["jit_compile"] is (variant == "xla")
        assert run["xla"] is (variant == "xla"), (devices, program, variant)  # XLA really compiles it
        assert info.notes[0].startswith(f"program={program}:"), info.notes
        if program == "plain":
            assert "no strategy" in info.notes[0] and info.notes[0].endswith("CPU:0")
        else:
            assert "MirroredStrategy" in info.notes[0]


@pytest.mark.slow
def test_unknown_variant_is_refused(runs):
    for devices in RUNS:
        assert runs[devices]["refusal"] == ("unknown variant 'fused' of tf; known: as-written, xla, fsdp, remat, "
                                            "fsdp-remat")


if __name__ == "__main__":
    child_main(lambda job: _child(job["devices"]))
