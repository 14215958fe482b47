"""Replicates: the plan's shuffled rounds, the adaptive stop, one row per configuration from
its replicates, the labels (unstable, host-bound, throttled), and old records."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from xbench.contract.timing import TimingProtocol
from xbench.experiment import load_spec
from xbench.report.words import RESULT_HEADERS, notes, result_cells
from xbench.results.conditions import host_bound_reason
from xbench.results.records import RECORDS_FILE, SCHEMA_VERSION, read_records
from xbench.results.summary import rows_from_records, verdict
from xbench.run.plan import group_trials, plan_trials
from xbench.worker.measure import measure, stop_reason


def spec(**protocol):
    return load_spec(None, {"models": ["medium", "large"], "batch_sizes": [16, 32], "devices": [1, 2],
                            "replicates": 3, "order_seed": 7, **protocol})


# -- the plan ----------------------------------------------------------------------------------

def test_every_configuration_once_per_round_in_a_seeded_shuffled_order():
    trials = plan_trials(spec(), ["a", "b"])
    configs = {t.config_id for t in trials}
    assert len(configs) == 2 * 2 * 2 * 2 and len(trials) == 3 * len(configs)
    rounds = [[t for t in trials if t.replicate == r] for r in range(3)]
    assert all({t.config_id for t in round_} == configs for round_ in rounds)
    assert [t.replicate for t in trials] == sorted(t.replicate for t in trials)  # round after round
    assert [t.id for t in trials] == [t.id for t in plan_trials(spec(), ["a", "b"])]  # the seed decides
    assert [t.id for t in trials] != [t.id for t in plan_trials(spec(order_seed=8), ["a", "b"])]
    assert [t.config_id for t in rounds[0]] != [t.config_id for t in rounds[1]]  # each round reshuffled


def test_one_worker_per_backend_device_count_and_replicate():
    trials = plan_trials(spec(), ["a", "b"])
    groups = group_trials(trials, {"a": "x:A", "b": "x:B"})
    assert len(groups) == 2 * 2 * 3
    assert all(len({(t.backend, t.devices, t.replicate) for t in g.trials}) == 1 for g in groups)


def test_a_compute_only_twin_follows_its_trial_in_the_same_worker():
    trials = plan_trials(spec(), ["a"], breakdown=True)
    for index, trial in enumerate(trials):
        if not trial.all_reduce:
            before = trials[index - 1]
            assert before.all_reduce and before.config_id == trial.config_id.removesuffix("/compute-only")
            assert before.replicate == trial.replicate


# -- the adaptive stop -------------------------------------------------------------------------

def test_windows_stop_once_steady_and_not_before_five():
    protocol = TimingProtocol(repeats=50, target_ci=0.01, window_budget_s=100)
    steady = [0.1] * 4
    assert stop_reason(steady, protocol) is None  # fewer than five windows
    assert stop_reason(steady + [0.1], protocol) == "target_ci"
    noisy = list(np.random.default_rng(0).uniform(0.05, 0.15, 10))
    assert stop_reason(noisy, protocol) is None
    assert stop_reason(noisy, TimingProtocol(repeats=50, target_ci=0.01, window_budget_s=0.5)) == "window_budget_s"
    assert stop_reason(steady * 3, TimingProtocol(repeats=50, target_ci=0, window_budget_s=100)) is None


class CountingBackend:
    def __init__(self):
        self.calls = 0

    def run(self, prepared, steps):
        self.calls += 1


def test_measure_stops_early_and_says_why():
    result = measure(CountingBackend(), None, TimingProtocol(warmup_steps=0, steps=1, repeats=40, min_window_s=0,
                                                       target_ci=0, window_budget_s=1e-9))
    assert len(result.window_s) == 5 and result.stopped == "window_budget_s"
    full = measure(CountingBackend(), None, TimingProtocol(warmup_steps=0, steps=1, repeats=7, min_window_s=0,
                                                     target_ci=0))
    assert len(full.window_s) == 7 and full.stopped == "repeats"


def test_every_rank_stops_when_any_rank_would():
    wishes = []

    def any_rank(stop):
        wishes.append(stop)
        return len(wishes) == 7  # the first call is the barrier before the windows; then one per window

    result = measure(CountingBackend(), None, TimingProtocol(warmup_steps=0, steps=1, repeats=20, min_window_s=0,
                                                       target_ci=0), all_stop=any_rank)
    assert len(result.window_s) == 6 and result.stopped == "another rank" and wishes[0] is False


# -- rows from replicate records ---------------------------------------------------------------

def record(batch, devices, replicate, step_s, backend="b", status="ok", windows=8, noise=0.0, seed=0,
           telemetry=None, throttled=()):
    rng = np.random.default_rng(seed)
    trial = {"backend": backend, "model": {"name": "m", "widths": [4], "inputs": 3, "outputs": 1},
             "devices": devices, "global_batch": batch, "scaling": "strong", "precision": "fp32",
             "launcher": "subprocess", "all_reduce": True, "replicate": replicate}
    config = f"{backend}/m/d{devices}/b{batch}"
    out = {"trial_id": f"{config}/r{replicate}", "trial": trial, "status": status, "reason": None,
           "work": {"params": 9}}
    if status == "ok":
        window_s = [10 * step_s * (1 + noise * rng.standard_normal()) for _ in range(windows)]
        out["timing"] = {"first_call_s": 1.0, "window_s": window_s, "steps_per_window": 10, "stopped": "repeats"}
        out["telemetry"] = telemetry
        out["replicate"] = {"throttle_reasons": list(throttled)}
    else:
        out["reason"] = "boom"
    return out


def test_a_row_combines_its_replicates_and_the_interval_is_over_replicate_means():
    records = [record(32, 1, r, s, noise=0.001, seed=r) for r, s in enumerate((1e-3, 1.2e-3, 0.9e-3))]
    [row] = rows_from_records(records)
    t = row.throughput
    assert t.replicates == 3 and len(row.replicates) == 3
    means = [32 / s for s in (1e-3, 1.2e-3, 0.9e-3)]
    assert t.mean == pytest.approx(np.mean(means), rel=1e-2)
    assert t.ci_low < min(means) and t.ci_high > max(means)  # t(2) over 3 means: wide
    assert row.unstable and "unstable: replicates" in "; ".join(notes(row))
    # against a ±10% target: wide, said in words, not "±95%" (which read as ninety-five percent)
    wide_note = "wide: the 95% interval is wider than the ±10% target (more replicates would narrow it)"
    assert wide_note in notes(replace(row, interval_target=0.1))


def test_a_failed_replicate_is_counted_not_hidden():
    records = [record(32, 1, 0, 1e-3), record(32, 1, 1, 1e-3, status="crashed"), record(32, 1, 2, 1e-3)]
    [row] = rows_from_records(records)
    cells = dict(zip(RESULT_HEADERS, result_cells(row)))
    assert row.status == "ok" and cells["reps"] == "2/3" and "r1 crashed" in cells["notes"]
    all_failed = [record(32, 1, r, 1e-3, status="crashed") for r in range(2)]
    assert rows_from_records(all_failed)[0].status == "crashed"


def test_speedup_has_an_interval_from_replicate_means_and_rows_come_in_reading_order():
    records = [record(b, d, r, s, noise=0.002, seed=10 * r + d)
               for r in range(3) for d, s in ((2, 0.6e-3), (1, 1e-3)) for b in (64, 32)]
    rows = rows_from_records(records)
    assert [(r.devices, r.global_batch) for r in rows] == [(1, 32), (1, 64), (2, 32), (2, 64)]
    s = rows[2].scaling
    assert s.speedup == pytest.approx(1 / 0.6, rel=0.02) and s.ci_low < s.speedup < s.ci_high
    assert verdict(rows[2]) == "multi-device beneficial"
    assert "(" in dict(zip(RESULT_HEADERS, result_cells(rows[2])))["speedup"]


def test_host_bound_when_the_step_time_is_flat_across_batch_sizes():
    flat = [record(b, 1, r, 1e-3 * (1 + b / 10_000), seed=r) for r in range(2) for b in (8, 32, 128)]
    rows = rows_from_records(flat)
    assert all(r.host_bound == "step time flat from batch 8 to 128" for r in rows)
    growing = [record(b, 1, r, 1e-5 * b, seed=r) for r in range(2) for b in (8, 32, 128)]
    assert all(r.host_bound is None for r in rows_from_records(growing))


def test_host_bound_when_the_gpu_is_mostly_idle_and_throttling_is_shown():
    busy = {"devices": [{"util_mean_pct": 20.0, "util_samples": 4}]}
    records = [record(32, 1, r, 1e-3, telemetry=busy, throttled=("GPU0: sw_thermal",) if r else ()) for r in range(2)]
    [row] = rows_from_records(records)
    assert host_bound_reason(row, [row]) == "GPU busy 20 % of the time"
    assert "throttled: r1: GPU0: sw_thermal" in notes(row)


def test_terminal_and_report_say_the_same_words(tmp_path):
    from rich.console import Console

    from xbench.report.pages import model_section
    from xbench.report.terminal import model_tables

    records = [record(b, d, r, s, noise=0.002, seed=r) for r in range(2) for d, s in ((1, 1e-3), (2, 2e-3))
               for b in (32,)]
    rows = rows_from_records(records)
    console = Console(width=250, record=True)
    for table in model_tables(rows, wide=True):
        console.print(table)
    terminal = console.export_text()
    report = json.dumps([getattr(b, "rows", None) for b in model_section("m", rows, [], {})])
    for word in ("single device preferred", "baseline"):
        assert word in terminal and word in report


# -- old records -------------------------------------------------------------------------------

def test_schema_3_records_become_replicate_0(tmp_path):
    old = record(32, 1, 0, 1e-3)
    old["trial_id"] = "b/m/d1/b32"
    del old["trial"]["replicate"], old["replicate"], old["timing"]["stopped"]
    (tmp_path / RECORDS_FILE).write_text(json.dumps({"schema": 3, **old}) + "\n")
    [migrated] = read_records(tmp_path)
    assert migrated["schema"] == SCHEMA_VERSION and migrated["trial"]["replicate"] == 0
    assert migrated["trial_id"] == "b/m/d1/b32/r0"
    [row] = rows_from_records([migrated])
    assert row.throughput.replicates == 1 and math.isnan(row.throughput.ci_low)
    assert dict(zip(RESULT_HEADERS, result_cells(row)))["95% interval"] == "n/a"


# -- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (("--replicates", "0"), "'replicates' in [protocol] of the built-in defaults with the command line's options "
                            "must be an integer >= 2, got 0"),
    (("--replicates", "-3"), "must be an integer >= 2, got -3"),
    (("--replicates", "1"), "must be an integer >= 2, got 1"),
    (("--replicates", "2.5"), "Invalid value for '--replicates'"),
    (("--window-budget", "0.2"), "'window_budget_s' (0.2) in [protocol] of the built-in defaults with the command "
                                 "line's options cannot hold one replicate: 5 windows of at least min_window_s "
                                 "(0.1 s) need 0.5 s"),
    (("--target-ci", "-0.1"), "'target_ci'"),
    (("--order-seed", "-1"), "'order_seed'"),
    (("--order-seed", str(2**40)), "must be an integer <= 2147483647"),
])
def test_bad_replicate_input_is_one_line_exit_2_and_writes_nothing(fake_backends, run_cli, tmp_path, args, message):
    out_dir = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy", *args, "--out", str(out_dir))
    assert code == 2 and message in " ".join(err.split()), err
    assert "Traceback" not in err and not out_dir.exists()


def test_the_config_file_takes_replicates_too(tmp_path):
    from xbench.errors import SpecError

    path = tmp_path / "s.toml"
    path.write_text('[protocol]\nreplicates = "3"\n')
    with pytest.raises(SpecError, match="'replicates' in \\[protocol\\] of .* must be an integer >= 2, got '3'"):
        load_spec(path)
    path.write_text("[protocol]\nreplicates = 4\norder_seed = 11\n")
    assert load_spec(path).protocol.replicates == 4 and load_spec(path).protocol.order_seed == 11


# -- the diff gate -----------------------------------------------------------------------------

def run_records(seed, slower=None, configs=30, replicates=3, spread=0.01):
    """Records of a run of `configs` stable configurations; `slower` (a batch size) runs 10 % slower."""
    rng = np.random.default_rng(seed)
    records = []
    for batch in range(1, configs + 1):
        for r in range(replicates):
            step_s = 1e-3 * (1 + spread * rng.standard_normal()) * (1.1 if batch == slower else 1.0)
            records.append(record(batch, 1, r, step_s, noise=0.002, seed=int(rng.integers(1 << 30))))
    return records


def test_unchanged_reruns_pass_the_gate_and_a_real_10_percent_slowdown_fails_it():
    from xbench.results.diff import diff_runs

    false_alarms = sum(bool(diff_runs(run_records(2 * s), run_records(2 * s + 1)).regressions(0.05))
                       for s in range(40))
    assert false_alarms <= 4  # Holm keeps the family-wise rate near 5 % (uncorrected: most reruns)

    def caught(replicates):
        return sum([row.key[3] for row in diff_runs(run_records(1000 + 2 * s, replicates=replicates),
                                                    run_records(1001 + 2 * s, slower=7, replicates=replicates)
                                                    ).regressions(0.05)] == [7] for s in range(20))

    # Configurations whose processes agree within 1 % (records without devices: no run-level
    # variation): with their spread pooled over 30 configurations, Holm over 30 catches most
    # 10 % slowdowns at 3 replicates a side and every one at 5.
    assert caught(3) >= 14 and caught(5) == 20


def test_without_holm_a_rerun_of_many_configurations_would_cry_wolf():
    from xbench.results.diff import diff_runs

    rows = [row for s in range(40) for row in diff_runs(run_records(2 * s), run_records(2 * s + 1)).rows]
    uncorrected = sum(row.ratio.p_value < 0.05 for row in rows)
    assert uncorrected > 0.03 * len(rows)  # each test alone errs about 5 % of the time


# -- review findings: interrupts, resume of old runs, the gate, the environment -----------------

def test_an_interrupt_stops_side_by_side_workers_and_starts_no_more(fake_backends, tmp_path, monkeypatch):
    """Verification runs workers side by side; Ctrl-C must end them all at once."""
    import os
    import signal
    import threading
    import time

    from tests.support.processes import TAG, new_tag, tagged_processes
    from xbench.run import launcher

    tag = new_tag()
    monkeypatch.setenv(TAG, tag)
    hanging = load_spec(None, {"backends": ["numpy"], "models": ["medium"], "batch_sizes": [16], "devices": [1, 2],
                               "replicates": 3, "order_seed": 0, "options": {"numpy": {"hang_batch": 16}}})
    groups = group_trials(plan_trials(hanging, ["numpy"]), {"numpy": "tests.support.fakes:NumpyBackend"})
    ctx = launcher.Context(run_id="t", run_dir=tmp_path, environment={}, write=lambda record: None)
    # Python's own Ctrl-C handler, even where the shell that started the tests ignores SIGINT.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C, as a user would
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            launcher.run_groups(groups, ctx, parallel=2)
        assert time.monotonic() - started < 15
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 10
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tagged_processes(tag) == []
    assert (tmp_path / "workers.log").read_text().count("=== numpy") == 2  # the two started first, no more


def test_a_run_recorded_before_replicates_resumes_as_it_started():
    from tests.conftest import ROOT
    from xbench.run.resume import saved_spec

    saved = json.loads((ROOT / "results" / "2026-11-22-h200x2-jax-seed-study" / "run.json").read_text())
    spec = saved_spec(saved["spec"], "run.json")
    assert spec.protocol.replicates == 1 and spec.protocol.order_seed == spec.seed
    assert spec.protocol.target_ci == 0  # every window, as then
    assert [t.replicate for t in plan_trials(spec, ["jax"])] == [0] * len(plan_trials(spec, ["jax"]))


def test_diff_refuses_runs_without_replicates_instead_of_passing_them(run_cli):
    from tests.conftest import ROOT

    old = str(ROOT / "results" / "2026-11-22-h200x2-jax-quick")
    code, _, err = run_cli("diff", old, old)
    assert code == 2 and "has a spread in both runs (2 or more replicates)" in err and "Traceback" not in err


def test_a_batch_inside_a_flat_range_but_not_flat_itself_is_not_host_bound():
    steps = {8: 1.0e-3, 16: 1.5e-3, 32: 1.2e-3}
    rows = {r.global_batch: r for r in rows_from_records([record(b, 1, k, s, seed=k) for k in range(2)
                                                          for b, s in steps.items()])}
    assert rows[8].host_bound and rows[32].host_bound and rows[16].host_bound is None


def test_workers_never_inherit_a_compilation_cache_the_run_did_not_ask_for(monkeypatch):
    from xbench.contract import COMPILE_CACHE_VARIABLE
    from xbench.run.worker_process import worker_environment

    monkeypatch.setenv(COMPILE_CACHE_VARIABLE, "/tmp/someone-elses-cache")
    assert COMPILE_CACHE_VARIABLE not in worker_environment()


def test_missing_replicates_of_an_interrupted_run_are_shown():
    records = [record(32, 1, 0, 1e-3), record(32, 1, 1, 1e-3)]
    for r in records:
        r["trial"]["protocol"] = {"replicates": 3}
    [row] = rows_from_records(records)
    assert dict(zip(RESULT_HEADERS, result_cells(row)))["reps"] == "2/3"
    assert "1 replicate(s) not run" in notes(row)


def test_the_terminal_says_the_notes_as_short_tags():
    from xbench.report.words import brief_notes

    busy = {"devices": [{"util_mean_pct": 20.0, "util_samples": 4}]}
    records = [record(32, 1, r, (1e-3, 1.3e-3)[r], telemetry=busy, throttled=("GPU0: sw_thermal",) if r else (),
                      noise=0.001, seed=r) for r in range(2)]
    records.append(record(32, 1, 2, 1e-3, status="crashed"))
    [row] = rows_from_records(records)
    assert brief_notes(row)[:4] == ["unstable ±18%", "host-bound (GPU 20%)", "throttled r1", "r2 crashed"]
    assert len(notes(row)) == len(brief_notes(row))  # the same labels, said shorter
