"""The verification checks: unit tests on synthetic references, then real backends."""

import json
from pathlib import Path

import numpy as np
import pytest

from xbench.results.checks import run_checks, verification_batch
from xbench.results.records import read_records
from xbench.stats import relative_errors
from xbench.wire import Reference


def reference(scale=1.0, replicas=1, drift=0.0, seed=0):
    rng = np.random.default_rng(seed)
    grads = [rng.normal(size=(4, 3)) * scale, rng.normal(size=3) * scale]
    weights = [rng.normal(size=(4, 3)), rng.normal(size=3)]
    return Reference(loss=1.5, gradients=grads, losses=[1.5, 1.4, 1.3],
                     replicas=[[w + drift * r for w in weights] for r in range(replicas)])


def test_errors_of_identical_arrays_are_zero():
    a = [np.arange(6.0).reshape(2, 3)]
    assert relative_errors(a, a) == (0.0, 0.0, 0.0)


def test_errors_normwise_and_elementwise():
    max_abs, max_rel, norm_rel = relative_errors([np.array([1.0, 2.0])], [np.array([1.0, 1.0])])
    assert max_abs == 1.0 and max_rel == 1.0 and norm_rel == pytest.approx(1 / np.sqrt(2))


def test_errors_of_nothing_are_an_error_not_a_pass():
    with pytest.raises(ValueError, match="nothing to compare"):
        relative_errors([], [np.zeros(2)])


def test_errors_treat_nan_as_infinite():
    assert relative_errors([np.array([np.nan])], [np.array([1.0])])[2] == float("inf")


def test_verification_batch_divides_every_device_count():
    assert verification_batch([1, 2]) == 32
    assert verification_batch([1, 2, 3]) == 36
    assert verification_batch([1, 8]) == 32


def test_consistent_references_pass():
    refs = {("a", 1, "m"): reference(), ("a", 2, "m"): reference(replicas=2), ("b", 1, "m"): reference()}
    checks = run_checks(refs, reference_backend="a")
    assert checks and all(c.passed for c in checks)
    assert {c.check for c in checks} == {
        "gradients: N devices = 1 device", "initial loss and gradients across backends",
        "10 steps: losses and final weights", "replicas hold the same weights"}


def test_n_times_gradients_and_drifting_replicas_fail():
    good, doubled = reference(), reference(scale=2.0, replicas=2, drift=1e-3)
    doubled = Reference(doubled.loss, doubled.gradients, good.losses, [good.replicas[0], good.replicas[0]])
    drifting = reference(replicas=2, drift=1e-3)
    checks = run_checks({("a", 1, "m"): good, ("a", 2, "m"): doubled}, "a")
    assert [c.check for c in checks if not c.passed] == ["gradients: N devices = 1 device"]
    checks = run_checks({("a", 1, "m"): good, ("a", 2, "m"): drifting}, "a")
    assert "replicas hold the same weights" in [c.check for c in checks if not c.passed]


def diverged(ref, relative, seed=1):
    """`ref` after ten steps that ended `relative` (normwise, over losses and weights) away."""
    from xbench.results.checks import trajectory

    rng = np.random.default_rng(seed)
    steps = [rng.normal(size=w.shape) for w in ref.replicas[0]]
    scale = relative * np.linalg.norm(np.concatenate([np.ravel(a) for a in trajectory(ref)]))
    scale /= np.linalg.norm(np.concatenate([s.ravel() for s in steps]))
    return Reference(ref.loss, ref.gradients, ref.losses, [[w + scale * s for w, s in zip(ref.replicas[0], steps)]])


def ten_steps(checks, backend):
    return next(c for c in checks if c.check == "10 steps: losses and final weights" and c.backends[0] == backend)


def test_rounding_floors_widen_only_the_ten_step_tolerance():
    """A trajectory 5e-3 away fails the fixed 1e-4, passes where the two backends' fp32 runs are
    that far from their float64 ones (rounding amplified, as a wide ReLU MLP does), and an
    8e-4 difference (another Adam epsilon placement) still fails where the floors are 1e-7."""
    from xbench.results.checks import FLOOR_FACTOR

    good = reference()
    refs = {("a", 1, "m"): good, ("b", 1, "m"): diverged(good, 5e-3)}
    assert ten_steps(run_checks(refs, "a"), "b").norm_rel == pytest.approx(5e-3, rel=0.05)
    assert not ten_steps(run_checks(refs, "a"), "b").passed
    both = {("a", "m"), ("b", "m")}
    widened = ten_steps(run_checks(refs, "a", floors={("a", "m"): 3e-3, ("b", "m"): 1e-6}, compared=both), "b")
    assert widened.passed and widened.floor == pytest.approx(3.001e-3)
    assert widened.tolerance == pytest.approx(FLOOR_FACTOR * 3.001e-3)
    gradients = [c for c in run_checks(refs, "a", floors={("a", "m"): 3e-3}) if c.check.startswith("initial")]
    assert [c.tolerance for c in gradients] == [1e-4]
    formula = {("a", 1, "m"): good, ("b", 1, "m"): diverged(good, 8e-4)}
    tight = ten_steps(run_checks(formula, "a", floors={("a", "m"): 1e-7, ("b", "m"): 1e-7}, compared=both), "b")
    assert not tight.passed and tight.tolerance == 1e-4


def test_each_backend_has_a_float64_referee_on_one_device_for_fp32_models():
    from xbench.contract import PLAIN
    from xbench.experiment import build_spec
    from xbench.results.checks import REFEREE_PRECISION, is_referee
    from xbench.run.plan import Lineup
    from xbench.run.verify_plan import verification_trials

    spec = build_spec({"models": [{"preset": "medium"}, {"preset": "resnet18"}], "devices": [1, 2]})
    trials = verification_trials(spec, ["jax", "torch"], [2], lineups={"torch": Lineup(single_device=(PLAIN,))})
    referees = [t for t in trials if t.precision == REFEREE_PRECISION and t.model.name == "medium"]
    assert {(t.backend, t.devices, t.implementation) for t in referees} == {
        ("jax", 1, "jax"), ("torch", 1, "torch"), ("torch", 1, "torch plain")}
    assert all(is_referee({"precision": t.precision, "replicate": t.replicate}) for t in referees)
    assert len({t.id for t in trials}) == len(trials)  # a referee never overwrites the fp32 run's arrays
    # resnet18 is verified in float64 already: no referee, and its trials are not referees
    assert not any(is_referee({"precision": t.precision, "replicate": t.replicate})
                   for t in trials if t.model.name == "resnet18")


def test_rounding_floor_is_the_fp32_trajectory_against_float64_on_one_device():
    from xbench.results.checks import rounding_floors

    good = reference()
    refs = {("a", 1, "m"): good, ("a", 2, "m"): diverged(good, 0.3)}
    floors, rejected = rounding_floors(refs, {("a", "m"): diverged(good, 2e-3)})
    assert floors == {("a", "m"): pytest.approx(2e-3, rel=0.05)} and rejected == {}


def test_a_float64_run_of_another_model_in_float32_or_blown_up_gives_no_floor():
    from xbench.results.checks import rounding_floors

    good = reference()
    other = Reference(good.loss, [g * 1.01 for g in good.gradients], good.losses, good.replicas)
    single = Reference(good.loss, [g.astype(np.float32) for g in good.gradients], good.losses, good.replicas)
    blown = Reference(good.loss, good.gradients, good.losses, [[np.full_like(w, np.nan) for w in good.replicas[0]]])
    floors, rejected = rounding_floors({("a", 1, "m"): good, ("b", 1, "m"): blown, ("c", 1, "m"): good},
                                       {("a", "m"): other, ("b", "m"): good, ("c", "m"): single})
    assert floors == {}
    assert "float64 gradients are 9.2e-03" in rejected[("a", "m")] and "fp32 run is not finite" in rejected[("b", "m")]
    assert "other than float64" in rejected[("c", "m")]


def test_a_non_finite_trajectory_fails_whatever_the_tolerance():
    good = reference()
    blown = Reference(good.loss, good.gradients, good.losses, [[np.full_like(w, np.nan) for w in good.replicas[0]]])
    check = ten_steps(run_checks({("a", 1, "m"): good, ("b", 1, "m"): blown}, "a",
                                 floors={("a", "m"): float("inf"), ("b", "m"): 1.0},
                                 compared={("a", "m"), ("b", "m")}), "b")
    assert check.tolerance == float("inf") and not check.passed


def test_only_a_pair_with_two_floors_compared_in_float64_is_widened():
    good = reference()
    refs = {("a", 1, "m"): good, ("b", 1, "m"): diverged(good, 8e-4)}
    floors = {("a", "m"): 3e-3, ("b", "m"): 1e-6}
    assert ten_steps(run_checks(refs, "a", floors={("a", "m"): 3e-3}, compared={("a", "m")}), "b").tolerance == 1e-4
    assert ten_steps(run_checks(refs, "a", floors=floors, compared={("a", "m")}), "b").tolerance == 1e-4
    assert ten_steps(run_checks(refs, "a", floors=floors, compared=set(floors)), "b").tolerance > 6e-3


def test_the_same_program_on_n_devices_uses_its_floor_without_a_float64_comparison():
    good = reference()
    refs = {("a", 1, "m"): good, ("a", 2, "m"): diverged(good, 5e-3)}
    [check] = [c for c in run_checks(refs, "a", floors={("a", "m"): 3e-3}) if c.check.startswith("10 steps")]
    assert check.passed and check.tolerance == pytest.approx(2 * 2 * 3e-3)


def test_float64_runs_are_compared_pairwise_and_a_third_backend_isolates_the_odd_one():
    """Large fp32 floors let an 8e-4 formula difference through the fp32 ten-step check; the
    float64 runs still differ by it, against 1e-8, and with a third backend only the odd one
    is blamed, the reference included."""
    from xbench.results.checks import failed_backends, referee_checks

    good, off = reference(), diverged(reference(), 8e-4)
    refs = {("a", 1, "m"): good, ("b", 1, "m"): off}
    floors = {("a", "m"): 3e-3, ("b", "m"): 1e-6}
    assert ten_steps(run_checks(refs, "a", floors=floors, compared=set(floors)), "b").passed
    checks = referee_checks({("a", "m"): good, ("b", "m"): off, ("c", "m"): good, ("c plain", "m"): good}, "a")
    assert {c.subject for c in checks} == {"m: b d1 vs a d1, float64", "m: c d1 vs a d1, float64",
                                           "m: c d1 vs b d1, float64", "m: c plain d1 vs c d1, float64"}
    assert {c.tolerance for c in checks} == {1e-8}
    assert [c.subject for c in checks if not c.passed] == ["m: b d1 vs a d1, float64", "m: c d1 vs b d1, float64"]
    assert failed_backends(checks) == {"b"}
    bad_reference = referee_checks({("a", "m"): off, ("b", "m"): good, ("c", "m"): good}, "a")
    assert failed_backends(bad_reference) == {"a"}


def test_a_program_of_the_same_backend_clears_nobody_and_another_model_clears_nobody():
    """The same wrong code in a backend and its plain program: only another backend clears;
    and passing on model n says nothing about model m."""
    from xbench.results.checks import failed_backends, referee_checks

    good, off = reference(), diverged(reference(), 8e-4)
    two = referee_checks({("jax", "m"): good, ("eps", "m"): off, ("eps plain", "m"): off}, "jax")
    assert failed_backends(two) == {"jax", "eps"}  # two backends: both, as ever; the plain program clears nobody
    three = referee_checks({("jax", "m"): good, ("eps", "m"): off, ("eps plain", "m"): off, ("other", "m"): good},
                           "jax")
    assert failed_backends(three) == {"eps"}
    runs = {(b, m): (off if (b, m) == ("eps", "m") else good) for b in ("jax", "eps", "other") for m in ("m", "n")}
    assert failed_backends(referee_checks(runs, "jax")) == {"eps"}
    runs[("jax", "n")], runs[("eps", "m")] = off, good  # now the reference is off, on model n only
    assert failed_backends(referee_checks(runs, "jax")) == {"jax"}


def test_a_program_whose_backend_has_no_float64_run_is_compared_with_every_backend():
    from xbench.results.checks import failed_backends, referee_checks

    good, off = reference(), diverged(reference(), 8e-4)
    checks = referee_checks({("jax", "m"): off, ("tf", "m"): good, ("torch plain", "m"): good}, "jax")
    assert {c.subject for c in checks} == {"m: tf d1 vs jax d1, float64", "m: torch plain d1 vs jax d1, float64",
                                           "m: torch plain d1 vs tf d1, float64"}
    assert failed_backends(checks) == {"jax"}


# -- real backends ---------------------------------------------------------------------------

def table_rows(out, check, subject):
    """The verify table's rows of `check` comparing `subject`, as stripped cells."""
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    return [row for row in rows if row[:2] == [check, subject]]


WIDE_MLP = """
devices = [1]
learning_rate = 0.001
seed = 1
[data]
samples = 1024
[[models]]
name = "w640"
widths = [640, 640, 640]
batch_sizes = [32]
"""


@pytest.mark.slow
def test_another_adam_epsilon_fails_the_float64_check(fake_backends, run_cli):
    """Keras's default epsilon (1e-7) moves ten fp32 steps of the medium MLP by about 7e-5,
    within the fp32 tolerance; the float64 runs differ by the same 7e-5 against 1e-8, and the
    third backend clears the reference."""
    code, out, err = run_cli("verify", "--backends", "jax", "jax-eps", "jax-shardmap", "--model", "medium",
                             "--devices", "1", "--single-device", "data-parallel")
    assert code == 1
    [fp32] = table_rows(out, "10 steps: losses and final weights", "medium: jax-eps d1 vs jax d1")
    [float64] = table_rows(out, "float64: 10 steps: losses and final weights", "medium: jax-eps d1 vs jax d1, float64")
    assert fp32[6] == "pass" and float64[6] == "FAIL" and float(float64[4]) > 1e-6
    assert err.split("verification failed for:")[1].split() == ["jax-eps"]


@pytest.mark.slow
def test_a_wide_relu_mlp_whose_rounding_is_amplified_passes_with_its_floor(run_cli, tmp_path):
    """3 x 640 at seed 1: ten fp32 steps of correct backends end about 7e-4 apart (a fixed 1e-4
    failed torch against jax); their float64 runs measure the floor that widens the tolerance.
    The amplification is fp32's own (a numpy fp32 loop shows it too), not one BLAS's."""
    (tmp_path / "wide.toml").write_text(WIDE_MLP)
    code, out, err = run_cli("verify", "--config", str(tmp_path / "wide.toml"), "--backends", "jax", "torch",
                             "--devices", "1", "--single-device", "data-parallel")
    assert code == 0, out + err
    [row] = table_rows(out, "10 steps: losses and final weights", "w640: torch d1 vs jax d1")
    norm_rel, tolerance = (float(cell) for cell in row[4:6])
    assert 1e-4 < norm_rel <= tolerance  # beyond the fixed tolerance, within the widened one
    assert "rounding floors ||fp32 - float64|| of ten steps (w640: jax" in " ".join(err.split())


@pytest.mark.slow
@pytest.mark.parametrize("broken, failing", [
    # No all-reduce: the applied gradient is one shard's, replicas drift, training diverges.
    ("jax-noreduce", {"gradients: N devices = 1 device", "replicas hold the same weights",
                      "10 steps: losses and final weights"}),
    # A sum instead of a mean: 2x gradients. Adam's steps are nearly scale-free, so only the
    # gradient check sees it, which is why verify compares gradients and not just losses.
    ("jax-sum", {"gradients: N devices = 1 device"}),
])
def test_broken_all_reduce_fails_verification(fake_backends, run_cli, broken, failing):
    code, out, err = run_cli("verify", "--backends", broken, "--devices", "2", "--model", "medium")
    assert code == 1
    failed = {line.split("│")[1].strip() for line in out.splitlines() if "FAIL" in line}
    assert failed == failing, out


@pytest.mark.slow
def test_compare_skips_timing_of_a_backend_that_fails_verification(fake_backends, run_cli, tmp_path):
    code, _, err = run_cli("compare", "--backends", "jax", "jax-sum", "--model", "medium", "--batch-sizes", "32",
                           "--devices", "1,2", "--repeats", "2", "--steps", "2", "--out", str(tmp_path / "run"))
    assert code == 1 and "verify jax-sum: FAILED" in " ".join(err.split())
    records = {r["trial_id"]: r for r in read_records(tmp_path / "run")}
    assert records["jax/medium/d2/b32/r0"]["status"] == "ok"
    assert records["jax/medium/d2/b32/r0"]["verification"]["status"] == "passed"
    assert records["jax-sum/medium/d2/b32/r0"]["status"] == "skipped"
    assert "verification failed" in records["jax-sum/medium/d2/b32/r0"]["reason"]
    assert json.loads((tmp_path / "run" / "verify.json").read_text())["failed_backends"] == ["jax-sum"]


def test_a_backend_without_the_capability_is_timed_but_marked(fake_backends, run_cli, tmp_path):
    code, _, err = run_cli("compare", "--backends", "numpy", "--model", "medium", "--batch-sizes", "16",
                           "--devices", "1", "--repeats", "2", "--steps", "2", "--out", str(tmp_path / "run"))
    assert code == 0 and "not verifiable" in err
    records = read_records(tmp_path / "run")
    assert len(records) == 2  # replicates
    assert all(r["status"] == "ok" and r["verification"]["status"] == "unverifiable" for r in records)


def test_no_verify_is_recorded(fake_backends, run_cli, tmp_path):
    code, _, _ = run_cli("compare", "--backends", "numpy", "--model", "medium", "--batch-sizes", "16",
                         "--devices", "1", "--repeats", "2", "--steps", "2", "--no-verify",
                         "--out", str(tmp_path / "run"))
    records = read_records(tmp_path / "run")
    assert code == 0 and all(r["verification"] == {"status": "skipped", "reason": "--no-verify"} for r in records)


def test_a_third_backend_clears_the_reference():
    """jax agrees with jax-shardmap, so a disagreement with a broken third backend is the
    third backend's fault alone; with only two backends both stay suspect."""
    good, off = reference(), reference(scale=1.5)
    refs = {("jax", 1, "m"): good, ("shardmap", 1, "m"): good, ("broken", 1, "m"): off}
    from xbench.results.checks import failed_backends

    assert failed_backends(run_checks(refs, reference_backend="jax")) == {"broken"}
    two = {("jax", 1, "m"): good, ("broken", 1, "m"): off}
    assert failed_backends(run_checks(two, reference_backend="jax")) == {"jax", "broken"}


def test_a_backend_failing_its_own_check_takes_the_blame():
    good, doubled = reference(), reference(scale=2.0, replicas=2)
    refs = {("jax", 1, "m"): good, ("jax", 2, "m"): reference(replicas=2),
            ("broken", 1, "m"): good, ("broken", 2, "m"): doubled}
    from xbench.results.checks import failed_backends

    assert failed_backends(run_checks(refs, reference_backend="jax")) == {"broken"}


def test_the_reference_failing_elsewhere_does_not_clear_a_disagreeing_backend():
    """jax's own 2-device all-reduce is broken, and `mine` disagrees with jax on 1 device:
    jax's d2 failure does not explain the d1 disagreement, so both are blamed (reviewer's case)."""
    from xbench.results.checks import failed_backends

    good = reference()
    refs = {("jax", 1, "m"): good, ("jax", 2, "m"): reference(scale=2.0, replicas=2),
            ("mine", 1, "m"): reference(scale=1.5)}
    assert failed_backends(run_checks(refs, reference_backend="jax")) == {"jax", "mine"}


def test_replicas_are_compared_in_the_worker_and_only_replica_0_is_stored(tmp_path):
    from xbench.wire import load_reference, save_reference
    from xbench.worker.capture import reference_run

    class TwoReplicas:
        name = "two"

        def gradients(self, prepared):
            return 1.0, [np.ones(3, np.float32)]

        def train(self, prepared, steps):
            return [1.0] * steps

        def replica_weights(self, prepared):
            return [[np.ones(3, np.float32)], [np.array([1, 1, 2], np.float32)]]

    ref = reference_run(TwoReplicas(), None, 2)
    save_reference(tmp_path / "r.npz", ref)
    loaded = load_reference(tmp_path / "r.npz")
    assert len(loaded.replicas) == 1 and loaded.replica_count == 2
    assert loaded.worst_replica_error()[0] == 1.0
    [check] = [c for c in run_checks({("two", 2, "m"): loaded}, "two") if c.check == "replicas hold the same weights"]
    assert not check.passed


# -- programs that run only in a low precision (bf16), unit tests -----------------------------

def perturbed(ref, start=0.0, steps=0.0, seed=2):
    """`ref` with its initial loss and gradients moved by `start` and its ten steps (loss curve
    and weights) by `steps`, normwise relative: what rounding in a lower precision does."""
    from xbench.results.checks import trajectory

    rng = np.random.default_rng(seed)

    def moved(arrays, relative):
        noise = [rng.normal(size=np.shape(a)) for a in arrays]
        scale = relative * np.linalg.norm(np.concatenate([np.ravel(a) for a in arrays]))
        scale /= np.linalg.norm(np.concatenate([n.ravel() for n in noise]))
        return [np.asarray(a) + scale * n for a, n in zip(arrays, noise)]

    loss, *grads = moved([np.array(ref.loss), *ref.gradients], start)
    losses, *weights = moved(trajectory(ref), steps)
    return Reference(float(loss), grads, list(losses), [weights])


def low_checks(programs, exact, precision_ref, no_float64=None):
    """precision_checks for backend "a", model "m", with "a"'s float64 run `exact` and its bf16
    run `precision_ref` (None: missing)."""
    from xbench.results.checks import precision_checks, precision_floors

    float64_runs = {} if exact is None else {("a", 1, "m"): exact}
    refs = {} if precision_ref is None else {("a", "m", "bf16"): precision_ref}
    floors, rejected = precision_floors(refs, float64_runs)
    return precision_checks(programs, float64_runs, floors, rejected, no_float64 or {}), floors


def test_a_bf16_program_within_bf16_noise_passes_and_one_an_o_0_1_gradient_off_fails_alone():
    """The floors of "a" in bf16 are 5e-3 (gradients) and 2e-3 (ten steps): a bf16 program
    1.5 x as far (another kernel, rounding elsewhere) passes; one whose gradients are 0.1 off
    fails the gradient check, and only it is blamed."""
    from xbench.results.checks import LOW_PRECISION_FACTOR, failed_backends

    exact = reference()
    bf16 = perturbed(exact, 5e-3, 2e-3)
    good, bad = perturbed(exact, 7.5e-3, 3e-3, seed=3), perturbed(exact, 0.1, 3e-3, seed=4)
    programs = {("a+fused", 1, "m", "bf16"): good, ("a+fused", 2, "m", "bf16"): good,
                ("a+wrong", 1, "m", "bf16"): bad}
    (checks, unchecked), floors = low_checks(programs, exact, bf16)
    assert unchecked == {} and floors[("a", "m", "bf16")] == pytest.approx((5e-3, 2e-3), rel=0.05)
    assert {c.check for c in checks} == {"bf16: initial loss and gradients vs float64", "bf16: 10 steps vs float64"}
    assert len(checks) == 6 and all(c.backends in {("a+fused",), ("a+wrong",)} for c in checks)
    start = [c for c in checks if c.check.startswith("bf16: initial")]
    assert [c.tolerance for c in start] == [pytest.approx(LOW_PRECISION_FACTOR * 5e-3, rel=0.05)] * 3
    assert [c.floor for c in start] == [pytest.approx(5e-3, rel=0.05)] * 3
    assert {c.subject for c in start} == {"m: a+fused d1 vs a d1, float64", "m: a+fused d2 vs a d1, float64",
                                          "m: a+wrong d1 vs a d1, float64"}
    assert [c.subject for c in checks if not c.passed] == ["m: a+wrong d1 vs a d1, float64"]
    assert failed_backends(checks) == {"a+wrong"}  # not "a", whose runs it was compared with


def test_a_bf16_program_has_no_check_without_a_trustworthy_bf16_or_float64_run_of_its_backend():
    from xbench.results.checks import LOW_PRECISION_MAX_TOLERANCE

    exact = reference()
    program = {("a+fused", 1, "m", "bf16"): perturbed(exact, 5e-3, 2e-3)}
    for float64, bf16, why in [
        (exact, None, "a has no bf16 run of m"),
        (None, perturbed(exact, 5e-3), "a has no float64 run of m on d1"),
        (exact, Reference(exact.loss, [g * np.nan for g in exact.gradients], exact.losses, exact.replicas),
         "its bf16 run is not finite"),
        (exact, perturbed(exact, 0.1), "more than bf16 rounding may move it"),  # a tolerance of 0.4 sees no 0.5
    ]:
        (checks, unchecked), _ = low_checks(program, float64, bf16)
        assert checks == [] and why in unchecked[("a+fused", 1, "m", "bf16")], unchecked
    assert LOW_PRECISION_MAX_TOLERANCE < 0.5  # a missing all-reduce on 2 devices is 0.5 off
    (checks, unchecked), _ = low_checks(program, None, perturbed(exact, 5e-3), {("a", 1, "m"): "crashed: killed"})
    assert unchecked[("a+fused", 1, "m", "bf16")] == "not verified in bf16: crashed: killed"


def medium_spec(devices=(1,)):
    from xbench.experiment import build_spec

    return build_spec({"models": [{"preset": "medium"}], "devices": list(devices)})



def bf16_lineup(*variants, as_written=True, single_device=("data-parallel",)):
    from xbench.contract import Variant
    from xbench.run.plan import AS_WRITTEN_VARIANT, Lineup

    chosen = tuple(Variant(name, "bf16 only", precisions=("bf16",)) for name in variants)
    return Lineup(((AS_WRITTEN_VARIANT,) if as_written else ()) + chosen, single_device)


def test_a_bf16_only_variant_is_planned_in_bf16_with_its_backends_references_under_ids_of_their_own():
    from xbench.results.checks import PRECISION_REFERENCE_REPLICATES, is_precision_reference, is_referee
    from xbench.run.verify_plan import verification_trials

    trials = verification_trials(medium_spec((1, 2)), ["a"], [2], lineups={"a": bf16_lineup("cudnn", "fused2")})
    by_role = {}
    for t in trials:
        stored = {"precision": t.precision, "replicate": t.replicate}
        role = "referee" if is_referee(stored) else "bf16 reference" if is_precision_reference(stored) else "program"
        by_role.setdefault(role, set()).add((t.implementation, t.devices, t.precision))
    assert by_role == {
        "program": {("a", 1, "fp32"), ("a", 2, "fp32"), ("a+cudnn", 1, "bf16"), ("a+cudnn", 2, "bf16"),
                    ("a+fused2", 1, "bf16"), ("a+fused2", 2, "bf16")},
        "referee": {("a", 1, "fp64")},  # R_f64; the bf16 programs cannot run float64
        "bf16 reference": {("a", 1, "bf16")},  # one for both variants
    }
    assert len({t.id for t in trials}) == len(trials)  # and so no arrays file overwrites another
    [bf16] = [t for t in trials if t.precision == "bf16" and t.variant == "as-written"]
    assert bf16.id.endswith(f"/r{PRECISION_REFERENCE_REPLICATES['bf16']}") and bf16.protocol.steps_per_call == 1


def test_the_as_written_program_is_planned_for_a_bf16_variant_whose_lineup_lacks_it():
    from xbench.run.verify_plan import verification_trials

    trials = verification_trials(medium_spec(), ["a"], [1], lineups={"a": bf16_lineup("cudnn", as_written=False)})
    assert sorted((t.implementation, t.precision, t.replicate) for t in trials) == [
        ("a", "bf16", 4), ("a", "fp32", 0), ("a", "fp64", 1), ("a+cudnn", "bf16", 0)]


def test_a_cnn_is_verified_in_float64_so_a_bf16_variant_is_checked_against_that_run():
    from xbench.experiment import build_spec
    from xbench.run.verify_plan import verification_trials

    spec = build_spec({"models": [{"preset": "resnet18"}], "devices": [1]})
    trials = verification_trials(spec, ["a"], [1], lineups={"a": bf16_lineup("cudnn")})
    assert sorted((t.implementation, t.precision, t.replicate) for t in trials) == [
        ("a", "bf16", 4), ("a", "fp64", 0), ("a+cudnn", "bf16", 0)]  # no referee: the run is float64


def saved_records(tmp_path, trials, runs, statuses=None):
    """Records of `trials` as verify's workers leave them: `runs` maps a trial to its Reference;
    `statuses` maps a trial id to (status, reason) instead (None: no record at all)."""
    from xbench.wire import save_reference

    records = []
    for t in trials:
        status, reason = (statuses or {}).get(t.id, ("ok", None)) or (None, None)
        if status is None:
            continue
        record = {"trial_id": t.id, "status": status, "reason": reason, "trial": t.to_dict()}
        if status == "ok":
            record["arrays"] = str(tmp_path / f"{t.id.replace('/', '_')}.npz")
            save_reference(Path(record["arrays"]), runs(t))
        records.append(record)
    return records


def float32(ref):
    return Reference(ref.loss, [g.astype(np.float32) for g in ref.gradients], ref.losses,
                     [[w.astype(np.float32) for w in r] for r in ref.replicas])


def bf16_runs(exact, programs):
    """Every trial's run: float64 for fp64, a little rounding for fp32, bf16's for bf16 (the
    programs' own from `programs` by implementation)."""
    def run(t):
        if t.precision == "fp64":
            return exact
        if t.precision == "fp32":
            return float32(perturbed(exact, 1e-7, 1e-7, seed=5))
        return programs.get(t.implementation) or perturbed(exact, 5e-3, 2e-3)
    return run


def test_a_bf16_result_of_the_as_written_program_is_kept_apart_from_its_fp32_result(tmp_path):
    from xbench.run.verification import _sorted_records
    from xbench.run.verify_plan import verification_trials

    trials = verification_trials(medium_spec(), ["a"], [1], lineups={"a": bf16_lineup("cudnn")})
    runs = _sorted_records(saved_records(tmp_path, trials, bf16_runs(reference(), {})), trials)
    fp32, bf16 = runs.refs[("a", 1, "medium")], runs.precision_refs[("a", "medium", "bf16")]
    assert fp32.gradients[0].dtype == np.float32 and bf16.gradients[0].dtype == np.float64
    assert relative_errors(bf16.gradients, fp32.gradients)[2] > 1e-3  # not the same run
    assert list(runs.refs) == [("a", 1, "medium")] and list(runs.programs) == [("a+cudnn", 1, "medium", "bf16")]


def test_verify_checks_a_bf16_variant_against_float64_and_blames_only_a_wrong_one(tmp_path):
    from xbench.run.verification import checks_as_dicts, verdict
    from xbench.run.verify_plan import verification_trials

    exact = reference()
    trials = verification_trials(medium_spec((1, 2)), ["a"], [2], lineups={"a": bf16_lineup("cudnn", "wrong")})
    wrong = Reference(exact.loss, [1.1 * g for g in exact.gradients], exact.losses, exact.replicas)
    programs = {"a+cudnn": perturbed(exact, 7e-3, 3e-3, seed=7), "a+wrong": perturbed(wrong, 5e-3, 2e-3, seed=8)}
    result = verdict(medium_spec((1, 2)), ["a"], trials, saved_records(tmp_path, trials, bf16_runs(exact, programs)))
    assert result.failed == {"a+wrong"} and result.problems == {}
    assert result.outcome("a+cudnn")["status"] == "passed" and result.outcome("a+cudnn")["checks"] == 4
    assert result.outcome("a")["status"] == "passed"
    failed = result.outcome("a+wrong")["failed"]
    assert len(failed) == 2 and all(line.startswith("bf16: initial loss and gradients vs float64") for line in failed)
    assert all("(floor 5.0e-03)" in line for line in failed)
    assert result.precision_floors == {("a", "medium", "bf16"): (pytest.approx(5e-3, rel=0.05),
                                                                 pytest.approx(2e-3, rel=0.05))}
    rows = [c for c in checks_as_dicts(result.checks) if c["check"].startswith("bf16:")]
    assert len(rows) == 8 and all(c["floor"] and c["tolerance"] > 1e-4 for c in rows)


@pytest.mark.parametrize("lost, status, why", [
    ("bf16", ("crashed", "worker killed by signal 9; last output: (none)"),
     "its bf16 run a/medium/d1/b32/r4 has no result (crashed: worker killed by signal 9"),
    ("bf16", None, "its bf16 run a/medium/d1/b32/r4 has no result (missing: its worker ended without reporting it)"),
    ("fp64", ("failed", "RuntimeError: no float64 here"), "a's float64 run a/medium/d1/b32/r1 has no result (failed"),
])
def test_a_bf16_variant_whose_backend_lost_a_reference_run_fails_with_the_reason(tmp_path, lost, status, why):
    from xbench.run.verification import verdict
    from xbench.run.verify_plan import verification_trials

    trials = verification_trials(medium_spec(), ["a"], [1], lineups={"a": bf16_lineup("cudnn")})
    [gone] = [t for t in trials if t.precision == lost and t.variant == "as-written"]
    records = saved_records(tmp_path, trials, bf16_runs(reference(), {}), {gone.id: status})
    result = verdict(medium_spec(), ["a"], trials, records)
    outcome = result.outcome("a+cudnn")
    assert outcome["status"] == "failed" and "a+cudnn" in result.failed
    assert not [c for c in result.checks if "a+cudnn" in c.backends]
    [line] = outcome["failed"]
    assert line.startswith("a/medium/d1/b32/cudnn/r0: not verified in bf16: ") and why in line, line


# -- what ran decides: a missing result is never "passed" -----------------

def fp32_runs(t):
    return reference() if t.precision == "fp64" else float32(perturbed(reference(), 1e-7, 1e-7, seed=5))


def plain_lineup():
    from xbench.contract import DATA_PARALLEL, PLAIN
    from xbench.run.plan import Lineup

    return Lineup(single_device=(DATA_PARALLEL, PLAIN))


def test_a_planned_trial_without_a_record_fails_and_what_only_it_was_compared_with_is_not_passed(tmp_path):
    """The issue's case: the data-parallel program's worker died without a record; the plain
    program, compared with nothing else, was "passed" with 0 checks."""
    from xbench.run.verification import verdict
    from xbench.run.verify_plan import verification_trials

    trials = verification_trials(medium_spec(), ["a"], [1], lineups={"a": plain_lineup()})
    records = saved_records(tmp_path, trials, fp32_runs, {"a/medium/d1/b32/r0": None})
    result = verdict(medium_spec(), ["a"], trials, records)
    assert result.failed == {"a", "a plain"} and result.checks == ()
    assert result.problems == {
        "a/medium/d1/b32/r0": "missing: its worker ended without reporting it",
        "a/medium/d1/b32/plain/r0": "not verified: a d1 has no result (a/medium/d1/b32/r0 missing: its worker ended "
                                    "without reporting it), so 'initial loss and gradients across backends' and "
                                    "'10 steps: losses and final weights' did not run"}
    for name in ("a", "a plain"):
        assert result.outcome(name)["status"] == "failed" and result.outcome(name)["failed"]


def test_one_program_on_one_device_is_unverifiable_not_passed(tmp_path):
    from xbench.run.verification import verdict
    from xbench.run.verify_plan import verification_trials

    trials = verification_trials(medium_spec(), ["a"], [1])
    result = verdict(medium_spec(), ["a"], trials, saved_records(tmp_path, trials, fp32_runs))
    assert result.checks == () and result.failed == set()
    why = "nothing to compare it with (one program on one device: no other result of its models)"
    assert result.outcome("a") == {"status": "unverifiable", "checks": 0, "failed": [], "reason": why}
    assert result.unverifiable == {"a": result.outcome("a")["reason"]}  # xbench verify exits 1: nothing was verified


def test_a_crashed_float64_run_is_a_problem_not_a_missing_floor(tmp_path):
    from xbench.run.verification import verdict
    from xbench.run.verify_plan import verification_trials

    trials = verification_trials(medium_spec(), ["a", "b"], [1])
    killed = ("crashed", "worker killed by signal 9; last output: (none)")
    result = verdict(medium_spec(), ["a", "b"], trials,
                     saved_records(tmp_path, trials, fp32_runs, {"b/medium/d1/b32/r1": killed}))
    assert result.failed == {"b"} and result.problems == {"b/medium/d1/b32/r1": f"{killed[0]}: {killed[1]}"}
    assert result.outcome("a")["status"] == "passed" and ("b", "medium") not in result.no_floor


@pytest.mark.parametrize("names, devices, crashed, failed", [
    # the reference's result is gone: what was to be compared with it is not verified
    (["a", "b"], (1, 2), "a/medium/d1/b32/r0", {"a", "b"}),
    # the other's, on 1 device only: the reference was compared with nothing else
    (["a", "b"], (1,), "b/medium/d1/b32/r0", {"a", "b"}),
    # ... with 2 devices it still was, with itself (as a backend verified alone is)
    (["a", "b"], (1, 2), "b/medium/d1/b32/r0", {"b"}),
    # a third backend's: the other two still compared each other
    (["a", "b", "c"], (1,), "c/medium/d1/b32/r0", {"c"}),
    # the N-device run's: its 1-device run and the other backend were still compared
    (["a", "b"], (1, 2), "b/medium/d2/b32/r0", {"b"}),
])
def test_a_crashed_result_fails_its_program_and_those_left_unverified(tmp_path, names, devices, crashed, failed):
    from xbench.run.verification import verdict
    from xbench.run.verify_plan import verification_trials

    spec = medium_spec(devices)
    trials = verification_trials(spec, names, devices)
    killed = ("crashed", "worker killed by signal 9; last output: (none)")
    result = verdict(spec, names, trials, saved_records(tmp_path, trials, fp32_runs, {crashed: killed}))
    assert result.failed == failed
    assert result.problems[crashed] == f"{killed[0]}: {killed[1]}"
    assert all(f"has no result ({crashed} crashed: worker killed by signal 9" in why
               for tid, why in result.problems.items() if tid != crashed)
    for name in names:
        assert result.outcome(name)["status"] == ("failed" if name in failed else "passed")


def test_a_bf16_only_variant_runs_in_bf16_against_float64_and_a_wrong_one_fails_alone(fake_backends, run_cli):
    """End to end through worker processes: numpy-mlp's "bf16" variant rounds like a
    mixed-precision program and passes; "bf16-scaled" applies 1.5 x its gradient and fails,
    blamed alone; the bf16 floors are shown with the checks they widen."""
    pytest.importorskip("ml_dtypes")
    code, out, err = run_cli("verify", "--backends", "numpy-mlp", "--variants", "all", "--devices", "2",
                             "--model", "medium", "--single-device", "data-parallel")
    assert code == 1, out + err
    flat = " ".join(err.split())
    assert err.split("verification failed for:")[1].split() == ["numpy-mlp+bf16-scaled"]
    assert "low-precision floors ||low - float64|| of each backend's as-written program on 1 device (medium: " \
           "numpy-mlp bf16 initial" in flat
    rows = [" ".join(line.split()) for line in out.splitlines() if line.startswith("│")]  # subjects may wrap
    failed = [row for row in rows if "FAIL" in row]
    assert len(failed) == 2, out  # d1 and d2
    assert all("bf16: initial loss and gradients vs float64" in row and "numpy-mlp+bf16-scaled d" in row
               for row in failed), out
    assert sum("bf16: 10 steps vs float64" in row for row in rows) == 4  # two variants on 1 and 2 devices


def test_a_variant_unsupported_for_one_model_is_verified_on_the_others(tmp_path):
    """channels-last refuses the transformer, cudnn the ResNet: such a variant passes on the
    models it runs, and is unverifiable only where it runs for none."""
    from xbench.contract import Variant
    from xbench.experiment import build_spec
    from xbench.run.plan import AS_WRITTEN_VARIANT, Lineup
    from xbench.run.verification import verdict
    from xbench.run.verify_plan import verification_trials

    spec = build_spec({"models": [{"preset": "medium"}, {"preset": "large"}], "devices": [1]})
    lineup = Lineup((AS_WRITTEN_VARIANT, Variant("tuned", "for medium only"), Variant("never", "runs nowhere")))
    trials = verification_trials(spec, ["a", "b"], [1], lineups={"a": lineup})
    refused = {t.id: ("unsupported", "not this model") for t in trials
               if t.variant == "never" or (t.variant == "tuned" and t.model.name == "large")}
    result = verdict(spec, ["a", "b"], trials, saved_records(tmp_path, trials, fp32_runs, refused))
    assert result.outcome("a+tuned")["status"] == "passed" and result.outcome("a+tuned")["checks"]
    assert result.outcome("a+never")["status"] == "unverifiable"


def test_a_bf16_variant_is_not_passed_against_a_backend_whose_own_program_failed(tmp_path):
    """The cudnn variant shares its backend's model: where the backend's own program fails
    (a wrong GELU, say), the bf16 program must not pass against that backend's float64 run."""
    from xbench.run.verification import verdict
    from xbench.run.verify_plan import verification_trials

    exact = reference()
    wrong = Reference(exact.loss * 1.01, [1.05 * g for g in exact.gradients], exact.losses, exact.replicas)

    def runs(t):
        if t.backend == "b":
            return bf16_runs(exact, {})(t)
        return bf16_runs(wrong, {})(t)  # every run of "a", float64 included, computes the wrong model

    spec = medium_spec()
    trials = verification_trials(spec, ["b", "a"], [1], lineups={"a": bf16_lineup("cudnn")})
    result = verdict(spec, ["b", "a"], trials, saved_records(tmp_path, trials, runs))
    assert "a" in result.failed and "a+cudnn" in result.failed
    assert any("failed its own checks" in line for line in result.outcome("a+cudnn")["failed"])


def test_verify_runs_its_workers_side_by_side_as_compare_does(fake_backends, run_cli, monkeypatch):
    """`xbench verify` used to run its reference runs one at a time (16 GPT-2 small runs on
    4 x H200: 6 done in 190 s); it now runs as many at once as compare's verification."""
    from xbench.cli import verify_cmd
    from xbench.errors import XbenchError
    from xbench.run.verify_phase import parallel_verification

    asked = {}

    def stop(*args, **kwargs):
        asked.update(kwargs)
        raise XbenchError("stopped before any worker started")

    monkeypatch.setattr(verify_cmd, "run_verification", stop)
    code, _, err = run_cli("verify", "--backends", "numpy", "--model", "medium", "--devices", "1")
    assert code == 2 and "stopped before any worker started" in err
    assert asked["parallel"] == parallel_verification({"numpy": {"simulated": True}}) >= 1
