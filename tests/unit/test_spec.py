
import pytest

from tests.conftest import ROOT
from xbench.errors import SpecError
from xbench.experiment import build_spec, load_spec
from xbench.models.model_spec import PRESETS


def test_quick_config_equals_builtin_defaults():
    assert load_spec(ROOT / "configs" / "quick.toml") == load_spec(None)


def test_seed_study_has_the_seed_grid():
    spec = load_spec(ROOT / "configs" / "seed-study.toml")
    grid = {m.name: m.batch_sizes for m in spec.models}
    assert grid == {"medium": (8, 16, 32, 64, 128), "large": (4, 8, 16, 32, 64)}
    p = spec.protocol
    assert (p.warmup_steps, p.steps, p.repeats) == (10, 100, 50)
    assert spec.devices == (1, 2) and spec.scaling == "strong"


def test_presets_are_the_seed_architectures():
    assert PRESETS["medium"]["widths"] == (256, 128, 64)
    assert PRESETS["large"]["widths"] == (1024, 1024, 512, 512, 256)


def test_overrides_select_models_and_batches():
    spec = load_spec(None, {"models": ["large"], "batch_sizes": [8, 16], "devices": [1], "repeats": 3})
    assert [m.name for m in spec.models] == ["large"]
    assert spec.models[0].batch_sizes == (8, 16)
    assert spec.protocol.repeats == 3


def test_weak_scaling_multiplies_the_batch():
    spec = load_spec(None, {"scaling": "weak", "batch_sizes": [3], "devices": [1, 2]})
    assert spec.global_batch(3, 2) == 6


def test_explicit_widths_need_a_name():
    spec = build_spec({"models": [{"name": "tiny", "widths": [8], "batch_sizes": [4]}]})
    assert spec.models[0].layer_sizes == (50, 8, 3)
    with pytest.raises(SpecError, match="needs a 'name'"):
        build_spec({"models": [{"widths": [8], "batch_sizes": [4]}]})


@pytest.mark.parametrize("raw, message", [
    ({"models": [{"preset": "huge"}]}, "unknown model preset 'huge'"),
    ({"modles": []}, "unknown key 'modles' in the top level"),
    ({"protocol": {"stepz": 3}}, "unknown key 'stepz' in \\[protocol\\]"),
    ({"protocol": {"steps": 0}}, "'steps' .* must be an integer >= 1, got 0"),
    ({"protocol": {"steps": -5}}, "'steps' .* must be an integer >= 1"),
    ({"protocol": {"repeats": 1}}, "'repeats' .* must be an integer >= 2"),
    ({"protocol": {"steps": 10, "steps_per_call": 3}}, "multiple of steps_per_call"),
    ({"models": [{"preset": "medium", "batch_sizes": [33]}], "devices": [1, 2]}, "not divisible by 2 devices"),
    ({"models": [{"preset": "medium", "batch_sizes": [8192]}]}, "exceeds data.samples"),
    ({"devices": [0]}, "'devices' .* positive integers"),
    ({"precision": "fp8"}, "'precision' .* one of fp32, tf32, bf16"),
    ({"models": [{"preset": "medium", "dropout": 1.5}]}, "'dropout'"),
    ({"models": [{"preset": "medium"}, {"preset": "medium"}]}, "appears twice"),
])
def test_invalid_specs_give_one_line_errors(raw, message):
    with pytest.raises(SpecError, match=message) as info:
        build_spec(raw)
    assert "\n" not in str(info.value)


def test_unknown_model_override():
    with pytest.raises(SpecError, match="unknown model 'xl'; choose one of"):
        load_spec(None, {"models": ["xl"]})


def test_malformed_toml(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("devices = [1, 2\n")
    with pytest.raises(SpecError, match="is not valid TOML"):
        load_spec(bad)


def test_missing_config_file(tmp_path):
    with pytest.raises(SpecError, match="cannot read config"):
        load_spec(tmp_path / "nope.toml")


def test_samples_override():
    assert load_spec(None, {"samples": 999, "batch_sizes": [8]}).data.samples == 999


def test_warmup_rounds_up_to_whole_calls():
    from xbench.worker.measure import warmup_steps

    spec = build_spec({"protocol": {"steps": 10, "steps_per_call": 5, "warmup_steps": 1}})
    assert warmup_steps(spec.protocol) == 5


def test_replicates_by_platform_unless_the_spec_gives_them():
    from xbench.experiment.spec import resolve_protocol

    for gpu, replicates in ((True, 3), (False, 2)):
        assert resolve_protocol(load_spec(None).protocol, gpu, order_seed=1).replicates == replicates
        assert resolve_protocol(load_spec(None, {"replicates": 5}).protocol, gpu, order_seed=1).replicates == 5
    assert load_spec(ROOT / "configs" / "seed-study.toml").protocol.replicates == 2


def test_device_run_variation_read_resolved_and_refused_in_one_line():
    from xbench.contract.timing import DEFAULT_DEVICE_RUN_VARIATION
    from xbench.experiment.spec import resolve_protocol

    assert resolve_protocol(load_spec(None).protocol, True, order_seed=1).device_run_variation == \
        DEFAULT_DEVICE_RUN_VARIATION == 0.002
    given = load_spec(None, {"device_run_variation": 0.01}).protocol
    assert resolve_protocol(given, True, order_seed=1).device_run_variation == 0.01
    with pytest.raises(SpecError, match="device_run_variation") as caught:
        load_spec(None, {"device_run_variation": -1})
    assert "\n" not in str(caught.value)
