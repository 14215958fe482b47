"""The core side of model families: presets' parameter counts against published
ones, FLOPs against the usual formulas, the canonical layout, data, the spec's keys and bad
input, the run path (units, unsupported families), and verify's per-device statistics."""

import json

import numpy as np
import pytest

from xbench.contract.work import DATA_BUDGET_BYTES, build_work, data_samples, sample_bytes
from xbench.errors import SpecError
from xbench.experiment import build_spec
from xbench.models import families, params_count, training_flops
from xbench.models.cnn import convolutions
from xbench.models.model_spec import preset_model
from xbench.results.checks import run_checks
from xbench.wire import Reference

CHEAP_PRESETS = ("medium", "large", "transformer-tiny", "resnet18", "lstm-small", "lstm-seed")


@pytest.mark.parametrize("preset, published", [
    ("resnet50", 25_557_032),  # torchvision resnet50, 1,000 classes
    ("resnet18", 11_181_642),  # torchvision resnet18 with a 10-class head
    ("medium", 54_403),  # the seed study's MLPs, counted by hand in its notes
    ("large", 2_021_379),
])
def test_parameter_counts_match_published_ones(preset, published):
    assert preset_model(preset).params == published


def test_gpt2_small_is_124m_with_a_tied_head():
    model = preset_model("gpt2-small")
    # HF's GPT-2 (vocab 50,257) has 124,439,808; nanoGPT's padded vocab adds 47 x 768.
    assert model.params == 124_439_808 + (50_304 - 50_257) * 768
    untied = model.params + 50_304 * 768
    assert round(model.params / 1e6) == 124 and round(untied / 1e6) == 163


@pytest.mark.parametrize("preset", CHEAP_PRESETS)
def test_initial_arrays_follow_the_canonical_layout(preset):
    model = preset_model(preset)
    work = build_work(model, 8, seed=0)
    shapes = [p.shape for p in work.parameters]
    assert [a.shape for a in work.arrays] == shapes
    assert all(a.dtype == np.float32 for a in work.arrays)
    assert work.params == params_count(model.kind, model.shape) == model.params
    again = build_work(model, 16, seed=0)
    assert again.weights_hash == work.weights_hash  # the data size never changes the weights
    assert build_work(model, 8, seed=1).weights_hash != work.weights_hash


def test_data_kinds_and_shards():
    tokens = build_work(preset_model("transformer-tiny"), 16, 0)
    assert tokens.x.dtype == np.int32 and tokens.x.shape == (16, 64)
    assert np.array_equal(tokens.x[:, 1:], tokens.y[:, :-1])  # targets are the next tokens
    assert tokens.x.max() < 1024 and tokens.x.min() >= 0
    images = build_work(preset_model("resnet18"), 16, 0)
    assert images.x.shape == (16, 32, 32, 3) and images.y.dtype == np.int32 and images.y.max() < 10
    xs, ys = images.shards(8, 2)
    assert xs.shape == (2, 2, 4, 32, 32, 3) and ys.shape == (2, 2, 4)
    assert np.array_equal(xs[1, 0], images.x[4:8]) and np.array_equal(ys[0, 1], images.y[8:12])
    sequences = build_work(preset_model("lstm-small"), 4, 0)
    assert sequences.x.shape == (4, 64, 32) and sequences.y.shape == (4, 1)


def test_gpt2_flops_are_the_usual_formula():
    model = preset_model("gpt2-small")
    d, t, layers, v = 768, 1024, 12, 50_304
    non_embedding_and_head = 12 * layers * d * d + d * v
    per_token = 6 * non_embedding_and_head + 12 * layers * t * d
    assert model.training_flops_per_sample == t * per_token
    assert model.units_per_sample == t and model.unit == "tokens"


def test_resnet50_flops_are_three_forward_passes():
    model = preset_model("resnet50")
    forward = sum(2 * c.out_size ** 2 * c.kernel ** 2 * c.inputs * c.outputs for c in convolutions(model.shape))
    forward += 2 * 2048 * 1000
    assert forward / 2 == pytest.approx(4.09e9, rel=0.01)  # the published 4.1 GMACs
    stem = 2 * 112 * 112 * 49 * 3 * 64
    assert model.training_flops_per_sample == 3 * forward - stem


def test_lstm_flops_count_both_matmuls_of_every_step():
    model = preset_model("lstm-seed")
    h, t, f = 160, 32, 50
    forward = [2 * f * 4 * h * t, 2 * h * 4 * h * t, 2 * h * 4 * h * t, 2 * h * 4 * h * t, 2 * h * 3]
    assert model.training_flops_per_sample == training_flops(forward)
    assert 300_000 <= model.params <= 500_000  # the seed report's "LSTM 300K-500K params"


def test_big_data_is_capped_to_whole_batches():
    model = preset_model("resnet50")
    assert sample_bytes(model) == 224 * 224 * 3 * 4 + 4
    kept = data_samples(model, 4096, 256)
    assert kept % 256 == 0 and kept * sample_bytes(model) <= DATA_BUDGET_BYTES
    assert data_samples(model, 4096, 4096) == 4096  # at least one global batch
    assert data_samples(preset_model("medium"), 4096, 32) == 4096


# -- the spec ------------------------------------------------------------------------------

def spec_of(*models, **top):
    return build_spec({"devices": [1], "models": list(models), **top}, "test")


def test_a_family_model_by_keys_and_a_preset_with_changes():
    spec = spec_of({"name": "t", "family": "transformer", "layers": 1, "heads": 2, "width": 8, "context": 4,
                    "vocab": 16, "batch_sizes": [2]},
                   {"preset": "resnet50", "image": 64, "batch_sizes": [2]})
    t, r = spec.models
    assert t.family == "transformer" and t.shape == {"context": 4, "heads": 2, "layers": 1, "vocab": 16, "width": 8}
    assert r.name == "resnet50" and r.shape["image"] == 64 and r.shape["classes"] == 1000
    assert type(t).from_dict(json.loads(json.dumps(__import__("dataclasses").asdict(t)))) == t


@pytest.mark.parametrize("table, needles", [
    ({"name": "x", "family": "rnn", "batch_sizes": [2]}, ("unknown model family 'rnn'", "mlp, transformer, cnn, lstm")),
    ({"name": "x", "family": "transformer", "layers": 1, "heads": 3, "width": 8, "context": 4, "vocab": 16,
      "batch_sizes": [2]}, ("heads (3) must divide width (8)",)),
    ({"preset": "resnet18", "image": 16}, ("image 16 is too small", "image >= 32")),
    ({"preset": "resnet18", "depth": 20}, ("depth 20 is not a ResNet depth", "10, 18, 26, 34, 50")),
    ({"name": "x", "family": "lstm", "layers": 1, "sequence": 4, "batch_sizes": [2]}, ("needs 'hidden'",)),
    ({"preset": "resnet18", "heads": 2}, ("unknown key 'heads'", "family 'cnn'")),
    ({"preset": "lstm-small", "dropout": 0.1}, ("family 'lstm' has no dropout",)),
    ({"preset": "resnet18", "family": "lstm"}, ("of family 'cnn', not 'lstm'",)),
    ({"name": "x", "family": "cnn", "depth": 18, "image": 32, "batch_sizes": [2]}, ("needs 'classes'",)),
    ({"name": "x", "batch_sizes": [2]}, ("needs a 'preset'",)),
    ({"preset": "gpt2-small", "batch_sizes": [4096]}, ("logits or attention scores", "int32 indexing")),
])
def test_bad_family_input_is_a_one_line_spec_error(table, needles):
    with pytest.raises(SpecError) as info:
        spec_of(table, data={"samples": 4096})
    assert "\n" not in str(info.value)
    for needle in needles:
        assert needle in str(info.value)


def test_bad_family_input_writes_nothing(fake_backends, run_cli, tmp_path):
    out_dir = tmp_path / "run"
    config = tmp_path / "bad.toml"
    config.write_text('devices = [1]\n[[models]]\npreset = "gpt2-small"\nheads = 7\n')
    code, _, err = run_cli("compare", "--backends", "numpy", "--config", str(config), "--no-verify",
                           "--out", str(out_dir))
    assert code == 2 and err.startswith("error:") and "heads (7) must divide width (768)" in " ".join(err.split())
    assert not out_dir.exists()


def test_a_backend_without_the_family_records_unsupported(fake_backends, run_cli, tmp_path):
    """The numpy fake builds MLPs only: its transformer trials say so instead of failing."""
    out_dir = tmp_path / "run"
    code, out, err = run_cli("compare", "--backends", "numpy", "--model", "transformer-tiny", "--batch-sizes", "8",
                             "--devices", "1", "--repeats", "3", "--steps", "2", "--warmup-steps", "0",
                             "--no-verify", "--out", str(out_dir))
    records = [json.loads(line) for line in (out_dir / "records.jsonl").read_text().splitlines()]
    assert records and all(r["status"] == "unsupported" for r in records)
    assert "builds no 'transformer' models (it builds: mlp)" in records[0]["reason"]


def test_model_presets_are_listed(run_cli):
    code, out, _ = run_cli("models")
    assert code == 0
    for preset in ("gpt2-small", "resnet50", "lstm-seed", "transformer-tiny", "medium"):
        assert preset in out
    assert "25,557,032" in out and "124,475,904" in out


# -- verify with per-device batch statistics -------------------------------------------------

def ref(scale=1.0, replicas=1, seed=0):
    rng = np.random.default_rng(seed)
    grads = [rng.normal(size=(4, 3)) * scale]
    weights = [rng.normal(size=(4, 3))]
    return Reference(loss=1.0 * scale, gradients=grads, losses=[1.0, 0.9], replicas=[weights] * replicas)


def test_batch_statistics_models_compare_n_devices_with_the_reference_at_n():
    # d2 differs from d1 by design (BatchNorm over each device's half of the batch).
    refs = {("a", 1, "cnn"): ref(), ("a", 2, "cnn"): ref(1.3, 2, seed=1), ("b", 1, "cnn"): ref(),
            ("b", 2, "cnn"): ref(1.3, 2, seed=1)}
    checks = run_checks(refs, "a", per_device_statistics={"cnn"})
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    assert not [c for c in checks if c.check == "gradients: N devices = 1 device"]
    assert {c.subject for c in checks if "across" in c.check} == {"cnn: b d1 vs a d1", "cnn: b d2 vs a d2"}
    # Without the exemption the same references fail, and a backend that differs at d2 still fails.
    assert not all(c.passed for c in run_checks(refs, "a"))
    refs[("b", 2, "cnn")] = ref(2.0, 2, seed=1)
    failed = [c.subject for c in run_checks(refs, "a", per_device_statistics={"cnn"}) if not c.passed]
    assert "cnn: b d2 vs a d2" in failed


def test_every_family_is_registered_with_what_the_core_needs():
    for name, fam in families().items():
        assert fam.name == name and fam.unit and fam.loss
        for preset in fam.presets:
            model = preset_model(preset)
            assert model.training_flops_per_sample > 0 and model.params > 0
            elements, what = model.kind.largest_activation(model.shape)
            assert elements > 0 and what


def test_a_stored_spec_of_every_family_reads_back_for_resume():
    from dataclasses import asdict

    from xbench.run.resume import saved_spec

    spec = build_spec({"devices": [1], "backends": ["jax"], "models": [{"preset": p} for p in
                                                  ("medium", "gpt2-small", "resnet50", "lstm-seed")],
                       "protocol": {"replicates": 2}}, "test")
    stored = json.loads(json.dumps(asdict(spec)))
    assert saved_spec(stored, "run.json").models == spec.models
    stored["models"][1]["dims"] = "oops"
    with pytest.raises(SpecError, match="not one xbench wrote"):
        saved_spec(stored, "run.json")


# -- a plugin family -------------------------------------------------------------------------

@pytest.fixture
def plugin_families(monkeypatch):
    from importlib.metadata import EntryPoint

    import xbench.models as models

    points = [EntryPoint("linear", "tests.support.plugin_family:Linear", models.FAMILY_GROUP),
              EntryPoint("broken", "tests.support.plugin_family:Broken", models.FAMILY_GROUP),
              EntryPoint("cnn", "tests.support.plugin_family:Linear", models.FAMILY_GROUP)]  # cannot replace a built-in
    monkeypatch.setattr(models, "entry_points", lambda group: points if group == models.FAMILY_GROUP else [])
    models._discover.cache_clear()
    yield
    models._discover.cache_clear()


def test_a_plugin_family_is_a_family_like_the_built_in_ones(plugin_families):
    from xbench.models import broken_families, families

    assert families()["linear"].name == "linear" and families()["cnn"].name == "cnn"
    assert "cannot load" in broken_families()["broken"]
    spec = spec_of({"preset": "linear-small"}, {"name": "wide", "family": "linear", "inputs": 64, "outputs": 4,
                                                "batch_sizes": [8]})
    assert [m.params for m in spec.models] == [8 * 2 + 2, 64 * 4 + 4]
    with pytest.raises(SpecError, match="outputs must not exceed inputs"):
        spec_of({"name": "x", "family": "linear", "inputs": 2, "outputs": 3, "batch_sizes": [2]})
    with pytest.raises(SpecError, match="family 'broken' in .* failed to load: RuntimeError"):
        spec_of({"name": "x", "family": "broken", "batch_sizes": [2]})


def test_plugin_presets_are_listed_with_broken_plugins(plugin_families, run_cli):
    code, out, _ = run_cli("models")
    assert code == 0 and "linear-small" in out and "failed to load" in out


def test_a_family_plugin_that_exits_or_hangs_is_broken_not_the_end_of_xbench(monkeypatch, run_cli):
    """Family plugins load as backends do, isolated and within the timeout."""
    from importlib.metadata import EntryPoint

    import xbench.models as models
    from xbench.plugins import TIMEOUT_VARIABLE

    points = [EntryPoint("exits", "tests.support.plugin_family:Exits", models.FAMILY_GROUP),
              EntryPoint("hangs", "tests.support.plugin_family:Hangs", models.FAMILY_GROUP)]
    monkeypatch.setattr(models, "entry_points", lambda group: points if group == models.FAMILY_GROUP else [])
    monkeypatch.setenv(TIMEOUT_VARIABLE, "0.5")
    models._discover.cache_clear()
    try:
        code, out, err = run_cli("models")
        broken = models.broken_families()
    finally:
        models._discover.cache_clear()
    assert code == 0 and "gpt2-small" in out, err
    assert broken == {"exits": "SystemExit: 5",
                      "hangs": f"plugin did not answer within 0.5 s ({TIMEOUT_VARIABLE})"}
