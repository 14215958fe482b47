"""The jax backends' model families (transformer, cnn, lstm), in-process on
simulated CPU devices, as Flax NNX modules (as written) and in plain jax.numpy (the `jnp`
variant): parameter counts from the framework's own variables, readback of the
core's weights bit for bit, verification against deliberately wrong builds (which the real
check code must reject), per-device BatchNorm statistics, the fused variant, and bf16."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from xbench.contract import AS_WRITTEN, DATA_PARALLEL, PLAIN, Trial
from xbench.contract.timing import TimingProtocol
from xbench.contract.work import build_work
from xbench.models import presets
from xbench.models.model_spec import ModelSpec, preset_model
from xbench.results.checks import (
    FLOAT64_TOLERANCES,
    TOLERANCES,
    VERIFY_STEPS,
    run_checks,
    verification_batch,
    verification_model,
    verification_precision,
)
from xbench.worker.capture import reference_run

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

from tests.backends.jax.cpu_devices import DEVICES, simulated_devices  # noqa: E402
from xbench_backends.jax import cnn, lstm, nnx_cnn, nnx_lstm, nnx_transformer, transformer  # noqa: E402
from xbench_backends.jax.pmap import JaxPmapBackend  # noqa: E402
from xbench_backends.jax.shardmap import JaxAutoBackend, JaxShardMapBackend  # noqa: E402

BATCH = 8
STEPS = 2
VERIFY_BATCH = verification_batch([1])  # as `xbench verify` on 1 device


def tiny(family: str, **dims: int) -> ModelSpec:
    return ModelSpec(name=f"{family}-test", family=family, dims=tuple(sorted(dims.items())), batch_sizes=(BATCH,))


# Small enough to compile and step in a second or two on a CPU.
TINY = {
    "transformer": tiny("transformer", layers=1, heads=2, width=32, context=16, vocab=64),
    "cnn": tiny("cnn", depth=10, image=32, channels=3, classes=10),  # a block of each kind, no more
    "lstm": tiny("lstm", layers=2, hidden=16, sequence=8, inputs=4, outputs=2),
}

# Each a builder constant set to a classic slip: every one must fail verification, on the
# model and by the check named. The GELU variants differ by at most 5e-4 per activation, and
# GPT-2's small initial weights keep pre-activations near 0, where they differ far less: at
# initialisation the gradients of transformer-tiny differ by only 6e-6 (within tolerance),
# and only verify's ten training steps take the difference past it (1.4e-4 against 1e-4).
GRADIENTS, TRAINING = "initial loss and gradients across backends", "10 steps: losses and final weights"
SLOW = pytest.mark.slow  # over ~10 s on a shared 2-core CPU
JNP = "jnp"


LSTM_PATHS = nnx_lstm.paths


def swapped_lstm_paths(dims):
    """Layer 1's kernel and recurrent kernel exchanged (both [hidden, 4 hidden] there)."""
    found = LSTM_PATHS(dims)
    found[3], found[4] = found[4], found[3]
    return found


# (model, variant, module, constant, wrong value, the check that must catch it)
WRONG_BUILDS = [
    pytest.param("transformer-tiny", AS_WRITTEN, nnx_transformer, "GELU_APPROXIMATE", False, TRAINING,
                 id="nnx-transformer-gelu-erf", marks=SLOW),
    pytest.param("transformer", AS_WRITTEN, nnx_transformer, "LAYER_NORM_EPSILON", 1e-3, GRADIENTS,
                 id="nnx-transformer-layernorm-eps-keras"),
    pytest.param("cnn", AS_WRITTEN, nnx_cnn, "EXPLICIT_PADDING", False, GRADIENTS, id="nnx-cnn-same-padding",
                 marks=SLOW),
    # (Keras's BatchNorm epsilon in the ResNet: test_fp64_resnet_builds_agree_and_a_wrong_one_fails)
    pytest.param("lstm", AS_WRITTEN, nnx_lstm, "paths", swapped_lstm_paths, GRADIENTS,
                 id="nnx-lstm-kernel-recurrent-swapped"),
    pytest.param("transformer", JNP, transformer, "LAYER_NORM_EPSILON", 1e-3, GRADIENTS,
                 id="jnp-transformer-layernorm-eps-keras"),
    pytest.param("cnn", JNP, cnn, "EXPLICIT_PADDING", False, GRADIENTS, id="jnp-cnn-same-padding", marks=SLOW),
    pytest.param("lstm", JNP, lstm, "GATE_ORDER", ("f", "i", "g", "o"), GRADIENTS, id="jnp-lstm-gates-i-f-swapped"),
]


@pytest.fixture(scope="module")
def backends():
    """One instance of each jax backend on 2 simulated CPU devices (jax fixes its device
    count at its first operation, so this must come first in the process)."""
    devices = simulated_devices(DEVICES)
    made = {}
    for cls in (JaxPmapBackend, JaxShardMapBackend, JaxAutoBackend):
        made[cls.name] = backend = cls()
        backend.devices = list(devices)  # setup may run once per process
    return made


def trial(model: ModelSpec, backend: str = "jax", devices: int = 1, program: str = DATA_PARALLEL,
          precision: str = "fp32", steps_per_call: int = 1, batch: int = BATCH, steps: int = STEPS,
          variant: str = AS_WRITTEN) -> Trial:
    protocol = TimingProtocol(warmup_steps=0, steps=steps, repeats=1, steps_per_call=steps_per_call,
                              trial_timeout_s=600)
    return Trial(backend=backend, model=replace(model, batch_sizes=(batch,)), devices=devices, global_batch=batch,
                 scaling="strong", precision=precision, platform="cpu", learning_rate=1e-3, seed=0,
                 samples=batch * steps, protocol=protocol, options={}, launcher="subprocess", variant=variant,
                 program=program)


@pytest.fixture
def on_devices(backends):
    """Sets a backend's device count for one run, restoring all of them afterwards."""
    saved = {name: list(b.devices) for name, b in backends.items()}

    def use(name: str, devices: int):
        backends[name].devices = saved[name][:devices]
        return backends[name]

    yield use
    for name, b in backends.items():
        b.devices = saved[name]


def reference(on_devices, model: ModelSpec, backend: str = "jax", devices: int = 1, **kwargs):
    """The verification result (gradients, the trial's steps, replicas) of one build."""
    chosen = on_devices(backend, devices)
    t = trial(model, backend, devices, **kwargs)
    return reference_run(chosen, chosen.prepare(t, build_work(model, t.samples, t.seed)), t.protocol.steps)


_CORRECT: dict = {}


def correct_reference(on_devices, model: ModelSpec, backend: str = "jax", devices: int = 1, **kwargs):
    """`reference` of a correct build, made once per module: many tests compare against the
    same ones (call it before any monkeypatch of a builder, never after)."""
    key = repr(trial(model, backend, devices, **kwargs))  # defaults spelled out: one key per program
    if key not in _CORRECT:
        _CORRECT[key] = reference(on_devices, model, backend, devices, **kwargs)
    return _CORRECT[key]


# -- parameters: counted by jax, read back bit for bit ------------------------------------


@pytest.mark.parametrize("variant", [AS_WRITTEN, JNP])
@pytest.mark.parametrize("preset", ["transformer-tiny", "resnet18", "lstm-small", "lstm-seed"])
def test_params_counted_by_jax_equal_the_core_formula(on_devices, preset, variant):
    model = preset_model(preset, batch_sizes=(BATCH,))
    backend = on_devices("jax", 1)
    t = trial(model, program=PLAIN, variant=variant)
    work = build_work(model, t.samples, t.seed)
    info = backend.prepare(t, work).info
    assert info.params == model.params == work.params
    assert info.weights_hash == work.weights_hash


@pytest.mark.parametrize("preset", ["gpt2-small", "resnet50"])  # builds in about 5 s
def test_params_of_the_large_presets(on_devices, preset):
    model = preset_model(preset, batch_sizes=(BATCH,))
    t = trial(model, program=PLAIN)
    work = build_work(model, BATCH, t.seed)
    info = on_devices("jax", 1).prepare(t, work).info
    assert info.params == model.params == {"gpt2-small": 124_475_904, "resnet50": 25_557_032}[preset]
    assert info.weights_hash == work.weights_hash


@pytest.mark.parametrize("variant", [AS_WRITTEN, JNP])
@pytest.mark.parametrize("backend", ["jax", "jax-shardmap", "jax-auto"])
@pytest.mark.parametrize("family", list(TINY))
def test_readback_on_every_device_is_the_core_weights(on_devices, backend, family, variant):
    """Every device holds the core's weights, value for value, in canonical order."""
    model = TINY[family]
    t = trial(model, backend, DEVICES, variant=variant)
    work = build_work(model, t.samples, t.seed)
    chosen = on_devices(backend, DEVICES)
    prepared = chosen.prepare(t, work)
    assert prepared.info.weights_hash == work.weights_hash
    for replica in chosen.replica_weights(prepared):
        assert [a.shape for a in replica] == [p.shape for p in work.parameters]
        assert all(np.array_equal(a, b) for a, b in zip(replica, work.arrays))


def test_backends_declare_the_families():
    for cls in (JaxPmapBackend, JaxShardMapBackend, JaxAutoBackend):
        assert cls.families == ("mlp", "transformer", "cnn", "lstm")


# -- verification: correct builds agree, wrong ones are caught ----------------------------


@pytest.mark.parametrize("model, variant, module, constant, wrong, caught_by", WRONG_BUILDS)
def test_wrong_build_fails_verification(on_devices, monkeypatch, model, variant, module, constant, wrong, caught_by):
    """Two correct builds (the data-parallel and the plain program) agree; the wrong one
    fails the real checks. A preset name runs as `xbench verify` does (its batch, ten steps);
    the ResNet in float64, verify's precision for it (the correct builds' float64 runs are
    mostly test_nnx_and_jnp_models_agree's)."""
    full = model in presets()
    spec = preset_model(model, batch_sizes=(VERIFY_BATCH,)) if full else TINY[model]
    float64 = verification_precision(spec) == "fp64"
    sizes: dict = dict(batch=VERIFY_BATCH, steps=VERIFY_STEPS) if full else {}
    sizes["variant"] = variant
    if float64:
        sizes["precision"] = "fp64"
    refs = {("jax", 1, spec.name): correct_reference(on_devices, spec, **sizes),
            ("jax-plain", 1, spec.name): correct_reference(on_devices, spec, program=PLAIN, **sizes)}
    monkeypatch.setattr(module, constant, wrong)
    refs[("jax-wrong", 1, spec.name)] = reference(on_devices, spec, program=PLAIN, **sizes)
    checks = run_checks(refs, "jax", float64={spec.name} if float64 else ())
    correct = [c for c in checks if c.backends[0] == "jax-plain"]
    assert correct and all(c.passed for c in correct), correct
    caught = next(c for c in checks if c.backends[0] == "jax-wrong" and c.check == caught_by)
    tolerances = FLOAT64_TOLERANCES if float64 else TOLERANCES
    assert caught.norm_rel > tolerances["gradients" if caught_by == GRADIENTS else "training"], caught


@pytest.mark.parametrize("backend", ["jax-shardmap", "jax-auto"])
@pytest.mark.parametrize("family", [pytest.param("transformer", marks=SLOW), "lstm"])
def test_data_parallel_programs_agree(on_devices, backend, family):
    model = TINY[family]
    refs = {("jax", 1, model.name): correct_reference(on_devices, model),
            (backend, 1, model.name): reference(on_devices, model, backend),
            (backend, DEVICES, model.name): reference(on_devices, model, backend, DEVICES)}
    checks = run_checks(refs, "jax")
    assert len(checks) == 5 and all(c.passed for c in checks), [c for c in checks if not c.passed]


@pytest.mark.parametrize("family", ["transformer", pytest.param("cnn", marks=SLOW), "lstm"])
def test_fused_steps_match_single_steps(on_devices, family):
    model = TINY[family]
    single = correct_reference(on_devices, model, devices=DEVICES)
    fused = reference(on_devices, model, devices=DEVICES, steps_per_call=STEPS)
    checks = run_checks({("jax", 1, "m"): single, ("jax-fused", 1, "m"): fused}, "jax")
    if family != "cnn":
        assert all(c.passed for c in checks), checks
        return
    # The ResNet's ReLUs make its gradient jump where a unit's input crosses 0: the 1e-7
    # rounding of another compilation flips one (the 1 x 1 last stage of a 32-pixel image
    # holds units within 1e-7 of 0) and the next step's gradient moves by ~1e-2. So the fused
    # program is held to the same start and the same losses, not to 1e-4 final weights.
    assert next(c for c in checks if c.check == GRADIENTS).norm_rel == 0.0
    assert np.allclose(fused.losses, single.losses, rtol=1e-4, atol=0)


@pytest.mark.parametrize("family", list(TINY))
def test_bf16_trains_with_float32_master_weights(on_devices, family):
    model = TINY[family]
    backend = on_devices("jax", 1)
    t = trial(model, precision="bf16", program=PLAIN)
    prepared = backend.prepare(t, build_work(model, t.samples, t.seed))
    assert prepared.info.precision["compute_dtype"] == "bfloat16"
    losses = backend.train(prepared, STEPS)
    assert len(losses) == STEPS and np.all(np.isfinite(losses))
    assert {str(w.dtype) for w in backend.replica_weights(prepared)[0]} == {"float32"}


@pytest.mark.parametrize("variant", [AS_WRITTEN, JNP])
def test_notes_name_the_kernels(on_devices, variant):
    backend = on_devices("jax", 1)
    notes = {family: backend.prepare(trial(model, variant=variant), build_work(model, BATCH * STEPS, 0)).info.notes
             for family, model in TINY.items()}
    assert any("dot_product_attention" in n and "XLA" in n for n in notes["transformer"])
    assert any("no cuDNN LSTM" in n for n in notes["lstm"])
    if variant == JNP:
        assert any("running averages not kept" in n for n in notes["cnn"])
    else:
        assert any("nnx.BatchNorm" in n for n in notes["cnn"])
        assert any("Flax NNX model merged inside the step" in n for n in notes["transformer"])


@pytest.mark.parametrize("variant", [AS_WRITTEN, JNP, "functional"])
def test_a_step_of_each_family_compiles_once(on_devices, variant):
    """Nothing pathological: the timed step compiles on its first call and never again (a
    shape or dtype that changed between calls would recompile every step; for NNX's nnx.jit,
    a graph that changed between calls would too)."""
    backend = on_devices("jax", 1)
    for model in TINY.values():
        t = trial(model, program=PLAIN, variant=variant)
        prepared = backend.prepare(t, build_work(model, t.samples, t.seed))
        backend.run(prepared, 1)  # compiles
        backend.run(prepared, STEPS)
        step = prepared.step.jitted_fn if variant == AS_WRITTEN else prepared.step
        assert step._cache_size() == 1, model.family


def test_nnx_jit_program_keeps_batchnorm_running_averages(on_devices):
    """As NNX users write it, the nnx.jit step updates BatchNorm's running statistics in the
    module (the functional programs drop them: nothing reads them)."""
    from flax import nnx

    model = TINY["cnn"]
    backend = on_devices("jax", 1)
    t = trial(model, program=PLAIN)
    prepared = backend.prepare(t, build_work(model, t.samples, t.seed))
    before = [np.asarray(a).copy() for a in jax_leaves(nnx.state(prepared.model, nnx.BatchStat))]
    backend.run(prepared, 1)
    after = [np.asarray(a) for a in jax_leaves(nnx.state(prepared.model, nnx.BatchStat))]
    assert before and not all(np.array_equal(a, b) for a, b in zip(before, after))


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


@pytest.mark.parametrize("family", list(TINY))
def test_nnx_and_jnp_models_agree(on_devices, family):
    """The Flax NNX model and the plain jax.numpy one are the same model: their initial
    gradients and ten steps agree within verify's tolerances (the ResNet's in float64, as
    verify runs it: in fp32 its ReLU kinks amplify rounding past 1e-4 in a few steps)."""
    model = TINY[family]
    float64 = verification_precision(model) == "fp64"
    sizes = dict(precision="fp64") if float64 else {}
    refs = {("jax", 1, model.name): correct_reference(on_devices, model, **sizes),
            ("jax+jnp", 1, model.name): correct_reference(on_devices, model, variant=JNP, **sizes),
            ("jax plain", 1, model.name): correct_reference(on_devices, model, program=PLAIN, **sizes)}
    checks = run_checks(refs, "jax", float64={model.name} if float64 else ())
    assert len(checks) == 4 and all(c.passed for c in checks), [c for c in checks if not c.passed]


def test_cudnn_variant_is_unsupported_where_cudnn_cannot_run(on_devices):
    from xbench.contract import Unsupported

    backend = on_devices("jax", 1)
    for variant, program in (("cudnn", PLAIN), ("fsdp-cudnn", DATA_PARALLEL)):
        for family, needle in (("transformer", "needs an NVIDIA GPU"), ("cnn", "has no attention")):
            t = trial(TINY[family], program=program, precision="bf16", variant=variant)
            with pytest.raises(Unsupported, match=needle):
                backend.prepare(t, build_work(t.model, t.samples, t.seed))


def test_functional_variant_is_the_plain_programs(on_devices):
    from xbench.contract import Unsupported

    t = trial(TINY["lstm"], devices=DEVICES, variant="functional")
    with pytest.raises(Unsupported, match="functional as written"):
        on_devices("jax", DEVICES).prepare(t, build_work(t.model, t.samples, t.seed))
    assert "functional" not in {v.name for v in JaxShardMapBackend.variants}


# -- float64 ("fp64", verify's precision for the ResNet) ----------------------------------

FP64_CNN = replace(TINY["cnn"], batch_sizes=(8,))  # verify's 8 images at 32 x 32
FP64_SIZES = dict(precision="fp64", batch=8, steps=VERIFY_STEPS)


def fp64_model(model: ModelSpec) -> ModelSpec:
    """The ResNet as verify runs it (`verification_model`)."""
    return verification_model(model, [1])


def float64_all(ref) -> bool:
    return all(a.dtype == np.float64 for a in [*ref.gradients, *ref.replicas[0]])


@pytest.mark.slow
def test_fp64_resnet_builds_agree_and_a_wrong_one_fails(on_devices, monkeypatch):
    """ResNet-10 (32 x 32, 8 images) in float64: the data-parallel and the plain program agree
    far below verify's 1e-8; BatchNorm epsilon 1e-3 fails at verify's float64 tolerances;
    gradients and weights read back float64, hashed as the core's float32 weights."""
    model = fp64_model(FP64_CNN)
    backend = on_devices("jax", 1)
    t = trial(model, **FP64_SIZES)
    work = build_work(model, t.samples, t.seed)
    prepared = backend.prepare(t, work)
    assert prepared.info.weights_hash == work.weights_hash
    assert prepared.info.precision["compute_dtype"] == "float64"
    refs = {("jax", 1, model.name): correct_reference(on_devices, model, **FP64_SIZES),  # also the next test's
            ("jax-plain", 1, model.name): reference(on_devices, model, program=PLAIN, **FP64_SIZES)}
    assert all(float64_all(r) for r in refs.values())
    monkeypatch.setattr(nnx_cnn, "BATCH_NORM_EPSILON", 1e-3)
    refs[("jax-wrong", 1, model.name)] = reference(on_devices, model, program=PLAIN, **FP64_SIZES)
    checks = run_checks(refs, "jax", float64={model.name})
    correct = [c for c in checks if c.backends[0] == "jax-plain"]
    assert correct and all(c.passed and c.norm_rel < 1e-11 for c in correct), correct
    caught = next(c for c in checks if c.backends[0] == "jax-wrong" and c.check == GRADIENTS)
    assert caught.norm_rel > FLOAT64_TOLERANCES["gradients"], caught


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax-shardmap", "jax-auto"])
def test_fp64_resnet_on_two_devices_agrees_with_jax(on_devices, backend):
    """As verify runs a ResNet on 2 devices: the same as `jax` on 2 devices at float64's
    tolerances, BatchNorm normalising over each device's own rows, and so not the same as 1
    device (whose statistics cover the whole batch)."""
    model = fp64_model(FP64_CNN)
    refs = {("jax", DEVICES, model.name): correct_reference(on_devices, model, "jax", DEVICES, **FP64_SIZES),
            (backend, DEVICES, model.name): reference(on_devices, model, backend, DEVICES, **FP64_SIZES)}
    assert all(float64_all(r) for r in refs.values())
    checks = run_checks(refs, "jax", per_device_statistics={model.name}, float64={model.name})
    assert checks and all(c.passed for c in checks), [c for c in checks if not c.passed]
    whole_batch = run_checks({("jax", 1, "m"): correct_reference(on_devices, model, "jax", 1, **FP64_SIZES),
                              (backend, 1, "m"): refs[(backend, DEVICES, model.name)]}, "jax", float64={"m"})
    assert not next(c for c in whole_batch if c.check.startswith("initial loss")).passed


@pytest.mark.parametrize("family", ["mlp", *TINY])
def test_fp64_runs_every_family_in_float64(on_devices, family):
    """Every family and program: float64 gradients and weights, the same weights hash as the
    core's float32 arrays, and float64 gradients that agree with the float32 ones to float32
    rounding (so nothing is silently lost or changed on the way)."""
    model = TINY.get(family) or ModelSpec(name="mlp-test", widths=(32, 32), batch_sizes=(BATCH,), inputs=16)
    fp32 = correct_reference(on_devices, model)
    for program in (DATA_PARALLEL, PLAIN):
        ref = correct_reference(on_devices, model, program=program, precision="fp64")
        assert float64_all(ref), program
        checks = run_checks({("jax", 1, "m"): fp32, ("jax-fp64", 1, "m"): ref}, "jax")
        grads = next(c for c in checks if c.check == GRADIENTS)
        assert grads.norm_rel < 1e-4, grads


def test_fp64_leaves_fp32_trials_unchanged(on_devices):
    """An fp32 trial after an fp64 one in the same process: float32 throughout, bit for bit
    what it gave before, and x64 mode off again."""
    import jax

    model = TINY["lstm"]
    before = reference(on_devices, model, "jax-shardmap", DEVICES)
    reference(on_devices, model, "jax-shardmap", DEVICES, precision="fp64")
    after = reference(on_devices, model, "jax-shardmap", DEVICES)
    assert not jax.config.jax_enable_x64
    assert {a.dtype for a in [*after.gradients, *after.replicas[0]]} == {np.dtype(np.float32)}
    assert after.losses == before.losses
    assert all(np.array_equal(a, b) for a, b in zip(after.gradients, before.gradients))
    assert all(np.array_equal(a, b) for a, b in zip(after.replicas[0], before.replicas[0]))


# -- a bf16-only attention program, verified against float64 --------------------------------

@pytest.mark.parametrize("slip", [None, ("CAUSAL", False), ("SCALE", 1.0)],
                         ids=["correct", "no-causal-mask", "scale-1"])
def test_a_bf16_attention_program_is_verified_against_float64_and_a_slip_fails(on_devices, monkeypatch, slip):
    """The `cudnn` variant's checks, on a CPU: the same program with XLA's attention in its
    place (cuDNN runs only on NVIDIA GPUs), checked in bf16 against jax's float64 run within 4 x
    jax's own bf16 floor, as verify does (`precision_checks`). A missing causal mask or an
    unscaled softmax fails."""
    from xbench.results.checks import precision_checks, precision_floors

    model = preset_model("transformer-tiny", batch_sizes=(VERIFY_BATCH,))
    sizes = dict(batch=VERIFY_BATCH, steps=VERIFY_STEPS)
    exact = {("jax", 1, model.name): correct_reference(on_devices, model, precision="fp64", **sizes)}
    bf16 = {("jax", model.name, "bf16"): correct_reference(on_devices, model, precision="bf16", **sizes)}
    monkeypatch.setattr(nnx_transformer, "cudnn_refusal", lambda *args: None)
    monkeypatch.setattr(nnx_transformer, "attention_implementation", lambda variant: "xla")
    if slip:
        monkeypatch.setattr(nnx_transformer, *slip)
    program = reference(on_devices, model, precision="bf16", variant="cudnn", **sizes)
    floors, rejected = precision_floors(bf16, exact)
    checks, unchecked = precision_checks({("jax+cudnn", 1, model.name, "bf16"): program}, exact, floors, rejected, {})
    assert not unchecked and len(checks) == 2
    if slip is None:
        assert all(c.passed for c in checks), checks
    else:
        assert not next(c for c in checks if "initial loss" in c.check).passed, checks
