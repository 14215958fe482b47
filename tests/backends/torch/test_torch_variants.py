"""The torch backend's programs (data-parallel, plain) and variants (compile, cuda-graphs) on
one CPU device: the same fp32 work, the same gradients and trajectory, and the refusals; the
compiled region is the TrainingLoss (forward and loss), compiled once, not again at later steps.
The channels-last variant (and channels-last in the compiled cnn) is in test_torch_tuned.

The real trials run in one child process (this module as a script, `python
tests/test_torch_variants.py JOB.json`), so that torch, its process group and inductor's
state stay out of the pytest process. torch.compile on CPU builds C++ kernels (10-40 s a graph
on a small machine): the child compiles twice, sharing one inductor cache
(XBENCH_COMPILE_CACHE_DIR) so that the second compilation may reuse the first one's kernels.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from tests.support.children import child_main, run_children
from xbench.contract import AS_WRITTEN, COMPILE_CACHE_VARIABLE, DATA_PARALLEL, PLAIN, programs_of, variants_of

CHILD_TIMEOUT_S = 400  # two CPU compilations on a loaded 2-core machine
STEPS = 10
# (program, variant) pairs the child runs, the reference (eager DDP) first.
RUNS = ((DATA_PARALLEL, AS_WRITTEN), (PLAIN, AS_WRITTEN), (PLAIN, "compile"), (DATA_PARALLEL, "compile"))
# torch imports its own torch.jit.script_method when inductor loads; warnings stay errors otherwise.
WARNINGS = ("-W", "error", "-W", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def _trial(**changes):
    from xbench.contract import TimingProtocol, Trial
    from xbench.models.model_spec import PRESETS, ModelSpec

    preset = PRESETS["medium"]
    model = ModelSpec(name="medium", widths=preset["widths"], dropout=0.0, batch_sizes=preset["batch_sizes"])
    trial = Trial(backend="torch", model=model, devices=1, global_batch=32, scaling="strong", precision="fp32",
                  platform="cpu", learning_rate=1e-3, seed=0, samples=320,
                  protocol=TimingProtocol(warmup_steps=0, steps=STEPS, repeats=2))
    return replace(trial, **changes)


# -- what the child process does ----------------------------------------------------------------


def _child() -> dict:
    from xbench.contract import Unsupported
    from xbench.contract.work import build_work
    from xbench_backends.torch.ddp import TorchDdpBackend

    trial = _trial()
    work = build_work(trial.model, trial.samples, trial.seed)
    backend = TorchDdpBackend()
    backend.setup(1, "cpu")
    out: dict = {"refusals": {}, "runs": {}}
    for program in (DATA_PARALLEL, PLAIN):  # first, so that nothing has loaded dynamo yet
        try:
            backend.prepare(replace(trial, program=program, variant="cuda-graphs"), work)
        except Unsupported as err:
            out["refusals"][program] = str(err)
    out["dynamo_loaded_by_refusal"] = "torch._dynamo" in sys.modules
    try:
        backend.prepare(replace(trial, variant="xla"), work)
    except ValueError as err:
        out["unknown_variant"] = str(err)
    for program, variant in RUNS:
        out["runs"][program, variant] = _run(backend, replace(trial, program=program, variant=variant), work)
    return out


def _run(backend, trial, work) -> dict:
    prepared = backend.prepare(trial, work)
    compiled = prepared.forward if prepared.ddp is None else prepared.ddp.module
    before = _compilations()
    start = time.perf_counter()
    loss, gradients = backend.gradients(prepared)  # the first call: compiles, for a compiled variant
    first_s = time.perf_counter() - start
    after_first = _compilations()
    losses = backend.train(prepared, STEPS)  # steps 1 to 10, each on another slice of the data
    return {"info": prepared.info, "forward": type(prepared.forward).__name__, "ddp": prepared.ddp is not None,
            "ddp_module": None if prepared.ddp is None else type(prepared.ddp.module).__name__,
            "compiled_module": type(getattr(compiled, "_orig_mod", compiled)).__name__,
            "first_call_s": first_s, "graphs": after_first["graphs"] - before["graphs"],
            "later": {k: after_first[k] - v for k, v in _compilations().items()},
            "graph_breaks": after_first["graph_breaks"] - before["graph_breaks"],
            "loss": loss, "gradients": gradients, "losses": losses, "weights": backend.replica_weights(prepared)[0]}


def _compilations() -> dict[str, int]:
    """What dynamo has compiled in this process so far (all 0 until it is loaded): graphs,
    frames (a recompilation is one more), graph breaks."""
    if "torch._dynamo" not in sys.modules:
        return {"graphs": 0, "frames": 0, "graph_breaks": 0}
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"], "frames": counters["frames"]["total"],
            "graph_breaks": sum(counters["graph_break"].values())}


# -- the parent ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("torch_variants")
    start = time.monotonic()
    result = run_children(__file__, {"child": {}}, tmp_path, CHILD_TIMEOUT_S, python_flags=WARNINGS,
                          env={COMPILE_CACHE_VARIABLE: str(tmp_path / "cache")})["child"]
    result["wall_s"], result["cache"] = time.monotonic() - start, str(tmp_path / "cache")
    print(f"child: {result['wall_s']:.1f} s; first calls: "
          + ", ".join(f"{p}/{v} {r['first_call_s']:.1f} s" for (p, v), r in result["runs"].items()))
    return result


def _error(actual, expected) -> float:
    from xbench.stats import relative_errors

    return relative_errors(actual, expected)[2]  # normwise relative


# -- fast: no torch ------------------------------------------------------------------------------


def test_programs_and_variants_are_declared():
    from xbench_backends.torch.ddp import TorchDdpBackend

    backend = TorchDdpBackend()
    assert programs_of(backend) == (DATA_PARALLEL, PLAIN)
    variants = variants_of(backend)
    assert list(variants) == ["compile", "cuda-graphs", "channels-last", "fsdp", "fsdp-compile", "remat", "fsdp-remat"]
    assert variants["fsdp-compile"].sharded and variants["fsdp-compile"].families == variants["fsdp"].families
    assert variants["cuda-graphs"].warmup_steps == 3 and variants["compile"].warmup_steps is None
    assert variants["channels-last"].warmup_steps is None


def test_unknown_variant_and_program_are_refused_first():
    """Refused in `prepare` before anything else: here without setup, no torch needed."""
    from xbench_backends.torch.ddp import TorchDdpBackend

    with pytest.raises(ValueError, match="known: as-written, compile, cuda-graphs, channels-last"):
        TorchDdpBackend().prepare(_trial(variant="xla"), None)
    with pytest.raises(ValueError, match="known: data-parallel, plain"):
        TorchDdpBackend().prepare(_trial(program="pipeline"), None)


# -- the child's trials --------------------------------------------------------------------------


@pytest.mark.slow
def test_cuda_graphs_on_cpu_are_unsupported(child):
    for program in (DATA_PARALLEL, PLAIN):
        assert child["refusals"][program] == "CUDA graphs need a CUDA device; this trial runs on CPU"
    assert not child["dynamo_loaded_by_refusal"]  # refused before any compiler work
    assert "known: as-written, compile, cuda-graphs, channels-last" in child["unknown_variant"]


@pytest.mark.slow
def test_plain_program_builds_no_ddp(child):
    runs = child["runs"]
    assert runs[PLAIN, AS_WRITTEN]["forward"] == "TrainingLoss" and not runs[PLAIN, AS_WRITTEN]["ddp"]
    assert runs[PLAIN, "compile"]["forward"] == "OptimizedModule" and not runs[PLAIN, "compile"]["ddp"]
    assert runs[DATA_PARALLEL, AS_WRITTEN]["forward"] == "DistributedDataParallel"
    assert runs[DATA_PARALLEL, AS_WRITTEN]["ddp_module"] == "TrainingLoss"
    assert runs[DATA_PARALLEL, "compile"]["forward"] == "DistributedDataParallel"
    assert runs[DATA_PARALLEL, "compile"]["ddp_module"] == "OptimizedModule"  # DDP around the compiled module
    assert runs[PLAIN, AS_WRITTEN]["info"].notes[0] == "plain: no DDP, no process group in the step"
    assert runs[DATA_PARALLEL, AS_WRITTEN]["info"].notes[0].startswith("DDP over gloo")


@pytest.mark.slow
def test_programs_and_variants_do_the_same_work(child):
    """Same start, gradient and 10-step trajectory as eager DDP, in strict fp32."""
    runs = child["runs"]
    reference = runs[DATA_PARALLEL, AS_WRITTEN]
    for key, run in runs.items():
        assert run["info"].weights_hash == reference["info"].weights_hash
        assert run["info"].precision == reference["info"].precision
        gradient_error = _error([run["loss"], *run["gradients"]], [reference["loss"], *reference["gradients"]])
        training_error = _error([np.asarray(run["losses"]), *run["weights"]],
                                [np.asarray(reference["losses"]), *reference["weights"]])
        print(f"{key}: gradients {gradient_error:.2e}, {STEPS} steps {training_error:.2e}")
        assert gradient_error <= 1e-4 and training_error <= 1e-4, key
        assert len(run["losses"]) == STEPS and run["losses"][-1] < run["losses"][0]


@pytest.mark.slow
def test_compile_variant_compiles_and_says_so(child):
    for program in (DATA_PARALLEL, PLAIN):
        run, eager = child["runs"][program, "compile"], child["runs"][program, AS_WRITTEN]
        assert run["graphs"] >= 1  # something was compiled: not eager behind a compile wrapper
        settings = run["info"].settings
        assert settings["variant"] == "compile" and settings["compile_mode"] == "default"
        assert settings["program"] == program
        assert settings["compile_cache"] == child["cache"]  # the run's shared cache, as the core asked
        assert any(note.startswith(("torch.compile(mode=default)", "DDP(torch.compile(mode=default)"))
                   for note in run["info"].notes)
        assert eager["info"].settings["compile_mode"] is None and eager["info"].settings["compile_cache"] is None
        assert eager["graphs"] == 0
        assert eager["info"].settings["compiled_region"] is None
    assert child["runs"][DATA_PARALLEL, "compile"]["info"].settings["dynamo_optimize_ddp"] is True


@pytest.mark.slow
def test_compiled_region_is_forward_and_loss_compiled_once(child):
    """What torch.compile wraps is the TrainingLoss (the model's forward and its loss), traced
    whole: one graph, no graph break (a break would leave the loss to run eagerly), and the
    later steps, each on another slice of the data, compile nothing more."""
    for program in (DATA_PARALLEL, PLAIN):
        run = child["runs"][program, "compile"]
        assert run["compiled_module"] == "TrainingLoss"
        assert run["info"].settings["compiled_region"] == "forward and loss"
        assert any("TrainingLoss (the nn.Sequential, then its loss)" in note for note in run["info"].notes)
        assert run["graphs"] == 1 and run["graph_breaks"] == 0, run
        assert run["later"] == {"graphs": 0, "frames": 0, "graph_breaks": 0}, run


if __name__ == "__main__":
    child_main(lambda job: _child())
