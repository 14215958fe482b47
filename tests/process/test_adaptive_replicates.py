"""Adaptive replicates, verdicts from the interval, a diff that knows its power, and
the machine-drift control."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.process.test_replicates import record, run_records
from xbench.contract.timing import TimingProtocol
from xbench.experiment import load_spec
from xbench.results.control import CONTROL_FILE, movements, read_controls
from xbench.results.diff import NO_CHANGE, TOO_NOISY, UNDERPOWERED, diff_runs
from xbench.results.records import RECORDS_FILE, read_records
from xbench.results.summary import can_narrow, rows_from_records, run_floor, verdict, wide
from xbench.run.adaptive import Budget, next_round
from xbench.run.plan import plan_trials

FAST = ("--model", "medium", "--repeats", "3", "--steps", "2", "--warmup-steps", "0", "--no-verify",
        "--batch-sizes", "16,32", "--devices", "1")


# -- rounds --------------------------------------------------------------------------------------

def _records(noisy_replicates: int, steady_replicates: int = 3) -> list:
    """Two configurations of backend b on 1 device: batch 16 varies 20 % between processes,
    batch 32 0.1 %; and a steady third one so that the spreads pool."""
    rng = np.random.default_rng(0)
    out = [record(16, 1, r, 1e-3 * float(np.exp(0.2 * rng.standard_normal())), seed=r) for r in range(noisy_replicates)]
    out += [record(b, 1, r, 1e-3 * (1 + 0.001 * r), seed=r) for b in (32, 64) for r in range(steady_replicates)]
    for entry in out:
        entry["trial"]["protocol"] = {"warmup_steps": 0, "steps": 1, "repeats": 2, "steps_per_call": 1,
                                      "trial_timeout_s": 9, "replicates": 3, "interval_target": 0.05}
    return out


def _planned():
    spec = load_spec(None, {"models": ["medium"], "batch_sizes": [16, 32, 64], "devices": [1], "replicates": 3,
                            "order_seed": 1})
    return [t for t in plan_trials(spec, ["b"])]


def _as_planned(records, planned):
    """The synthetic records under the planned trials' configuration ids (model "m" -> "medium")."""
    for entry in records:
        entry["trial"]["model"]["name"] = "medium"
        entry["trial_id"] = entry["trial_id"].replace("/m/", "/medium/")
    return records


def test_a_round_adds_one_replicate_to_the_wide_configurations_only():
    planned = _planned()
    protocol = TimingProtocol(replicates=3, interval_target=0.05, time_budget_s=60, max_replicates=5, order_seed=1)
    records = _as_planned(_records(3), planned)
    rows = {row.global_batch: row for row in rows_from_records(records)}
    assert wide(rows[16]) and not wide(rows[32]) and not wide(rows[64])
    found = next_round(planned, records, protocol, 1)
    assert [(t.global_batch, t.replicate) for t in found.trials] == [(16, 3)]
    assert found.configurations == 1 and found.at_most == 0
    capped = next_round(planned, _as_planned(_records(5), planned), protocol, 1)
    assert 16 not in [t.global_batch for t in capped.trials] and capped.at_most == 1  # max_replicates reached


def test_the_budget_stops_a_round_that_would_end_past_it():
    budget = Budget(60.0)
    budget.charge(40.0, 20)  # 2 s a trial
    assert budget.affords(10) and not budget.affords(11)
    assert budget.left == 20.0


def test_compare_adds_rounds_until_the_replicate_cap(fake_backends, run_cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy", *FAST, "--replicates", "2", "--interval-target",
                           "0.0001", "--time-budget", "300", "--max-replicates", "4", "--run-variation", "0",
                           "--out", str(out))
    assert code == 0, err
    assert "round 3: 2 configuration(s) wider than ±0.01%" in " ".join(err.split())
    assert "round 4:" in err and "round 5:" not in err
    rows = rows_from_records(read_records(out))
    assert [row.measured.replicates for row in rows] == [4, 4]
    assert "0 of 2 configuration(s) within ±0.01%" in " ".join(err.split())
    assert all(wide(row) for row in rows)
    assert len(read_controls(out)) == 2  # the drift control, before and after


def test_rows_the_run_level_variation_keeps_wide_get_no_more_replicates(fake_backends, run_cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy", *FAST, "--replicates", "2", "--interval-target", "0.05",
                           "--time-budget", "300", "--run-variation", "0.05", "--out", str(out))
    flat = " ".join(err.split())
    assert code == 0 and "round 3" not in err
    assert "2 cannot reach ±5%: this machine's run-to-run variation (--run-variation 0.05) alone is wider" in flat
    rows = rows_from_records(read_records(out))
    assert all(wide(row) and not can_narrow(row) for row in rows)
    assert run_floor(rows[0]) == pytest.approx(0.098)


def test_a_zero_target_runs_the_planned_replicates_only(fake_backends, run_cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy", *FAST, "--replicates", "2", "--interval-target", "0",
                           "--time-budget", "300", "--out", str(out))
    assert code == 0 and "round 3" not in err
    assert [row.measured.replicates for row in rows_from_records(read_records(out))] == [2, 2]


def test_a_bad_time_budget_variable_is_one_line(fake_backends, run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("XBENCH_TIME_BUDGET_S", "soon")
    code, _, err = run_cli("compare", "--backends", "numpy", *FAST, "--out", str(tmp_path / "run"))
    assert code == 2 and "XBENCH_TIME_BUDGET_S='soon' must be a number of seconds" in err


# -- verdicts: the zone that holds the whole interval ------------------------------------------------

def _scaling_rows(speedup: float, spread: float, replicates: int = 3):
    rng = np.random.default_rng(4)
    records = []
    for r in range(replicates):
        records.append(record(32, 1, r, 1e-3 * float(np.exp(spread * rng.standard_normal())), seed=r))
        records.append(record(32, 2, r, 1e-3 / speedup * float(np.exp(spread * rng.standard_normal())), seed=r))
    return {row.devices: row for row in rows_from_records(records)}


@pytest.mark.parametrize("speedup,spread,expected", [
    (1.6, 0.01, "multi-device beneficial"), (0.6, 0.01, "single device preferred"),
    (1.02, 0.005, "about even"), (1.10, 0.08, "inconclusive"), (0.5, 0.4, "inconclusive")])
def test_a_verdict_never_contradicts_the_interval_beside_it(speedup, spread, expected):
    row = _scaling_rows(speedup, spread)[2]
    s = row.scaling
    assert verdict(row) == expected, (s.speedup, s.ci_low, s.ci_high)
    if expected == "inconclusive":
        assert s.ci_low < 1.10 < s.ci_high or s.ci_low < 0.95 < s.ci_high
    assert s.ci_low <= s.speedup <= s.ci_high


# -- diff knows its power ------------------------------------------------------------------------

def test_a_diff_with_few_noisy_replicates_says_it_cannot_tell():
    a = run_records(1, configs=4, replicates=2, spread=0.08)
    b = run_records(2, configs=4, replicates=2, spread=0.08)
    result = diff_runs(a, b)
    assert all(row.change(0.05) == UNDERPOWERED and row.detectable > 0.05 for row in result.rows)
    assert result.underpowered(0.05) and not result.regressions(0.05)


def test_a_diff_with_enough_replicates_says_no_change():
    a = run_records(1, configs=6, replicates=5, spread=0.003)
    b = run_records(2, configs=6, replicates=5, spread=0.003)
    result = diff_runs(a, b)
    assert all(row.change(0.05) == NO_CHANGE and row.detectable < 0.05 for row in result.rows)
    assert not result.underpowered(0.05)


def test_diff_prints_the_detectable_change_and_fails_underpowered_on_request(fake_backends, run_cli, tmp_path):
    a, noisy = tmp_path / "a", tmp_path / "noisy"
    assert run_cli("compare", "--backends", "numpy", *FAST, "--replicates", "4", "--run-variation", "0",
                   "--out", str(a))[0] == 0
    code, out, err = run_cli("diff", str(a), str(a), "--threshold", "0.01%", "--fail-underpowered")
    assert code == 4 and "too few replicates to tell" in out and "could not detect a change of 0.01%" in err
    code, out, err = run_cli("diff", str(a), str(a), "--threshold", "0.01%")
    assert code == 0 and "detects" in out
    steady = _steadied(a, tmp_path / "steady")  # the busy CI machine's processes differ by 15 % and more
    code, out, err = run_cli("diff", str(steady), str(steady), "--threshold", "90%", "--fail-underpowered")
    assert code == 0 and "no change" in out and "the machine did not move" in err
    assert run_cli("compare", "--backends", "numpy", *FAST, "--replicates", "4", "--run-variation", "0.1",
                   "--out", str(noisy))[0] == 0
    code, out, err = run_cli("diff", str(noisy), str(noisy), "--threshold", "5%", "--fail-underpowered")
    assert code == 4 and TOO_NOISY in out and "whatever their replicates" in " ".join(err.split())


def _steadied(run_dir, to):
    """A copy of a stored run whose replicates differ by 0.1 % (a real run's spread is the
    machine's, which the diff's exit code must not hinge on): the same steps in every window
    (each process calibrates its own) and windows 0.1 % apart."""
    shutil.copytree(run_dir, to)
    lines = (to / RECORDS_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for entry in records:
        windows = entry["timing"]["window_s"]
        entry["timing"]["steps_per_window"] = 1000
        entry["timing"]["window_s"] = [1e-3 * (1 + 0.001 * entry["replicate"]["index"] + 1e-4 * w)
                                       for w in range(len(windows))]
    (to / RECORDS_FILE).write_text("".join(json.dumps(entry) + "\n" for entry in records))
    return to


# -- the machine-drift control ---------------------------------------------------------------------

def _control(host_s: float, matmul_s: float) -> dict:
    return {"when": "before", "host_loop_s": [host_s] * 3, "matmul_s": [matmul_s] * 3}


def test_the_control_tells_a_machine_that_moved_from_one_that_did_not(tmp_path):
    steady = movements([_control(0.01, 0.02), _control(0.0101, 0.02)], [_control(0.0102, 0.0201)])
    assert [m.moved for m in steady] == [False, False]
    slower = movements([_control(0.01, 0.02)], [_control(0.013, 0.02)])
    assert [m.moved for m in slower] == [True, False] and slower[0].ratio == pytest.approx(1.3)
    (tmp_path / CONTROL_FILE).write_text(json.dumps(_control(0.01, 0.02)) + "\n{cut off\n" + '{"when": 1}\n')
    assert len(read_controls(tmp_path)) == 1  # advice, never data: damaged lines are skipped
    assert movements([], [_control(0.01, 0.02)]) == []


# -- a busy machine ------------------------------------------------------------------------------

def _loaded(load, cores=2):
    out = record(32, 1, 0, 1e-3)
    out["replicate"]["host_before"] = {"loadavg_1m": load, "loadavg_5m": load, "cpu_count": 8, "cpus_allowed": cores}
    return out


def test_a_host_busier_than_its_cores_is_named_and_an_idle_one_is_not():
    from xbench.report.words import busy_text
    from xbench.results.conditions import busy_host

    busy = busy_host([_loaded(3.7), _loaded(4.1), _loaded(1.2)])
    assert busy is not None and busy.load == pytest.approx(3.7) and busy.cores == 2
    assert "load averaged 3.7 on 2 core(s)" in busy_text(busy)
    assert busy_host([_loaded(1.7), _loaded(2.0)]) is None  # xbench's own worker on 2 cores
    assert busy_host([_loaded("x"), record(32, 1, 1, 1e-3)]) is None  # damaged or missing: no claim
