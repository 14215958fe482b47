"""The torch programs experts write: the cnn family tuned (channels-last memory format
and cuDNN's benchmark mode) in the `channels-last` variant and in the compiled ones.

- channels-last lays out the cnn's convolution weights, its images and so its activations and
  gradients channels-last, and does the same work: the same weights read back (hash), the same
  fp32 gradients to fp32 rounding, the same float64 gradients and 10-step trajectory to float64
  rounding (verify's precision for the cnn), in the plain and the data-parallel program.
- The compiled variant does the same for the cnn: compiled once (forward and loss in one
  graph), no recompilation over the later steps, float64 results those of eager.
- Families without convolutions refuse channels-last at once, with the reason.
- torch.backends.cudnn.benchmark is set by every prepare: on where tuned, off as written, so a
  tuned trial's setting does not leak into the next trial of the same process.

torch runs in two child processes (this module as a script, `python tests/test_torch_tuned.py
JOB.json`), as in test_torch_variants: the eager runs in order in one, the compiled run in the
other (side by side where run_children's share of the cores allows; one after another under
`make test`). One compilation of resnet18 took 40-90 s of CPU on 2 cores; of ResNet-10, less.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.support.children import child_log, child_main, run_children
from xbench.contract import AS_WRITTEN, DATA_PARALLEL, PLAIN

CHILD_TIMEOUT_S = 400  # a compilation on a loaded 2-core machine; a hang fails instead of blocking CI
STEPS = 10
BATCH = 8
# torch imports its own torch.jit.script_method when inductor loads; warnings stay errors otherwise.
WARNINGS = ("-W", "error", "-W", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
CHANNELS_LAST = "channels-last"
# The child's trials of resnet18 in order: (precision, program, variant). Each as-written trial
# follows a tuned one (the first follows a benchmark flag set by hand): nothing may leak.
RUNS = tuple((precision, program, variant)
             for precision in ("fp32", "fp64")
             for program in (PLAIN, DATA_PARALLEL)
             for variant in (AS_WRITTEN, CHANNELS_LAST)) + (("fp64", PLAIN, "compile"),)


def _trial(preset: str = "resnet18", precision: str = "fp32", program: str = PLAIN, variant: str = AS_WRITTEN):
    from xbench.contract import Trial
    from xbench.contract.timing import TimingProtocol
    from xbench.models.model_spec import preset_model

    model = replace(preset_model(preset, batch_sizes=(BATCH,)), dropout=0.0)
    if model.family == "cnn":  # ResNet-10: a block of each kind, half resnet18's compilation
        model = replace(model, dims=tuple(sorted({**dict(model.dims), "depth": 10}.items())))
    return Trial(backend="torch", model=model, devices=1, global_batch=BATCH, scaling="strong", precision=precision,
                 platform="cpu", learning_rate=1e-3, seed=0, samples=BATCH * STEPS,
                 protocol=TimingProtocol(warmup_steps=0, steps=STEPS, repeats=1), program=program, variant=variant)


# -- what the child process does ----------------------------------------------------------------


def _child(job: dict) -> dict:
    import torch

    from xbench_backends.torch.ddp import TorchDdpBackend

    backend = TorchDdpBackend()
    backend.setup(1, "cpu")
    torch.backends.cudnn.benchmark = True  # as a previous trial of another backend might leave it
    return {run: _run(backend, _trial("resnet18", *run)) for run in RUNS if (run[2] == "compile") == job["compile"]}


def _run(backend, trial) -> dict:
    """What prepare reported and left set, where torch holds the data, and verify's reference
    run (only the first gradient in fp32, whose 10-step trajectory is chaotic in a ResNet)."""
    import torch

    from xbench.contract.work import build_work
    from xbench.worker.capture import reference_run
    from xbench_backends.torch.ddp import _forward_backward

    prepared = backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
    out = {"info": prepared.info, "benchmark": torch.backends.cudnn.benchmark,
           "inputs_channels_last": _channels_last([prepared.xs[0]]),
           "weights_channels_last": _channels_last(_convolution_weights(prepared.model))}
    before = _compilations()
    if trial.precision == "fp32":
        out["loss"], out["gradients"] = backend.gradients(prepared)
    else:
        out["reference"] = reference_run(backend, prepared, STEPS)
    out["compiled"] = {k: v - before[k] for k, v in _compilations().items()}
    compiled = prepared.forward if prepared.ddp is None else prepared.ddp.module
    out["compiled_module"] = type(getattr(compiled, "_orig_mod", compiled)).__name__
    _forward_backward(prepared)  # once more, to see the gradients' layout
    out["gradients_channels_last"] = _channels_last([w.grad for w in _convolution_weights(prepared.model)])
    prepared.optimizer.zero_grad(set_to_none=True)
    return out


def _convolution_weights(model):
    return [p for p in model.parameters() if p.dim() == 4]


def _channels_last(tensors) -> bool | None:
    """True: all channels-last contiguous; False: all contiguous (NCHW); None: mixed or
    neither. A tensor that is both (a 1x1 kernel [O, I, 1, 1]) says nothing and is left out."""
    import torch

    found = {t.is_contiguous(memory_format=torch.channels_last) for t in tensors
             if t.is_contiguous() != t.is_contiguous(memory_format=torch.channels_last)}
    return found.pop() if len(found) == 1 else None


def _compilations() -> dict[str, int]:
    """Graphs and frames (a recompilation is one more frame) dynamo has compiled so far."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return {"graphs": 0, "frames": 0}
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"], "frames": counters["frames"]["total"]}


# -- the parent ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of RUNS; the compiled one (most of the time: its compilation) in a child of its
    own beside the eager ones', each on one of 2 cores."""
    tmp_path = tmp_path_factory.mktemp("torch_tuned")
    jobs = {"eager": {"compile": False}, "compile": {"compile": True}}
    found = run_children(__file__, jobs, tmp_path, CHILD_TIMEOUT_S, python_flags=WARNINGS)
    for name in jobs:
        print(name, child_log(tmp_path, name))  # shown by pytest only on failure
    return {run: found["eager" if run[2] != "compile" else "compile"][run] for run in RUNS}


def _error(actual, expected) -> float:
    from xbench.stats import relative_errors

    return relative_errors(actual, expected)[2]  # normwise relative


# -- fast: no torch ------------------------------------------------------------------------------


@pytest.mark.parametrize("preset, family", [("transformer-tiny", "transformer"), ("medium", "mlp"),
                                            ("lstm-small", "lstm")])
def test_channels_last_is_unsupported_without_convolutions(preset, family):
    """Refused first thing in prepare: here without setup (which prepare needs next)."""
    from xbench.contract import Unsupported
    from xbench_backends.torch.ddp import TorchDdpBackend

    with pytest.raises(Unsupported) as refused:
        TorchDdpBackend().prepare(_trial(preset, variant=CHANNELS_LAST), None)
    assert str(refused.value) == f"channels-last changes only convolutions; the {family} family has none"


# -- the child's trials --------------------------------------------------------------------------


@pytest.mark.slow
def test_cudnn_benchmark_is_set_by_every_prepare(runs):
    """On in the tuned variants, off as written: after a tuned trial too (and after the flag
    was set by hand before the first), so no trial inherits the previous one's."""
    for (_, _, variant), run in runs.items():
        tuned = variant != AS_WRITTEN
        assert run["benchmark"] is tuned and run["info"].settings["cudnn_benchmark"] is tuned, variant


@pytest.mark.slow
def test_channels_last_lays_out_weights_images_and_gradients(runs):
    for (precision, program, variant), run in runs.items():
        tuned = variant != AS_WRITTEN
        layout = (run["weights_channels_last"], run["inputs_channels_last"], run["gradients_channels_last"])
        assert layout == (tuned,) * 3, (precision, program, variant, layout)
        assert run["info"].settings["memory_format"] == ("channels_last" if tuned else "contiguous")
        assert any(note.startswith("convolutions: ") and note.endswith(
            "channels-last memory format (NCHW shapes, NHWC strides)" if tuned else "NCHW contiguous memory format")
            for note in run["info"].notes)


@pytest.mark.slow
@pytest.mark.parametrize("program", [PLAIN, DATA_PARALLEL])
def test_channels_last_does_the_same_work(runs, program):
    """The same weights read back; the fp32 gradient to fp32 rounding (measured 1.5e-5, a
    ResNet's fp32 gradient being ill-conditioned: see xbench.results.checks); in float64 the gradient
    and the 10-step trajectory to float64 rounding, far inside verify's 1e-8."""
    from xbench.contract.work import build_work

    trial = _trial()
    core_hash = build_work(trial.model, trial.samples, trial.seed).weights_hash
    eager, tuned = runs["fp32", program, AS_WRITTEN], runs["fp32", program, CHANNELS_LAST]
    assert eager["info"].weights_hash == tuned["info"].weights_hash == core_hash
    assert eager["info"].precision == tuned["info"].precision
    gradient_error = _error([tuned["loss"], *tuned["gradients"]], [eager["loss"], *eager["gradients"]])
    eager, tuned = runs["fp64", program, AS_WRITTEN]["reference"], runs["fp64", program, CHANNELS_LAST]["reference"]
    float64_error = max(_error([tuned.loss, *tuned.gradients], [eager.loss, *eager.gradients]),
                        _error([np.asarray(tuned.losses), *tuned.replicas[0]],
                               [np.asarray(eager.losses), *eager.replicas[0]]))
    print(f"{program}: fp32 gradients {gradient_error:.2e}, float64 {float64_error:.2e}")
    assert gradient_error <= 1e-4
    assert float64_error <= 1e-10
    assert {g.dtype for g in tuned.gradients} == {np.dtype(np.float64)}


@pytest.mark.slow
def test_compiled_cnn_is_channels_last_compiled_once_and_the_same_work(runs):
    run, eager = runs["fp64", PLAIN, "compile"], runs["fp64", PLAIN, AS_WRITTEN]
    assert run["compiled_module"] == "TrainingLoss"
    assert run["info"].settings["compiled_region"] == "forward and loss"
    # One graph for forward and loss, compiled at the first call; the 10 steps after it, each
    # on another slice of the images, compile nothing more.
    assert run["compiled"] == {"graphs": 1, "frames": 1}, run["compiled"]
    assert all(r["compiled"] == {"graphs": 0, "frames": 0} for key, r in runs.items() if key[2] != "compile")
    compiled, reference = run["reference"], eager["reference"]
    assert run["info"].weights_hash == eager["info"].weights_hash
    assert _error([compiled.loss, *compiled.gradients], [reference.loss, *reference.gradients]) <= 1e-10
    assert _error([np.asarray(compiled.losses), *compiled.replicas[0]],
                  [np.asarray(reference.losses), *reference.replicas[0]]) <= 1e-10


if __name__ == "__main__":
    child_main(_child)
