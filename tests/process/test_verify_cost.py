"""What verification plans, and leaves out, so that it costs less with the same checks."""

import pytest

from tests.process.test_verify import diverged, float32, medium_spec, perturbed, reference, saved_records


def lineup(*variants, single_device=("data-parallel",)):
    from xbench.run.plan import AS_WRITTEN_VARIANT, Lineup

    return Lineup((AS_WRITTEN_VARIANT, *variants), single_device)


def same(name):
    from xbench.contract import Variant

    return Variant(name, "the same arithmetic, compiled", same_formula=True)


def test_a_variant_of_the_same_formula_borrows_its_as_written_floor_and_another_keeps_its_referee():
    from xbench.contract import DATA_PARALLEL, PLAIN, Variant
    from xbench.results.checks import is_referee
    from xbench.run.verify_plan import borrowed_floors, verification_trials

    kernel = Variant("kernel", "another attention kernel")
    trials = verification_trials(medium_spec((1, 2)), ["a"], [2],
                                 lineups={"a": lineup(same("compiled"), kernel,
                                                      single_device=(DATA_PARALLEL, PLAIN))})
    referees = {t.implementation for t in trials if is_referee({"precision": t.precision, "replicate": t.replicate})}
    assert referees == {"a", "a plain", "a+kernel", "a plain+kernel"}
    assert borrowed_floors(trials) == {("a+compiled", "medium"): ("a", "medium"),
                                       ("a plain+compiled", "medium"): ("a plain", "medium")}
    # everything else is planned as before: each program on 1 and 2 devices, and its probe
    assert {(t.implementation, t.devices) for t in trials if t.variant == "compiled" and t.replicate == 0} == {
        ("a+compiled", 1), ("a plain+compiled", 1), ("a+compiled", 2)}


def test_a_same_formula_variant_keeps_its_referee_where_its_as_written_program_has_none():
    """Borrowing needs a float64 run to borrow: without its as-written program's, a variant
    of the same formula is refereed itself."""
    from xbench.results.checks import REFEREE_PRECISION
    from xbench.run.verify_plan import referee_trials, verification_trials

    trials = verification_trials(medium_spec(), ["a"], [1], lineups={"a": lineup(same("compiled"))})
    fp32 = [t for t in trials if t.precision == "fp32" and t.replicate == 0 and t.variant == "compiled"]
    assert [t.precision for t in referee_trials(fp32, {("a", "compiled")})] == [REFEREE_PRECISION]


@pytest.mark.parametrize("floor, away, passes", [
    (3e-3, 4e-3, True),  # rounds as much as its as-written program: within that one's floor
    (1e-7, 8e-4, False),  # another Adam epsilon where rounding is small: the fixed 1e-4 holds
])
def test_a_same_formula_variant_is_held_to_its_as_written_programs_floor(tmp_path, floor, away, passes):
    from xbench.run.verification import verdict
    from xbench.run.verify_plan import verification_trials

    exact = reference()
    fp32 = {"a": diverged(exact, floor, seed=3), "b": perturbed(exact, 1e-7, 1e-7, seed=5),
            "a+compiled": diverged(exact, away, seed=4)}

    def runs(t):
        return exact if t.precision == "fp64" else float32(fp32[t.implementation])

    spec = medium_spec()
    trials = verification_trials(spec, ["a", "b"], [1], lineups={"a": lineup(same("compiled"))})
    result = verdict(spec, ["a", "b"], trials, saved_records(tmp_path, trials, runs))
    assert result.floor_of == {"a+compiled": "a"} and ("a+compiled", "medium") not in result.floors
    [check] = [c for c in result.checks if c.check.startswith("10 steps") and c.backends[0] == "a+compiled"]
    assert check.floor == pytest.approx(2 * floor, rel=0.05)  # a's floor twice: the variant's and a's
    assert check.tolerance == max(1e-4, 2 * check.floor)
    assert result.outcome("a+compiled")["status"] == ("passed" if passes else "failed")
    assert result.outcome("b")["status"] == "passed" and result.problems == {}


def test_a_same_formula_variant_with_wrong_gradients_fails_alone(tmp_path):
    from xbench.run.verification import verdict
    from xbench.run.verify_plan import verification_trials
    from xbench.wire import Reference

    exact = reference()
    wrong = Reference(exact.loss, [1.05 * g for g in exact.gradients], exact.losses, exact.replicas)

    def runs(t):
        if t.precision == "fp64":
            return exact
        return float32(perturbed(wrong if t.variant == "compiled" else exact, 1e-7, 1e-7, seed=5))

    spec = medium_spec((1, 2))
    trials = verification_trials(spec, ["a", "b"], [2], lineups={"a": lineup(same("compiled"))})
    result = verdict(spec, ["a", "b"], trials, saved_records(tmp_path, trials, runs))
    assert result.failed == {"a+compiled"}
    assert any(line.startswith("initial loss and gradients") for line in result.outcome("a+compiled")["failed"])


def test_the_built_in_variants_that_change_kernels_or_code_keep_their_float64_runs():
    """jnp and functional are other code, cudnn another attention kernel: each keeps its own
    float64 run; compiled, graph-captured, fused, recomputed and sharded steps do not."""
    from xbench_backends.jax.pmap import VARIANTS as JAX
    from xbench_backends.torch.ddp import VARIANTS as TORCH

    assert {v.name for v in (*JAX, *TORCH) if not v.same_formula} == {"jnp", "functional", "cudnn", "fsdp-cudnn"}


# -- nothing is run that cannot fit ---------------------------------------------------------

def gpt2_spec(devices=(1,)):
    from xbench.experiment import build_spec

    return build_spec({"models": [{"preset": "gpt2-small", "batch_sizes": [16]}], "devices": list(devices)})


SIMULATED = {"a": {"simulated": True, "platform": "cpu"}, "b": {"simulated": True, "platform": "cpu"}}


def test_a_full_size_probe_that_does_not_fit_the_devices_memory_is_not_run(monkeypatch):
    from xbench.results.full_size import is_full_size
    from xbench.run.verification import unfit_probes
    from xbench.run.verify_plan import verification_trials

    trials = verification_trials(gpt2_spec((1, 2)), ["a", "b"], [2])
    probes = {t.id for t in trials if is_full_size({"replicate": t.replicate})}
    assert len(probes) == 4
    monkeypatch.delenv("XBENCH_DEVICE_MEMORY_GIB", raising=False)
    assert unfit_probes(trials, {}, SIMULATED, {}) == {}  # simulated devices: the host's memory, unchecked
    monkeypatch.setenv("XBENCH_DEVICE_MEMORY_GIB", "64")
    assert unfit_probes(trials, {}, SIMULATED, {}) == {}
    monkeypatch.setenv("XBENCH_DEVICE_MEMORY_GIB", "1")  # 124 M parameters and Adam: ~2 GiB
    unfit = unfit_probes(trials, {}, SIMULATED, {})
    assert set(unfit) == probes
    assert all(why.startswith("full size not probed: does not fit: needs ~") and "has 1 GiB" in why
               for why in unfit.values()), unfit


def test_a_program_whose_probe_was_not_run_is_unverifiable_with_the_reason(tmp_path, monkeypatch):
    from tests.process.test_verify import fp32_runs
    from xbench.run.verification import unfit_probes, verdict
    from xbench.run.verify_plan import verification_trials

    spec = gpt2_spec()
    trials = verification_trials(spec, ["a", "b"], [1])
    monkeypatch.setenv("XBENCH_DEVICE_MEMORY_GIB", "1")
    unfit = unfit_probes(trials, {}, SIMULATED, {})
    records = saved_records(tmp_path, [t for t in trials if t.id not in unfit], fp32_runs)
    records += [{"trial_id": t.id, "status": "skipped", "reason": unfit[t.id], "trial": t.to_dict()}
                for t in trials if t.id in unfit]
    result = verdict(spec, ["a", "b"], trials, records)
    for name in ("a", "b"):
        outcome = result.outcome(name)
        assert outcome["status"] == "unverifiable", outcome
        assert outcome["reason"].startswith("gpt2-small on 1 device(s): full size not probed: does not fit")
    assert result.problems == {}


# -- as many at once as the host and the GPUs' memory hold ---------------------------------

@pytest.mark.parametrize("cores, gpus, expected", [(16, 1, 8), (32, 2, 16), (128, 8, 64), (64, 1, 8), (2, 1, 1)])
def test_verification_runs_one_worker_per_two_cores_and_at_most_eight_per_gpu(monkeypatch, cores, gpus, expected):
    from xbench.run import verify_phase

    monkeypatch.setattr(verify_phase.os, "cpu_count", lambda: cores)
    found = {"jax": {"simulated": False, "platform": "gpu", "available": gpus}}
    assert verify_phase.parallel_verification(found) == expected


def test_verification_workers_at_once_are_as_many_as_the_largest_runs_memory_allows(monkeypatch):
    from xbench.run.memory_check import memory_checks
    from xbench.run.verify_memory import memory_parallel
    from xbench.run.verify_plan import verification_trials

    trials = verification_trials(gpt2_spec((1, 2)), ["a"], [2])
    monkeypatch.delenv("XBENCH_DEVICE_MEMORY_GIB", raising=False)
    assert memory_parallel(memory_checks(trials, {}, SIMULATED, {}), 1) is None  # not known: no bound
    monkeypatch.setenv("XBENCH_DEVICE_MEMORY_GIB", "16")
    checks = memory_checks(trials, {}, SIMULATED, {})
    largest = max(c.estimate.total for c in checks.values())
    one = memory_parallel(checks, 1)
    assert one is not None and 1 <= one < 16 and one * (largest + 2**30) <= 16 * 2**30 * 0.95
    assert memory_parallel(checks, 2) == 2 * one


@pytest.mark.parametrize("workers, gpus, widest, per_gpu", [(1, 1, 1, 1), (2, 2, 1, 1), (3, 1, 1, 3), (5, 2, 1, 3),
                                                            (2, 2, 2, 2), (6, 2, 2, 6), (3, 2, 2, 3), (4, 4, 2, 2)])
def test_a_gpu_holds_as_many_workers_as_their_devices_can_put_on_it(workers, gpus, widest, per_gpu):
    from xbench.run.verify_memory import workers_per_gpu

    assert workers_per_gpu(workers, gpus, widest) == per_gpu


def test_workers_that_share_a_gpu_are_each_told_their_share_of_its_memory(monkeypatch):
    """The usable memory (95 %) split evenly, less each worker's context outside its framework's
    pool; nothing where a worker has its GPU to itself or the memory is not known."""
    from xbench.contract import MEMORY_SHARE_VARIABLE
    from xbench.run.memory_check import memory_checks
    from xbench.run.verify_memory import memory_parallel, memory_share_environment
    from xbench.run.verify_plan import verification_trials

    trials = verification_trials(gpt2_spec((1, 2)), ["a"], [2])
    monkeypatch.delenv("XBENCH_DEVICE_MEMORY_GIB", raising=False)
    assert memory_share_environment(memory_checks(trials, {}, SIMULATED, {}), 4, 1) == {}  # not known
    monkeypatch.setenv("XBENCH_DEVICE_MEMORY_GIB", "100")
    checks = memory_checks(trials, {}, SIMULATED, {})
    assert memory_share_environment(checks, 1, 1) == {} == memory_share_environment(checks, 2, 2)
    assert memory_share_environment(checks, 4, 1) == {MEMORY_SHARE_VARIABLE: f"{(0.95 / 4 - 0.01):.4f}"}
    assert memory_share_environment(checks, 5, 1) == {}  # many small runs a GPU: uncapped, as measured
    # 2-device jobs on 2 GPUs: both on each GPU, as on one
    assert memory_share_environment(checks, 2, 2, widest=2) == memory_share_environment(checks, 2, 1)
    assert memory_parallel(checks, 2, widest=2) == memory_parallel(checks, 1) < memory_parallel(checks, 2)


@pytest.mark.parametrize("given, share", [("", None), ("0.25", 0.25), ("1", 1.0), ("0", None), ("1.5", None),
                                          ("half", None)])
def test_a_backend_reads_its_share_of_the_devices_memory(monkeypatch, given, share):
    from xbench.contract import MEMORY_SHARE_VARIABLE, memory_share

    monkeypatch.setenv(MEMORY_SHARE_VARIABLE, given)
    assert memory_share() == share


def test_verify_says_the_largest_runs_memory_peak_and_each_workers_cap():
    from xbench.report.verify_text import memory_caption
    from xbench.run.verify_memory import memory_peaks

    trial, worker = "trial", "worker process"  # a peak of this run's own, or perhaps an earlier one's
    records = [{"trial_id": "a/m/d1/fp32/r0", "status": "ok",
                "framework_memory": {"peak_bytes": [2**30, 3 * 2**30], "scope": trial}},
               {"trial_id": "b/m/d1/fp32/r0", "status": "failed",
                "framework_memory": {"peak_bytes": [9 * 2**30], "scope": trial}},
               {"trial_id": "d/m/d1/fp32/r0", "status": "ok", "framework_memory": {"peak_bytes": [9 * 2**30],
                                                                                   "scope": worker}},
               {"trial_id": "c/m/d1/fp32/r0", "status": "ok"}]
    peaks = memory_peaks(records)
    assert peaks == {"a/m/d1/fp32/r0": 3 * 2**30}
    assert memory_caption({}, None) is None  # CPUs: no framework peak
    assert memory_caption(peaks, None) == ("memory: the largest run held 3.0 GiB on a device at its peak "
                                           "(a/m/d1/fp32/r0).")
    assert "each capped at 31.7% of its memory" in (memory_caption(peaks, 0.3167) or "")


# -- a plan counts verification only where the run verifies ---------------------------------

RUN = {"run_id": "r", "command": "xbench compare", "spec": {"protocol": {}}}

@pytest.mark.parametrize("saved, no_verify, resumed, expected", [
    ({}, False, False, True),
    ({}, True, False, False),
    ({"no_verify": True}, False, True, False),  # a --resume of a --no-verify run: not verified
    ({"no_verify": False}, False, True, True),
    ({"no_verify": False}, False, False, True),
])
def test_a_resumed_run_that_started_without_verify_plans_no_verification(tmp_path, saved, no_verify, resumed,
                                                                         expected):
    from xbench.results.records import RUN_FILE, write_json
    from xbench.run.verify_phase import verifies

    write_json(tmp_path / RUN_FILE, {**RUN, **saved})
    assert verifies(tmp_path, ["a"], no_verify, resumed) is expected


def test_a_resumed_run_whose_start_verified_everything_plans_no_verification(tmp_path):
    from xbench.results.records import RUN_FILE, write_json
    from xbench.run.verify_phase import VERIFY_FILE, verifies

    write_json(tmp_path / RUN_FILE, {**RUN, "no_verify": False})
    write_json(tmp_path / VERIFY_FILE, {"outcomes": {"a": {"status": "passed"}}})
    assert not verifies(tmp_path, ["a"], False, True)
    assert verifies(tmp_path, ["a", "b"], False, True)  # b's outcome is not there: verified again
