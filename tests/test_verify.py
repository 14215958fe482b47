"""The verification checks: unit tests on synthetic references, then real backends."""

import json

import numpy as np
import pytest

from xbench.records import read_records
from xbench.verify import Reference, errors, run_checks, verification_batch


def reference(scale=1.0, replicas=1, drift=0.0, seed=0):
    rng = np.random.default_rng(seed)
    grads = [rng.normal(size=(4, 3)) * scale, rng.normal(size=3) * scale]
    weights = [rng.normal(size=(4, 3)), rng.normal(size=3)]
    return Reference(loss=1.5, gradients=grads, losses=[1.5, 1.4, 1.3],
                     replicas=[[w + drift * r for w in weights] for r in range(replicas)])


def test_errors_of_identical_arrays_are_zero():
    a = [np.arange(6.0).reshape(2, 3)]
    assert errors(a, a) == (0.0, 0.0, 0.0)


def test_errors_normwise_and_elementwise():
    max_abs, max_rel, norm_rel = errors([np.array([1.0, 2.0])], [np.array([1.0, 1.0])])
    assert max_abs == 1.0 and max_rel == 1.0 and norm_rel == pytest.approx(1 / np.sqrt(2))


def test_errors_treat_nan_as_infinite():
    assert errors([np.array([np.nan])], [np.array([1.0])])[2] == float("inf")


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
    from xbench.verify import trajectory

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
    from xbench.verify import FLOOR_FACTOR

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
    from xbench.spec import build_spec
    from xbench.verify import REFEREE_PRECISION, is_referee, verification_trials

    from xbench.contract import PLAIN
    from xbench.plan import Lineup

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
    from xbench.verify import rounding_floors

    good = reference()
    refs = {("a", 1, "m"): good, ("a", 2, "m"): diverged(good, 0.3)}
    floors, rejected = rounding_floors(refs, {("a", "m"): diverged(good, 2e-3)})
    assert floors == {("a", "m"): pytest.approx(2e-3, rel=0.05)} and rejected == {}


def test_a_float64_run_of_another_model_in_float32_or_blown_up_gives_no_floor():
    from xbench.verify import rounding_floors

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
    from xbench.verify import failed_backends, referee_checks

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
    from xbench.verify import failed_backends, referee_checks

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
    from xbench.verify import failed_backends, referee_checks

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
def test_tf_and_jax_pass_on_two_devices(run_cli):
    code, out, err = run_cli("verify", "--backends", "tf", "jax", "--devices", "2")
    assert code == 0, out + err
    flat = " ".join(out.split())
    for subject in ("medium: tf d2 vs tf d1", "large: jax d2 vs jax d1", "large: jax d1 vs tf d1"):
        assert subject in flat
    assert "FAIL" not in out and "checks passed" in err


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
    from xbench.verify import failed_backends

    assert failed_backends(run_checks(refs, reference_backend="jax")) == {"broken"}
    two = {("jax", 1, "m"): good, ("broken", 1, "m"): off}
    assert failed_backends(run_checks(two, reference_backend="jax")) == {"jax", "broken"}


def test_a_backend_failing_its_own_check_takes_the_blame():
    good, doubled = reference(), reference(scale=2.0, replicas=2)
    refs = {("jax", 1, "m"): good, ("jax", 2, "m"): reference(replicas=2),
            ("broken", 1, "m"): good, ("broken", 2, "m"): doubled}
    from xbench.verify import failed_backends

    assert failed_backends(run_checks(refs, reference_backend="jax")) == {"broken"}


def test_the_reference_failing_elsewhere_does_not_clear_a_disagreeing_backend():
    """jax's own 2-device all-reduce is broken, and `mine` disagrees with jax on 1 device:
    jax's d2 failure does not explain the d1 disagreement, so both are blamed (reviewer's case)."""
    from xbench.verify import failed_backends

    good = reference()
    refs = {("jax", 1, "m"): good, ("jax", 2, "m"): reference(scale=2.0, replicas=2),
            ("mine", 1, "m"): reference(scale=1.5)}
    assert failed_backends(run_checks(refs, reference_backend="jax")) == {"jax", "mine"}


def test_replicas_are_compared_in_the_worker_and_only_replica_0_is_stored(tmp_path):
    from xbench.verify import load_reference, reference_run, save_reference

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
