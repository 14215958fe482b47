"""The plan's cost said before a run (`xbench.run.estimate`) and `compare --dry-run`, which
prints it and starts nothing."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from xbench.cli.main import main
from xbench.contract import Trial
from xbench.contract.timing import TimingProtocol
from xbench.experiment import load_spec
from xbench.models.model_spec import preset_model
from xbench.run import estimate as est
from xbench.run.plan import Lineup

COSTS = est.Costs(flops=1e9, shared_host=True, start_s=1.0, import_s=4.0, first_call_s=0.5, per_array_s=0.25,
                  step_overhead_s=0.0, fixed_s=10.0, verify_run_s=2.0, verify_parallel=2)


def trial(batch: int, devices: int = 1, **protocol) -> Trial:
    model = preset_model("medium")  # 298,112 FLOPs per sample, 8 parameter arrays
    return Trial(backend="jax", model=model, devices=devices, global_batch=batch, scaling="strong", precision="fp32",
                 platform="cpu", learning_rate=1e-3, seed=0, samples=4096,
                 protocol=TimingProtocol(**{"warmup_steps": 2, "steps": 4, "repeats": 5, "min_window_s": 0.1,
                                            "window_budget_s": 1.0, **protocol}))


def test_a_step_is_its_flops_over_the_hosts_speed_shared_by_simulated_devices():
    # 298,112 x 1,000 FLOPs at 1 GFLOP/s, efficiency 1: 0.298 s, on 1 simulated device or 2
    assert est.step_seconds(trial(1000), COSTS, 1.0) == pytest.approx(0.298112)
    assert est.step_seconds(trial(1000, devices=2), COSTS, 1.0) == pytest.approx(0.298112)
    gpus = replace(COSTS, shared_host=False)
    assert est.step_seconds(trial(1000, devices=2), gpus, 1.0) == pytest.approx(0.298112 / 2)


def test_a_fast_trial_is_its_compilation_and_five_minimum_windows():
    # batch 1: 0.3 ms a step, so a window needs 4 x 84 steps to last 0.1 s: 5 windows of 0.1 s
    t = trial(1)
    seconds = est.trial_seconds(t, COSTS, 1.0)
    step = 298112 / 1e9
    window = 4 * -(-0.1 // (4 * step)) * step
    assert seconds == pytest.approx(0.5 + 8 * 0.25 + 2 * step + 5 * window)
    assert 2.9 < seconds < 3.1


def test_a_slow_trial_times_its_least_windows_and_no_more():
    # batch 10,000: 2.98 s a step, a window of 4 steps is 11.9 s: the first passes the 1 s budget,
    # yet every replicate times `least_windows` (5) windows; with 10 repeats it still stops there
    step = 2.98112
    assert est.trial_seconds(trial(10_000), COSTS, 1.0) == pytest.approx(0.5 + 2.0 + 2 * step + 5 * 4 * step)
    assert est.trial_seconds(trial(10_000, repeats=10), COSTS, 1.0) == pytest.approx(0.5 + 2.0 + 2 * step + 20 * step)


def test_fast_windows_run_every_repeat_within_the_window_budget():
    step = 298112 / 1e9  # batch 1: windows of 0.1 s, 10 of them fill the 1 s budget
    window = 4 * -(-0.1 // (4 * step)) * step
    assert est.trial_seconds(trial(1, repeats=20), COSTS, 1.0) == pytest.approx(0.5 + 2.0 + 2 * step + 10 * window)


def test_timing_pays_each_worker_process_and_each_backends_import_once():
    trials = [replace(trial(1), replicate=r, devices=d) for r, d in itertools.product(range(2), (1, 2))]
    seconds, processes = est.timing_seconds(trials, COSTS, 1.0)
    assert processes == 4
    assert seconds == pytest.approx(4.0 + 4 * 1.0 + sum(est.trial_seconds(t, COSTS, 1.0) for t in trials))


def test_verification_runs_share_the_parallel_workers():
    trials = [trial(1)] * 4  # 2 s each and 8 arrays x 0.25 s, two at a time
    assert est.verify_seconds(trials, COSTS) == pytest.approx(4 * (2.0 + 2.0) / 2)


def spec(**overrides):
    base = {"backends": ["jax"], "models": ["medium"], "batch_sizes": [32], "devices": [1, 2], "replicates": 2,
            "order_seed": 1, "interval_target": 0.1, "time_budget_s": 120.0}
    return load_spec(None, {**base, **overrides})


def test_the_estimate_adds_the_phases_and_ends_adaptive_rounds_at_the_time_budget():
    found = est.estimate(spec(), ["jax"], {"jax": Lineup()}, {"jax": "subprocess"}, COSTS, "cpu")
    assert (found.configurations, found.trials, found.processes) == (2, 4, 4)
    assert found.verify_runs > 0 and found.verify_s > 0
    assert found.timing_s < 120 and found.timing_max_s == 120.0
    assert found.total_s == pytest.approx(10.0 + found.verify_s + found.timing_s)
    assert found.total_max_s == pytest.approx(10.0 + found.verify_s + 120.0)
    lines = est.plan_lines(found, 2)
    assert lines[0].startswith("plan: 2 configuration(s) x 2 replicate(s); estimated ")
    assert "up to the 120 s time budget" in lines[0]
    assert lines[1].startswith("cheaper: --time-budget 0") and "--no-verify" in lines[1]


def test_without_verification_or_a_time_budget_only_the_planned_replicates_count():
    quiet = spec(time_budget_s=0.0)
    found = est.estimate(quiet, ["jax"], {"jax": Lineup()}, {"jax": "subprocess"}, COSTS, "cpu", verify=False)
    assert found.verify_runs == 0 and found.verify_s == 0 and found.timing_max_s == found.timing_s
    assert "no verification" in est.plan_lines(found, 2)[0]


def test_a_resumed_run_counts_only_the_trials_left():
    s = spec()
    everything = est.estimate(s, ["jax"], {"jax": Lineup()}, {"jax": "subprocess"}, COSTS, "cpu")
    from xbench.run.plan import plan_trials

    done = {t.id for t in plan_trials(s, ["jax"])[:3]}
    rest = est.estimate(s, ["jax"], {"jax": Lineup()}, {"jax": "subprocess"}, COSTS, "cpu", done=done)
    assert (everything.trials, rest.trials) == (4, 1)


@pytest.mark.parametrize(("seconds", "text"), [(3, "3 s"), (42, "40 s"), (174, "3 min"), (3780, "1 h 03 min")])
def test_durations_read_as_a_user_reads_them(seconds, text):
    assert est.duration(seconds) == text


def test_the_host_speed_is_the_fastest_product_times_the_cores(monkeypatch):
    ticks = iter(range(1000))
    monkeypatch.setattr(est, "usable_cores", lambda: 2)
    # each clock() call advances 1 s: every product "takes" 1 s, and the probe stops at once
    assert est.host_flops(clock=lambda: float(next(ticks)), seconds=0.5) == pytest.approx(2 * 64**3 * 2)


def test_dry_run_prints_the_plan_and_starts_nothing(capsys, monkeypatch):
    monkeypatch.setattr(est, "host_flops", lambda *a, **k: 2e11)
    code = main(["compare", "--backends", "jax", "--model", "medium", "--global-batch", "32", "--devices", "1", "2",
                 "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "dry run: jax on 1/2 device(s); nothing started" in out
    assert "plan: 3 configuration(s) x 2 replicate(s); estimated" in out  # plain and data-parallel on 1, 1 on 2


@pytest.mark.parametrize("bad", [["--devices", "1", "x"], ["--model", "no-such-model"], ["--backends", "nope"],
                                 ["--option", "jax.nope=1"], ["--variants", "jax:nope"]])
def test_dry_run_with_bad_input_prints_the_runs_own_one_line_error(bad, capsys):
    base = ["compare", "--backends", "jax", *bad]
    assert main([*base, "--dry-run"]) == 2
    dry = capsys.readouterr()
    assert main(base) == 2  # the run refuses it before any worker starts (the unit tier would catch one)
    run = capsys.readouterr()
    assert dry.err == run.err and dry.err.startswith("error:") and len(dry.err.strip().splitlines()) == 1
    assert not dry.out


class Declares:
    """A backend's declared first calls (`DeclaresFirstCall`), by platform."""

    def __init__(self, per_array=None, **seconds) -> None:
        self.first_call_s = seconds
        if per_array is not None:
            self.first_call_per_array_s = per_array


def test_per_array_first_calls_come_from_the_backend_and_its_compiling_variants():
    from xbench.contract import Variant
    from xbench.run.plan import Lineup

    costs = est.costs_for("gpu", None, {"torch": Declares(per_array={"gpu": 0.002}, gpu=0.05), "tf": object()})
    assert costs.per_arrays == {"torch": 0.002}
    eager = replace(trial(1), backend="torch")
    compiled = replace(eager, variant="compile")
    assert est.compile_seconds(eager, costs) == pytest.approx(0.05 + 8 * 0.002)  # the medium MLP: 8 arrays
    lineup = Lineup(variants=(Variant("compile", "traced", first_call_per_array_s=0.2),))
    with_compile = est.with_variants(costs, {"torch": lineup}, "gpu")
    assert est.compile_seconds(compiled, with_compile) == pytest.approx(0.05 + 8 * 0.2)
    assert est.compile_seconds(eager, with_compile) == pytest.approx(0.05 + 8 * 0.002)
    assert est.with_variants(costs, {"torch": lineup}, "cpu") is costs  # measured on GPUs only
    undeclared = est.compile_seconds(replace(trial(1), backend="tf"), costs)
    assert undeclared == pytest.approx(4.0 + 8 * est.GPU_COSTS.per_array_s)


def test_a_backends_declared_first_call_replaces_the_platforms():
    costs = replace(COSTS, first_calls={"jax": 7.5})
    arrays = 8 * 0.25  # the medium MLP's parameter arrays
    assert est.compile_seconds(trial(1), costs) == pytest.approx(7.5 + arrays)
    assert est.compile_seconds(replace(trial(1), backend="tf"), costs) == pytest.approx(0.5 + arrays)
    # verification: its run's figure with the backend's first call in place of the platform's
    assert est.verify_seconds([trial(1)] * 2, costs) == pytest.approx(2 * (2.0 + 7.5 - 0.5 + arrays) / 2)


def test_the_costs_take_each_backends_declaration_for_the_platform():
    backends = {"jax": Declares(cpu=0.6, gpu=7.5), "torch": Declares(gpu=0.05), "tf": object()}
    assert est.costs_for("gpu", None, backends).first_calls == {"jax": 7.5, "torch": 0.05}
    cpu = est.costs_for("cpu", 1e9, backends)
    assert cpu.first_calls == {"jax": 0.6} and cpu.flops == 1e9
    assert cpu.first_call("torch") == est.CPU_COSTS.first_call_s  # declared for GPUs only
    assert est.costs_for("gpu").first_calls == {}


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "7", True, None])
def test_a_declaration_that_is_no_positive_number_is_ignored(bad):
    from xbench.contract import first_call_of

    assert first_call_of(Declares(gpu=bad), "gpu") is None
    assert first_call_of(Declares(gpu=3), "gpu") == 3.0


def test_the_built_in_backends_declare_their_first_calls_without_importing_a_framework():
    from xbench.contract import first_call_of
    from xbench_backends.jax.pmap import JaxPmapBackend
    from xbench_backends.jax.shardmap import JaxShardMapBackend
    from xbench_backends.torch.ddp import TorchDdpBackend

    assert first_call_of(JaxPmapBackend, "gpu") == first_call_of(JaxShardMapBackend, "gpu") > 1.0
    assert first_call_of(TorchDdpBackend, "gpu") < 0.1
    for backend in (JaxPmapBackend, TorchDdpBackend):
        assert first_call_of(backend, "cpu") == est.CPU_COSTS.first_call_s


def test_dry_run_estimates_with_the_backends_declared_first_calls(capsys, monkeypatch):
    seen = []
    real = est.costs_for

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr("xbench.run.compare.costs_for", spy)
    monkeypatch.setattr("xbench.run.compare.host_flops", lambda *a, **k: 2e11)
    assert main(["compare", "--backends", "jax", "torch", "--platform", "gpu", "--dry-run"]) == 0, capsys.readouterr()
    assert seen[-1].first_calls == {"jax": 2.0, "torch": 0.05}
    assert seen[-1].per_arrays == {"jax": 0.08, "torch": 0.002}


def test_breakdown_adds_its_all_reduce_measurement_to_the_estimate():
    from xbench.experiment import build_spec

    two = build_spec({"models": [{"preset": "medium"}], "devices": [1, 2]}, "test")
    one = build_spec({"models": [{"preset": "medium"}], "devices": [1]}, "test")
    sizes = est.allreduce_seconds(two, ["jax", "torch"], "cpu") / est.ALLREDUCE_SIZE_S
    assert sizes > 2 and sizes % 2 == 0  # each backend: the model's gradient and the sweep's sizes
    assert est.allreduce_seconds(one, ["jax"], "cpu") == 0  # one device: no all-reduce
