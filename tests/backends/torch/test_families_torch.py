"""The torch side of model families: the transformer, cnn and lstm built by the torch
backend from the core's canonical arrays.

- Parameter counts from torch's own trainable parameters equal the core's formula for every
  preset (gpt2-small and resnet50 included: built only, never trained), and the weights read
  back in canonical layout are the core's arrays bit for bit (every layout conversion undone).
- A deliberately wrong build per family (GELU in its erf form, LayerNorm eps 1e-3, BatchNorm
  eps 1e-3, an unpadded max pool, LSTM gates i and f swapped in the conversion) is rejected by
  verify's own checks (`xbench.results.checks.run_checks`), while two correct builds agree exactly.
- Two DDP ranks: the lstm (whose frozen second bias DDP must leave alone) gives the 1-rank
  gradient; the cnn (each rank's own BatchNorm statistics) keeps identical replicas.
- float64 ("fp64", verify's precision for the cnn; xbench.results.checks.FLOAT64_TOLERANCES): every
  family runs in float64 throughout (gradients, weights and Adam's state read back float64),
  the weights hash as the core's float32 arrays; ResNet-10's two correct builds agree far below
  1e-8 while BatchNorm eps 1e-3 fails verify's float64 checks; its float64 gradient matches a
  central finite difference of the loss (independent of autograd, and only possible in
  float64); gloo all-reduces float64 gradients over 2 ranks; the compiled variant runs in
  float64 too; and fp32 runs before and after fp64 ones in one process are bit for bit equal.

torch runs in child processes (this module as a script, `python tests/test_families_torch.py
JOB.json`), as in test_torch_ddp: its process group and threads stay out of pytest.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.support.children import child_log, child_main, run_children
from xbench.results.checks import VERIFY_STEPS
from xbench.run.cluster import free_port_block

CHILD_TIMEOUT_S = 400  # a loaded 2-core machine; a hang fails the test instead of blocking CI
# Warnings stay errors in the children, but for the one inductor raises on loading (the float64
# job compiles the mlp): torch imports its own deprecated torch.jit.script_method.
WARNINGS = ("-W", "error", "-W", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
# verify's own step count: the erf GELU shows only in the 10-step check (about 1.7e-4 against
# its 1e-4 tolerance at width 128; its initial gradients differ by 3e-5, under 1e-4).
STEPS = VERIFY_STEPS
BATCH = 8
COUNTED = ("transformer-tiny", "gpt2-small", "resnet18", "resnet50", "lstm-small", "lstm-seed", "medium")

# Small shapes, so that a verification run takes a second on a CPU.
SMALL = {
    # transformer-tiny's width (at width 32 even 10 steps of the erf GELU stay under 1e-4)
    "transformer": ("transformer-tiny", {"context": 16, "vocab": 64}),
    "cnn": ("resnet18", {"depth": 10}),  # ResNet-10 (its preset's 32 x 32, 10 classes): a block of each kind
    "lstm": ("lstm-small", {"hidden": 16, "sequence": 8, "inputs": 4, "outputs": 2}),
}
# name -> (family, {module: {constant: wrong value}}); "correct" and "again" patch nothing.
RUNS = {
    "transformer/correct": ("transformer", {}),
    "transformer/again": ("transformer", {}),
    "transformer/gelu-erf": ("transformer", {"transformer": {"GELU_APPROXIMATE": "none"}}),
    "transformer/layernorm-keras-eps": ("transformer", {"transformer": {"LAYER_NORM_EPSILON": 1e-3}}),
    "cnn/correct": ("cnn", {}),
    "cnn/again": ("cnn", {}),
    "cnn/batchnorm-keras-eps": ("cnn", {"cnn": {"BATCH_NORM_EPSILON": 1e-3}}),
    "cnn/unpadded-max-pool": ("cnn", {"cnn": {"MAX_POOL_PADDING": 0}}),
    "lstm/correct": ("lstm", {}),
    "lstm/again": ("lstm", {}),
    "lstm/gates-i-f-swapped": ("lstm", {"lstm": {"GATE_ORDER": (1, 0, 2, 3)}}),
}


def _model(family: str):
    from xbench.models.model_spec import preset_model

    preset, changes = SMALL[family]
    model = preset_model(preset, batch_sizes=(BATCH,))
    return replace(model, dims=tuple(sorted({**dict(model.dims), **changes}.items())))


# The float64 job's runs in order, name -> (family, patches, precision, variant): fp32 runs
# before and after the fp64 ones show that nothing of fp64 stays in the process.
FLOAT64_RUNS = {
    "cnn/fp32-before": ("cnn", {}, "fp32", "as-written"),
    "mlp/fp32-before": ("mlp", {}, "fp32", "as-written"),
    **{f"{family}/fp64": (family, {}, "fp64", "as-written") for family in ("mlp", "transformer", "lstm")},
    "cnn/correct": ("cnn", {}, "fp64", "as-written"),
    "cnn/again": ("cnn", {}, "fp64", "as-written"),
    "cnn/batchnorm-keras-eps": ("cnn", {"cnn": {"BATCH_NORM_EPSILON": 1e-3}}, "fp64", "as-written"),
    "mlp/fp64-compiled": ("mlp", {}, "fp64", "compile"),
    "cnn/fp32-after": ("cnn", {}, "fp32", "as-written"),
    "mlp/fp32-after": ("mlp", {}, "fp32", "as-written"),
}


def _model(family: str):
    from xbench.models.model_spec import preset_model

    if family == "mlp":
        return replace(preset_model("medium", batch_sizes=(BATCH,)), dropout=0.0)
    preset, changes = SMALL[family]
    model = preset_model(preset, batch_sizes=(BATCH,))
    return replace(model, dims=tuple(sorted({**dict(model.dims), **changes}.items())))


def _trial(family: str, devices: int = 1, precision: str = "fp32", variant: str = "as-written"):
    from xbench.contract import Trial
    from xbench.contract.timing import TimingProtocol

    return Trial(backend="torch", model=_model(family), devices=devices, global_batch=BATCH, scaling="strong",
                 precision=precision, platform="cpu", learning_rate=1e-3, seed=0, samples=BATCH * STEPS,
                 protocol=TimingProtocol(warmup_steps=0, steps=STEPS, repeats=1), variant=variant)


# -- what each child process does --------------------------------------------------------------


def _child(job: dict) -> dict:
    from xbench.contract import Process
    from xbench_backends.torch.ddp import TorchDdpBackend

    backend = TorchDdpBackend()
    if job["world"] == 1:
        backend.setup(1, "cpu")
    else:
        backend.setup_process(Process(rank=job["rank"], world_size=job["world"], local_rank=job["rank"],
                                      local_world_size=job["world"], node_rank=0, nnodes=1,
                                      coordinator=f"127.0.0.1:{job['port']}", hosts=("127.0.0.1",)), "cpu")
    if job["kind"] == "counts":
        return _counts()
    if job["kind"] == "float64":
        found = {name: _verification_run(backend, family, patches, 1, precision, variant)
                 for name, (family, patches, precision, variant) in FLOAT64_RUNS.items()}
        return {**found, "finite-difference": _finite_difference(backend, "cnn")}
    if job["kind"] == "verify":
        return {name: _verification_run(backend, family, patches, job["world"])
                for name, (family, patches) in ((name, RUNS[name]) for name in job["runs"])}
    return {f"{family}/ranks" + ("" if precision == "fp32" else f"-{precision}"):
            _verification_run(backend, family, {}, job["world"], precision)
            for family, precision in job["families"]}


def _counts() -> dict:
    """Per preset: torch's trainable count, the core's, and whether the canonical readback is
    the core's arrays exactly; built on the CPU, never trained."""
    import torch

    from xbench.contract.work import build_work
    from xbench.models.model_spec import preset_model
    from xbench_backends.torch import families

    out = {}
    for preset in COUNTED:
        work = build_work(preset_model(preset, batch_sizes=(1,)), 1, seed=0)
        built = families.build(work, torch.device("cpu"))
        readback = [t.cpu().numpy() for t in built.canonical(False)]
        out[preset] = {"torch": sum(p.numel() for p in built.trainable), "core": work.params,
                       "all": sum(p.numel() for p in built.model.parameters()),
                       "exact": all(np.array_equal(a, b) and a.shape == b.shape
                                    for a, b in zip(readback, work.arrays, strict=True))}
        del built, work
    return out


def _verification_run(backend, family: str, patches: dict, world: int, precision: str = "fp32",
                      variant: str = "as-written"):
    """`xbench.results.checks.reference_run` of the family's small model with the module constants in
    `patches` set (restored afterwards), what prepare reported, and the dtypes torch holds:
    of every floating parameter and buffer, and of Adam's state after the steps."""
    import importlib

    from xbench.contract.work import build_work
    from xbench.worker.capture import reference_run

    trial = _trial(family, world, precision, variant)
    saved = []
    try:
        for module_name, constants in patches.items():
            module = importlib.import_module(f"xbench_backends.torch.{module_name}")
            for name, value in constants.items():
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, value)
        prepared = backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
        reference = reference_run(backend, prepared, STEPS)
        module = prepared.forward
        held = {str(t.dtype) for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()}
        adam = {str(v.dtype) for state in prepared.optimizer.state.values() for k, v in state.items() if k != "step"}
        return {"info": prepared.info, "reference": reference, "held": held, "adam": adam,
                "inputs": str(prepared.xs.dtype), "targets": str(prepared.ys.dtype)}
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def _finite_difference(backend, family: str) -> dict:
    """The fp64 gradient's derivative along a random direction v (N(0, 1) per weight), g . v,
    against a central difference of the loss, (L(w + h v) - L(w - h v)) / 2h: autograd checked
    by arithmetic it does not use. h must be tiny, as the loss is only piecewise smooth: a
    step that moves an activation across a ReLU kink (or switches a max pool) spoils the
    difference (measured: 4 % off at h = 1e-5, 0.6 % at 1e-7, 3e-9 at 1e-8, 2e-7 at 1e-9,
    the rounding u L / h taking over). So small an h is only possible in float64: in float32
    the rounding alone (6e-8 * 5 / 1e-8) would be a quarter of the derivative."""
    import torch

    from xbench.contract.work import build_work
    from xbench_backends.torch.ddp import _forward_backward

    trial = _trial(family, 1, "fp64")
    if family == "cnn":  # resnet18, which the h below were measured on (eager: no compilation to save)
        from xbench.models.model_spec import preset_model

        trial = replace(trial, model=preset_model("resnet18", batch_sizes=(BATCH,)))
    prepared = backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
    params = [p for p in prepared.forward.parameters() if p.requires_grad]
    _forward_backward(prepared)
    generator = torch.Generator().manual_seed(0)
    directions = [torch.randn(p.shape, generator=generator, dtype=p.dtype) for p in params]
    derivative = sum(float((p.grad * v).sum()) for p, v in zip(params, directions))

    def loss_at(step: float) -> float:
        with torch.no_grad():
            for p, v in zip(params, directions):
                p.add_(v, alpha=step)
            loss = float(prepared.forward(prepared.xs[0], prepared.ys[0]))
            for p, v in zip(params, directions):
                p.sub_(v, alpha=step)
        return loss

    differences = {h: (loss_at(h) - loss_at(-h)) / (2 * h) for h in (1e-8, 1e-9)}
    return {"derivative": derivative, "differences": differences,
            "grad_dtypes": {str(p.grad.dtype) for p in params}}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("families_torch")
    port = free_port_block(1)
    jobs = {
        "counts": {"kind": "counts", "world": 1},
        "verify": {"kind": "verify", "world": 1, "runs": list(RUNS)},
        "float64": {"kind": "float64", "world": 1},
        **{f"rank{r}": {"kind": "ranks", "world": 2, "rank": r, "port": port, "gang": "ranks",
                        "families": [["lstm", "fp32"], ["cnn", "fp32"], ["lstm", "fp64"], ["cnn", "fp64"]]}
           for r in (0, 1)},
    }
    # Keep an overlay on PYTHONPATH (a working tree run without reinstalling), then the checkout.
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    found = run_children(__file__, jobs, tmp_path, CHILD_TIMEOUT_S, env={"PYTHONPATH": path}, python_flags=WARNINGS)
    for name in jobs:
        print(name, child_log(tmp_path, name))  # shown by pytest only on failure
    return found


def _checks(runs: dict, family: str, tested: str, float64: bool = False):
    """verify's checks of run `family/tested` against `family/correct` as the reference (with
    FLOAT64_TOLERANCES where `float64`)."""
    from xbench.results.checks import run_checks

    refs = {("torch", 1, family): runs[f"{family}/correct"]["reference"],
            (f"torch-{tested}", 1, family): runs[f"{family}/{tested}"]["reference"]}
    checks = run_checks(refs, "torch", float64={family} if float64 else ())
    return [c for c in checks if f"torch-{tested}" in c.backends]


# -- fast: no torch ------------------------------------------------------------------------------


def test_backend_declares_the_families_it_builds():
    from xbench_backends.torch.ddp import TorchDdpBackend

    assert TorchDdpBackend.families == ("mlp", "transformer", "cnn", "lstm")


def test_lstm_gate_reordering_round_trips():
    """The conversion helper's inverse undoes any gate order (i <-> f included)."""
    from xbench_backends.torch.lstm import _inverse

    for order in ((0, 1, 2, 3), (1, 0, 2, 3), (3, 1, 0, 2)):
        inverse = _inverse(order)
        assert tuple(order[g] for g in inverse) == (0, 1, 2, 3)


# -- real builds and trials (child processes) ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("preset", COUNTED)
def test_parameter_counts_and_canonical_readback(results, preset):
    """torch's own trainable parameters = the core's count (the tied head counted once, the
    LSTM's frozen second bias not at all); the readback is the core's arrays exactly."""
    found = results["counts"][preset]
    assert found["torch"] == found["core"], found
    assert found["exact"]
    if preset.startswith("lstm"):
        from xbench.models.model_spec import preset_model

        dims = preset_model(preset).shape
        assert found["all"] - found["torch"] == dims["layers"] * 4 * dims["hidden"]  # the frozen bias_hh
    else:
        assert found["all"] == found["torch"]


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(SMALL))
def test_two_correct_builds_agree(results, family):
    checks = _checks(results["verify"], family, "again")
    assert checks and all(c.passed for c in checks)
    assert all(c.norm_rel == 0.0 for c in checks)  # the same program on the same data: bit for bit
    from xbench.contract.work import build_work

    info = results["verify"][f"{family}/correct"]["info"]
    trial = _trial(family)
    work = build_work(trial.model, trial.samples, trial.seed)
    assert info.params == work.params and info.weights_hash == work.weights_hash


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in RUNS if not n.endswith(("/correct", "/again"))])
def test_a_wrong_build_fails_verify(results, name):
    from xbench.results.checks import TOLERANCES

    family, tested = name.split("/")
    checks = _checks(results["verify"], family, tested)
    failed = [c for c in checks if not c.passed]
    worst = max(c.norm_rel for c in checks)
    print(f"{name}: worst normwise error {worst:.2e}")
    assert failed, f"{name} passed every check (worst {worst:.2e})"
    assert worst > max(TOLERANCES["gradients"], TOLERANCES["training"])


@pytest.mark.slow
def test_notes_name_the_kernels(results):
    runs = results["verify"]
    attention = [n for n in runs["transformer/correct"]["info"].notes if n.startswith("attention:")]
    assert attention and "scaled_dot_product_attention" in attention[0] and "float32 on cpu" in attention[0]
    assert any(n.startswith("nn.LSTM: aten's native CPU LSTM") for n in runs["lstm/correct"]["info"].notes)
    assert any(n.startswith("BatchNorm2d(eps=1e-05, momentum=0.1)") for n in runs["cnn/correct"]["info"].notes)
    assert runs["cnn/correct"]["info"].precision["cudnn_allow_tf32"] is False


@pytest.mark.slow
def test_two_ranks_with_a_frozen_bias_give_the_one_rank_gradient(results):
    """DDP leaves the LSTM's frozen bias_hh out and averages the rest: 2 ranks x 4 rows give
    the gradient of 1 rank x 8 rows, and the replicas stay identical."""
    from xbench.stats import relative_errors

    one = results["verify"]["lstm/correct"]["reference"]
    for rank in ("rank0", "rank1"):
        ref = results[rank]["lstm/ranks"]["reference"]
        assert relative_errors([ref.loss, *ref.gradients], [one.loss, *one.gradients])[2] <= 1e-5
        assert ref.replica_count == 2 and ref.worst_replica_error()[2] == 0.0
        assert results[rank]["lstm/ranks"]["info"].params == results["verify"]["lstm/correct"]["info"].params


@pytest.mark.slow
def test_two_ranks_with_their_own_batch_statistics_keep_identical_replicas(results):
    """Each rank normalises with its own 4 images (so the loss differs from 1 rank's), yet the
    all-reduced gradient keeps the replicas equal."""
    one = results["verify"]["cnn/correct"]["reference"]
    for rank in ("rank0", "rank1"):
        ref = results[rank]["cnn/ranks"]["reference"]
        assert ref.replica_count == 2 and ref.worst_replica_error()[2] == 0.0
        assert np.isfinite(ref.loss) and ref.loss != one.loss
    assert results["rank0"]["cnn/ranks"]["reference"].losses == results["rank1"]["cnn/ranks"]["reference"].losses


# -- float64 (verify's precision for the cnn) ----------------------------------------------------


def _worst(checks) -> float:
    return max(c.norm_rel for c in checks)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, run in FLOAT64_RUNS.items() if run[2] == "fp64"])
def test_float64_runs_in_float64_throughout(results, name):
    """Parameters, buffers (BatchNorm's statistics), float inputs and targets, Adam's state,
    the gradients and weights read back: float64; the weights hash as the core's."""
    from xbench.contract.work import build_work

    run = results["float64"][name]
    family = name.split("/")[0]
    ref, info = run["reference"], run["info"]
    assert run["held"] == run["adam"] == {"torch.float64"}
    assert {g.dtype for g in ref.gradients} == {w.dtype for w in ref.replicas[0]} == {np.dtype(np.float64)}
    assert info.precision["param_dtype"] == info.precision["loss_dtype"] == "float64"
    assert info.precision["autocast_dtype"] is None and info.precision["cudnn_allow_tf32"] is False
    assert run["inputs"] == ("torch.int64" if family == "transformer" else "torch.float64")
    assert run["targets"] == ("torch.float64" if family in ("mlp", "lstm") else "torch.int64")
    trial = _trial(family, precision="fp64")
    work = build_work(trial.model, trial.samples, trial.seed)
    assert info.params == work.params and info.weights_hash == work.weights_hash
    assert all(np.isfinite(ref.losses))


@pytest.mark.slow
def test_float64_resnet_two_correct_builds_agree_far_below_the_tolerance(results):
    from xbench.results.checks import FLOAT64_TOLERANCES

    checks = _checks(results["float64"], "cnn", "again", float64=True)
    assert checks and all(c.passed for c in checks)
    assert all(c.tolerance == FLOAT64_TOLERANCES[kind] for c, kind in zip(checks, ("gradients", "training")))
    assert _worst(checks) <= 1e-12  # in fact bit for bit: the same program on the same data


@pytest.mark.slow
def test_float64_resnet_with_a_keras_batchnorm_epsilon_fails_verify(results):
    checks = _checks(results["float64"], "cnn", "batchnorm-keras-eps", float64=True)
    print(f"cnn fp64 batchnorm eps 1e-3: worst normwise error {_worst(checks):.2e}")
    assert checks and not any(c.passed for c in checks)
    assert _worst(checks) > 1e3 * 1e-8  # by orders of magnitude


@pytest.mark.slow
def test_float64_resnet_gradient_matches_a_finite_difference(results):
    """Central differences at h = 1e-8 and 1e-9 agree with autograd's g . v to within 1e-6
    relative (measured 3e-9 and 2e-7), where a float32 computation anywhere would show."""
    found = results["float64"]["finite-difference"]
    assert found["grad_dtypes"] == {"torch.float64"}
    derivative = found["derivative"]
    for h, difference in found["differences"].items():
        print(f"h={h:g}: g.v={derivative:.15e} difference={difference:.15e}")
        assert abs(difference - derivative) <= 1e-6 * abs(derivative), (h, difference, derivative)


@pytest.mark.slow
def test_float64_is_near_float32_and_leaves_float32_runs_unchanged(results):
    """fp32 runs before and after the fp64 ones in one process are bit for bit equal (no
    process-global state left behind), and the mlp's fp64 gradient is within fp32 rounding of
    its fp32 gradient (the same model, only the precision differs)."""
    from xbench.stats import relative_errors

    runs = results["float64"]
    for family in ("cnn", "mlp"):
        before, after = runs[f"{family}/fp32-before"], runs[f"{family}/fp32-after"]
        assert before["held"] == {"torch.float32"} and before["info"].precision == after["info"].precision
        b, a = before["reference"], after["reference"]
        assert relative_errors([b.loss, *b.gradients], [a.loss, *a.gradients])[2] == 0.0
        assert b.losses == a.losses and relative_errors(b.replicas[0], a.replicas[0])[2] == 0.0
    fp32, fp64 = runs["mlp/fp32-before"]["reference"], runs["mlp/fp64"]["reference"]
    assert 0.0 < relative_errors([fp32.loss, *fp32.gradients], [fp64.loss, *fp64.gradients])[2] <= 1e-5


@pytest.mark.slow
def test_float64_compiled_variant_matches_eager(results):
    from xbench.stats import relative_errors

    runs = results["float64"]
    compiled, eager = runs["mlp/fp64-compiled"]["reference"], runs["mlp/fp64"]["reference"]
    assert runs["mlp/fp64-compiled"]["info"].settings["compile_mode"] == "default"
    assert relative_errors([compiled.loss, *compiled.gradients], [eager.loss, *eager.gradients])[2] <= 1e-12
    assert relative_errors([np.asarray(compiled.losses), *compiled.replicas[0]],
                  [np.asarray(eager.losses), *eager.replicas[0]])[2] <= 1e-12


@pytest.mark.slow
def test_float64_over_two_ranks(results):
    """gloo all-reduces the float64 gradients: the lstm's 2 ranks x 4 rows give the 1-rank
    float64 gradient to float64 rounding, and the cnn's replicas stay identical (verify's
    float64 replicas tolerance is 1e-12)."""
    from xbench.results.checks import FLOAT64_TOLERANCES
    from xbench.stats import relative_errors

    one = results["float64"]["lstm/fp64"]["reference"]
    for rank in ("rank0", "rank1"):
        lstm, cnn = results[rank]["lstm/ranks-fp64"], results[rank]["cnn/ranks-fp64"]
        assert lstm["held"] == cnn["held"] == {"torch.float64"}
        assert {g.dtype for g in (*lstm["reference"].gradients, *cnn["reference"].gradients)} == {np.dtype(np.float64)}
        ref = lstm["reference"]
        assert relative_errors([ref.loss, *ref.gradients], [one.loss, *one.gradients])[2] <= 1e-13
        for run in (lstm, cnn):
            assert run["reference"].replica_count == 2
            assert run["reference"].worst_replica_error()[2] <= FLOAT64_TOLERANCES["replicas"]


if __name__ == "__main__":
    child_main(_child)
