"""The fitted step model (`xbench.results.step_model`), its stored fits and held-out validation, the
sweep's design, and `xbench recommend` / `xbench sweep` end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from xbench.errors import SpecError
from xbench.experiment.sweep import ladder_table, ladder_width, sweep_spec
from xbench.results.fitting import (
    FIT_FILE,
    Measured,
    error_summary,
    extrapolate_devices,
    find_fits,
    fit_from_dict,
    fit_to_dict,
    predict_rerun,
    read_fits,
    same_kind,
    save_fits,
    validate,
)
from xbench.results.recommend import MEASURE, MULTI, SINGLE, Question, break_even, device_counts, verdict
from xbench.results.step_model import (
    FitError,
    FitKey,
    Observation,
    all_reduce_time,
    alpha_beta,
    fit,
    host_floor,
    predict,
    step_terms,
    unpack,
)

KEY = FitKey("numpy", "as-written", "subprocess", "fp32", "mlp")
# A machine: host floor 1 ms (1.5 ms on 2 devices), 1e-11 s/FLOP, 2e-10 s/param, all-reduce
# 50 us + 4 bytes/param at 10 GB/s, partial overlap.
TRUTH = {"a": {1: 1e-3, 2: 1.5e-3}, "c": {1: 1e-11, 2: 1e-11}, "d": 2e-10, "comm": {2: (5e-5, 1e-10)}, "g": 2.0}
SIZES = (1e5, 4e5, 1.6e6, 6.4e6)
BATCHES = (16, 64, 256, 1024)


def synthetic(noise: float = 0.01, replicates: int = 3, seed: int = 1, truth=TRUTH,
              devices: tuple[int, ...] = (1, 2)) -> list[Observation]:
    """Observations of a known machine: every size x batch on each device count, twins on N > 1."""
    rng = np.random.default_rng(seed)
    found = []
    for params in SIZES:
        flops = 6 * params
        for b in BATCHES:
            for count, all_reduce in ((p, reduce) for p in devices for reduce in (True, False) if p > 1 or reduce):
                step = step_terms(truth, count, b, flops, params, all_reduce).step
                steps = tuple(step * np.exp(rng.normal(0, noise, replicates)))
                found.append(Observation(KEY, f"mlp-{params:g}", int(params), flops, count, b, all_reduce, steps))
    return found


def test_fit_recovers_a_known_machine_and_predicts_unseen_configurations():
    fitted = fit(synthetic(), bootstrap=20)
    assert fitted.residual_sd < 0.03
    for params, batch, devices in ((8e5, 128, 2), (3e6, 512, 1), (2e5, 32, 2)):
        truth = step_terms(TRUTH, devices, batch / devices, 6 * params, params).step
        p = predict(fitted, params, 6 * params, batch, devices)
        assert p.throughput == pytest.approx(batch / truth, rel=0.05)
        assert p.throughput_low < batch / truth < p.throughput_high


def test_speedup_interval_and_verdicts_follow_the_terms():
    fitted = fit(synthetic(), bootstrap=20)
    question = Question(6.4e6, 6 * 6.4e6, "mlp", (1024,), 2)
    big = verdict(fitted, question, 1024)  # compute dominates: 2 devices help
    assert big.choice == MULTI and big.best.devices == 2 and big.best.speedup[1] > 1
    small = verdict(fitted, Question(1e5, 6e5, "mlp", (32,), 2), 32)  # the host floor dominates: they do not
    assert small.choice == SINGLE and small.best.devices == 1


def test_a_batch_beyond_one_devices_range_recommends_more_devices():
    fitted = fit(synthetic(), bootstrap=5)
    v = verdict(fitted, Question(1e6, 6e6, "mlp", (2048,), 2), 2048)  # 2,048 per device was never measured
    assert v.choice == MULTI and v.best.devices == 2 and "beyond the fitted" in v.why


def test_an_interval_straddling_one_says_measure():
    fitted = fit(synthetic(noise=0.3, replicates=2), bootstrap=30)
    crossing = break_even(fitted, 32)
    assert crossing.params is not None
    question = Question(crossing.params, None, "mlp", (32,), 2)
    assert verdict(fitted, question, 32).choice == MEASURE


def test_break_even_is_where_two_devices_start_to_pay():
    fitted = fit(synthetic(), bootstrap=20)
    crossing = break_even(fitted, 32)
    assert SIZES[0] < crossing.earliest <= crossing.params <= crossing.surely < SIZES[-1]
    # the truth: 2 devices beat 1 where T1(32) > T2(16)
    def speedup(params):
        one = step_terms(TRUTH, 1, 32, 6 * params, params).step
        return one / step_terms(TRUTH, 2, 16, 6 * params, params).step
    assert speedup(crossing.params * 0.8) < 1.02 and speedup(crossing.params * 1.25) > 0.98


def test_held_out_validation_on_a_known_machine_is_accurate():
    measured = Measured(tuple(synthetic()), {}, "test machine", ("synthetic",))
    held, problems = validate(measured)
    assert not problems
    assert {h.scheme for h in held} == {"batch", "model size"}
    median, p90 = error_summary(held)
    assert median < 0.03 and p90 < 0.06


def test_a_fit_predicts_a_rerun_of_the_same_sweep():
    first = Measured(tuple(synthetic(seed=1)), {}, "test machine", ("a",))
    rerun = Measured(tuple(synthetic(seed=2)), {}, "test machine", ("b",))
    predicted = predict_rerun(first, rerun)
    assert len(predicted) == 2 * len(SIZES) * len(BATCHES)  # full steps on 1 and 2 devices, no twins
    assert error_summary(predicted)[1] < 0.05


def test_validation_catches_a_model_that_does_not_fit():
    """A machine whose step time jumps at one batch (a kernel switch): held-out errors show it."""
    obs = synthetic()
    jumped = [o if o.local_batch != 256 else Observation(o.key, o.model, o.params, o.flops, o.devices, o.local_batch,
                                                         o.all_reduce, tuple(3 * s for s in o.step_s)) for o in obs]
    held, _ = validate(Measured(tuple(jumped), {}, "test machine", ("synthetic",)))
    assert error_summary([h for h in held if h.scheme == "batch"])[1] > 0.3


def test_fit_refuses_what_it_cannot_support():
    obs = synthetic()
    with pytest.raises(FitError, match="no 1-device step"):
        fit([o for o in obs if o.devices == 2])
    with pytest.raises(FitError, match="cannot fit"):
        fit(obs[:5])
    with pytest.raises(FitError, match="only one amount of work"):
        fit([o for o in obs if o.local_batch == 64 and o.params == 1e5] + [o for o in obs if o.devices == 1])


def test_predictions_outside_the_fitted_range_are_refused():
    fitted = fit(synthetic(), bootstrap=5)
    with pytest.raises(FitError, match="outside the fitted .*xbench sweep --params"):
        predict(fitted, 1e9, 6e9, 64, 1)
    with pytest.raises(FitError, match="samples per device is outside"):
        predict(fitted, 1e6, 6e6, 4096, 1)
    with pytest.raises(FitError, match="positive"):
        predict(fitted, -1, 6e6, 64, 1)


def test_alpha_beta_and_ring_extrapolation():
    sizes = np.array([4e3, 2.6e5, 1.6e7, 2.7e8])
    alpha, beta = alpha_beta(sizes, 2e-5 + sizes * 5e-11)
    assert alpha == pytest.approx(2e-5, rel=1e-6) and beta == pytest.approx(5e-11, rel=1e-6)
    comm = {2: (alpha, beta)}
    # 4 devices: the step's latency as on 2 (a framework's per-step cost, not hops), and
    # 2(p-1)/p = 1.5 of the bytes per link instead of 1
    assert all_reduce_time(comm, 4, 1e6) == pytest.approx(2e-5 + 1.5 * 1e6 * 5e-11)


def test_the_host_floor_grows_per_doubling_as_measured():
    floors = {1: 1e-3, 2: 1.5e-3}
    assert host_floor(floors, 2) == 1.5e-3
    assert host_floor(floors, 4) == pytest.approx(2.25e-3)  # x1.5 per doubling, as from 1 to 2
    assert host_floor(floors, 8) == pytest.approx(3.375e-3)
    assert host_floor({1: 1e-3}, 4) == 1e-3  # one count measured: no trend to follow


def test_four_devices_predicted_from_one_and_two_with_their_intervals():
    """A machine that behaves as the extrapolation assumes: fits on its 1- and 2-device steps
    predict its 4-device steps; its 4-device all-reduce benchmark is not looked at."""
    truth = {**TRUTH, "a": {1: 1e-3, 2: 1.5e-3, 4: 2.25e-3}, "c": {p: 1e-11 for p in (1, 2, 4)},
             "comm": {2: (5e-5, 1e-10), 4: (5e-5, 1.5e-10)}}
    obs = synthetic(truth=truth, devices=(1, 2, 4))
    misleading = {"numpy": {2: (5e-5, 1e-10), 4: (1.0, 1.0)}}  # a 4-device benchmark the fit must not see
    held, problems = extrapolate_devices(Measured(tuple(obs), misleading, "test machine", ("synthetic",)), 2)
    assert not problems
    assert len(held) == len(SIZES) * len(BATCHES) and {h.devices for h in held} == {4}
    assert error_summary(held)[0] < 0.03
    # 95 % intervals around the model's step; the measured means carry their own 0.6 % noise
    assert sum(bool(h.inside) for h in held) >= 0.85 * len(held)


def test_extrapolated_device_counts_are_marked():
    fitted = fit(synthetic(), bootstrap=5)
    p = predict(fitted, 1e6, 6e6, 1024, 4)
    assert p.extrapolated and "ring all-reduce" in p.extrapolated
    assert predict(fitted, 1e6, 6e6, 1024, 2).extrapolated is None


def test_the_steps_all_reduce_is_fitted_from_twins_and_the_benchmark_kept():
    """The benchmark says 10x less than the step pays: the fit follows the steps."""
    benchmark = {2: (5e-6, 1e-11)}
    fitted = fit(synthetic(noise=0.002), benchmark, bootstrap=5)
    alpha, beta = unpack(fitted.theta, fitted.layout)["comm"][2]
    assert beta == pytest.approx(TRUTH["comm"][2][1], rel=0.25)
    assert fitted.benchmark == benchmark


def test_a_size_exponent_below_one_is_recovered():
    """Larger models use the device better per FLOP (k < 1): model-size interpolation holds."""
    truth = {**TRUTH, "k": 0.8, "flops_ref": 1e6}
    measured = Measured(tuple(synthetic(truth=truth)), {}, "test machine", ("synthetic",))
    held, _ = validate(measured)
    assert error_summary([h for h in held if h.scheme == "model size"])[0] < 0.03
    fitted = fit(measured.observations, bootstrap=0)
    assert unpack(fitted.theta, fitted.layout)["k"] == pytest.approx(0.8, abs=0.05)


def test_fits_round_trip_through_fit_json(tmp_path):
    fitted = fit(synthetic(), bootstrap=5)
    assert fit_from_dict(json.loads(json.dumps(fit_to_dict(fitted)))) == fitted
    (tmp_path / "run").mkdir()
    path = save_fits(tmp_path / "run" / FIT_FILE, [fitted], Measured((), {}, "test machine", ("run",)))
    stored, problems = find_fits([tmp_path])
    assert [s.path for s in stored] == [path] and stored[0].fits == (fitted,) and not problems
    path.write_text("{not json")
    with pytest.raises(FitError, match="not a readable fit"):
        read_fits(path)
    stored, problems = find_fits([tmp_path])  # found in a directory: left out, with why
    assert stored == [] and "not a readable fit" in problems[0]


def test_ladder_models_have_the_asked_size():
    from xbench.models.model_spec import ModelSpec

    for params in (3e4, 1e6, 64e6):
        table = ladder_table(params, [8])
        spec = ModelSpec(name=table["name"], widths=tuple(table["widths"]), batch_sizes=(8,))
        assert spec.params == pytest.approx(params, rel=0.1)
        assert ladder_width(params) == table["widths"][0] and table["widths"][0] % 8 == 0
    assert ladder_table(1e6, [8])["name"] == "mlp-1m"


def test_sweep_spec_refuses_a_design_that_cannot_be_fitted():
    with pytest.raises(SpecError, match="must include 1"):
        sweep_spec(["jax"], [1e5], [], [16, 64], [2], "fp32", None)
    with pytest.raises(SpecError, match="nothing to sweep"):
        sweep_spec(["jax"], [], [], [16, 64], [1, 2], "fp32", None)
    with pytest.raises(SpecError, match="--per-device-batch needs at least two"):
        sweep_spec(["jax"], [1e5], [], [16], [1, 2], "fp32", None)
    with pytest.raises(SpecError, match="outside 1e3-1e10"):
        sweep_spec(["jax"], [10], [], [16, 64], [1, 2], "fp32", None)
    spec = sweep_spec(["jax"], [1e5], ["transformer-tiny"], [16, 64], [1, 2], "fp32", 2)
    assert spec.scaling == "weak" and [m.name for m in spec.models] == ["mlp-100k", "transformer-tiny"]
    assert spec.data.samples >= 128 and spec.learning_rate == 1e-4
    config = {"models": [{"name": "t2", "family": "transformer", "layers": 2, "width": 64, "heads": 2,
                          "context": 32, "vocab": 256, "batch_sizes": [2, 4]}], "protocol": {"repeats": 3}}
    spec = sweep_spec(["jax"], [], [], [16, 64], [1, 2], "fp32", None, config=config)
    assert spec.models[0].batch_sizes == (2, 4) and spec.protocol.repeats == 3
    # the plan's "cheaper: --time-budget 0" names an option the sweep has
    assert sweep_spec(["jax"], [1e5], [], [16, 64], [1, 2], "fp32", None, time_budget_s=0).protocol.time_budget_s == 0


def test_device_counts():
    assert device_counts(1) == [1] and device_counts(2) == [1, 2] and device_counts(6) == [1, 2, 4, 6]


# ----------------------------------------------------------------------------- the commands


@pytest.fixture
def stored_fit(tmp_path):
    fitted = fit(synthetic(), bootstrap=20)
    run = tmp_path / "results" / "sweep"
    run.mkdir(parents=True)
    save_fits(run / FIT_FILE, [fitted], Measured((), {}, "2 x Test GPU", ("sweep",)))
    return tmp_path / "results"


def test_recommend_answers_from_a_stored_fit_without_a_framework(stored_fit):
    script = ("import sys, time; t = time.time(); from xbench.cli.main import main; "
              "code = main(['recommend', '--params', '1.6e6', '--global-batch', '256', '1024', "
              f"'--fits', r'{stored_fit}']); "
              "assert code == 0, code; "
              "loaded = [m for m in ('jax', 'tensorflow', 'torch') if m in sys.modules]; "
              "assert not loaded, loaded; print('seconds', time.time() - t)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "global batch 1024" in out and "speedup" in out and "2 x Test GPU" in out
    assert "numpy (fp32): use 2 devices" in out and "2 devices beat 1" in out
    assert float(out.split("seconds ")[-1]) < 5


def test_recommend_without_a_fit_says_what_to_sweep(run_cli, tmp_path):
    code, _, err = run_cli("recommend", "--params", "5e6", "--global-batch", "64", "--fits", str(tmp_path))
    assert code == 2 and "no stored fit for the mlp family" in err and "xbench sweep" in err


@pytest.mark.parametrize("args, message", [
    (("--params", "0", "--global-batch", "64"), "must be positive"),
    (("--params", "1e6", "--global-batch", "0"), "--global-batch must be positive"),
    (("--params", "1e6", "--global-batch", "x"), "whole numbers"),
    (("--params", "1e6"), "--global-batch is required"),
    (("--global-batch", "64"), "either --model PRESET or --params"),
    (("--model", "nope", "--global-batch", "64"), "unknown model"),
    (("--params", "1e6", "2e6", "--global-batch", "64"), "--params takes one value"),
    (("--params", "1e6", "--global-batch", "64", "--devices", "1", "2"), "--devices takes one value"),
    (("--params", "1e9", "--global-batch", "64"), "outside the fit that answers here"),
    (("--params", "1e6", "--batch", "0"), "--global-batch must be positive"),  # --batch: the old name, kept
])
def test_recommend_bad_input_is_one_line(run_cli, stored_fit, args, message):
    code, out, err = run_cli("recommend", *args, "--fits", str(stored_fit))
    assert code == 2 and message in " ".join(err.split()) and "Traceback" not in err


def test_validate_a_directory_that_is_not_a_run(run_cli, tmp_path):
    code, _, err = run_cli("recommend", "--validate", str(tmp_path))
    assert code == 2 and "not an xbench run directory" in err


def test_sweep_then_recommend_and_validate(run_cli, fake_backends, tmp_path):
    """A real sweep through the numpy fake backend: records, a fit beside them, answers."""
    out, spec = tmp_path / "sweep", tmp_path / "sweep.toml"
    spec.write_text("[protocol]\nmin_window_s = 0.02\n")  # windows of 20 ms: 54 replicates in seconds
    code, stdout, err = run_cli("sweep", "--config", str(spec), "--backends", "numpy", "--params", "3e3", "1e4",
                                "3e4", "--batch-sizes", "8", "32", "128", "--replicates", "2",
                                "--window-budget", "0.15", "--no-verify", "--out", str(out))
    assert code == 0, err
    assert "plan:" in err and "estimated" in err and "roughly" not in err  # one up-front estimate, the plan's
    stored = read_fits(out / FIT_FILE)
    assert [f.key.backend for f in stored.fits] == ["numpy"] and stored.fits[0].observations == 27
    code, stdout, err = run_cli("recommend", "--params", "1e4", "--global-batch", "64", "--fits", str(out))
    assert code == 0, err
    assert "global batch 64" in stdout
    code, stdout, err = run_cli("recommend", "--validate", str(out))
    assert code == 0, err
    assert "batch:" in stdout and "model size:" in stdout and "median |error|" in stdout


def test_sweep_bad_input_writes_nothing(run_cli, tmp_path):
    out = tmp_path / "never"
    code, _, err = run_cli("sweep", "--backends", "jax", "--params", "lots", "--out", str(out))
    assert code == 2 and "--params takes parameter counts" in err and not out.exists()
    code, _, err = run_cli("sweep", "--backends", "jax", "--devices", "2", "--out", str(out))
    assert code == 2 and "must include 1" in err and not out.exists()


def test_recommend_prefers_this_machines_fits(run_cli, tmp_path):
    from xbench.cli.recommend_cmd import this_machine

    fitted = fit(synthetic(), bootstrap=5)
    for name, machine in (("here", this_machine()), ("elsewhere", "8 x Other GPU")):
        (tmp_path / name).mkdir()
        save_fits(tmp_path / name / FIT_FILE, [fitted], Measured((), {}, machine, (name,)))
    code, out, err = run_cli("recommend", "--params", "1e6", "--global-batch", "256", "--fits", str(tmp_path))
    assert code == 0, err
    out = " ".join(out.split())
    assert f"answering from {tmp_path / 'here' / FIT_FILE}" in out and "no fit was measured" not in out
    assert f"also covering this question, not used: {tmp_path / 'elsewhere' / FIT_FILE} (8 x Other GPU, fitted " in out


def test_machines_of_one_kind_match_whatever_their_count():
    assert same_kind("1 x NVIDIA H200", "2 x NVIDIA H200")
    assert not same_kind("2 x NVIDIA H200", "2 x NVIDIA H100 80GB HBM3")
    assert same_kind("simulated CPU devices (AMD EPYC)", "simulated CPU devices (AMD EPYC)")
