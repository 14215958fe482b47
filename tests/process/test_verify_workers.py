"""Verification's runs share worker processes forked from a fork server
(`verify_plan.verification_groups`, `launcher.start_fork_servers`), and what goes wrong in one
run of a shared worker still fails that run's program, and only its program."""

from __future__ import annotations

import pytest

from tests.process.test_verify_killed import kill_when_paused
from tests.support.fakes import OOM_ONCE, PAUSE_DIR, PAUSE_TRIAL

PARALLEL = 1  # a worker per backend and device count, about (`GROUPS_PER_SLOT`)


def numpy_mlp_spec():
    """numpy-mlp with all its variants (bf16-scaled: gradients 1.5 x too large), the medium
    MLP on 1 and 2 devices."""
    from xbench.experiment import load_spec

    return load_spec(None, {"backends": ["numpy-mlp"], "models": ["medium"], "devices": [2], "variants": ["all"],
                            "single_device": "data-parallel"})


def verify_numpy_mlp(tmp_path, monkeypatch, parallel=PARALLEL):
    """Its verification's result, its runs, the worker processes it planned for them, and the
    workers' log lines that say a worker started."""
    from xbench.run import verification
    from xbench.run.readiness import ready_backends
    from xbench.run.verify_plan import verification_trials

    planned = []
    grouping = verification.verification_groups
    monkeypatch.setattr(verification, "verification_groups",
                        lambda *args: planned.append(grouping(*args)) or planned[0])
    spec = numpy_mlp_spec()
    ready = ready_backends(spec, tmp_path)
    arrays = tmp_path / "arrays"
    arrays.mkdir()
    result = verification.verify(spec, ready.entries, [2], arrays, {}, log_dir=tmp_path, launchers=ready.launchers,
                                 lineups=ready.lineups, parallel=parallel, device_info=ready.devices)
    starts = [line for line in (tmp_path / "workers.log").read_text().splitlines()
              if line.startswith("=== ") and "worker pid(s)" in line]
    return result, verification_trials(spec, ["numpy-mlp"], [2], ready.launchers, ready.lineups), planned[0], starts


def test_verification_runs_share_forked_workers_and_a_wrong_variant_still_fails_alone(fake_backends, tmp_path,
                                                                                      monkeypatch):
    pytest.importorskip("ml_dtypes")
    from xbench.run.plan import group_trials

    result, trials, groups, starts = verify_numpy_mlp(tmp_path, monkeypatch)
    assert len(starts) == len(groups) <= len(trials) / 2, starts
    # a worker per run of one replicate number in a row, before: 7 for these 8 runs
    assert len(groups) <= len(group_trials(trials, {"numpy-mlp": groups[0].target})) / 2
    assert all("forked from a fork server" in line for line in starts), starts
    # float64 referees and bf16 references run beside the fp32 and bf16 programs
    assert all(len({t.replicate for t in g.trials}) >= 2 and len({t.precision for t in g.trials}) >= 2
               for g in groups if g.devices == 1)
    assert result.failed == {"numpy-mlp+bf16-scaled"} and not result.problems, (result.failed, result.problems)
    assert result.outcome("numpy-mlp+bf16")["status"] == "passed"


def test_a_run_killed_in_a_shared_worker_fails_its_program_and_the_rest_go_on_in_a_fresh_one(
        fake_backends, tmp_path, monkeypatch):
    """The first run of the first worker is killed (SIGKILL, as the OOM killer would): its
    program fails with that reason; the runs after it in that worker run in a new worker and
    count."""
    pytest.importorskip("ml_dtypes")
    from xbench.run.readiness import ready_backends
    from xbench.run.verify_plan import verification_groups, verification_trials

    spec = numpy_mlp_spec()
    ready = ready_backends(spec, tmp_path)
    [first, *after] = [t.id for t in verification_groups(
        verification_trials(spec, ["numpy-mlp"], [2], ready.launchers, ready.lineups),
        {e.name: e.target for e in ready.entries}, PARALLEL)[0].trials]
    assert after
    monkeypatch.setenv(PAUSE_TRIAL, first)
    monkeypatch.setenv(PAUSE_DIR, str(tmp_path))
    pids: list[int] = []
    killer = kill_when_paused(tmp_path, pids)
    result, _, groups, starts = verify_numpy_mlp(tmp_path, monkeypatch)
    killer.join(timeout=5)
    assert pids, "the worker never paused"
    assert [t.id for t in groups[0].trials] == [first, *after]
    assert len(starts) == len(groups) + 1  # the rest of its group, in a fresh worker
    assert result.problems[first].startswith("crashed: worker killed by signal 9"), result.problems
    assert "numpy-mlp" in result.failed
    for trial_id in after:  # ran, and left arrays; at most unchecked for want of the killed run's
        assert (tmp_path / "arrays" / f"{trial_id.replace('/', '_')}.npz").exists(), trial_id
        assert first in result.problems.get(trial_id, first), result.problems[trial_id]


@pytest.mark.parametrize("parallel", [3, 1])
def test_a_run_out_of_memory_beside_other_workers_runs_again_alone(fake_backends, tmp_path, monkeypatch, parallel):
    """Side by side (3 asked, 2 as the memory allows), a run that ran out of memory runs again
    in a worker of its own, after the others, and counts; alone from the start (parallel 1) its
    failure stands. Where the memory limited the workers, each is told its share of a device's
    memory (`MEMORY_SHARE_VARIABLE`), and the run alone is not."""
    pytest.importorskip("ml_dtypes")
    from xbench.run.readiness import ready_backends
    from xbench.run.verify_plan import verification_trials

    spec = numpy_mlp_spec()
    ready = ready_backends(spec, tmp_path)
    [victim] = [t.id for t in verification_trials(spec, ["numpy-mlp"], [2], ready.launchers, ready.lineups)
                if t.implementation == "numpy-mlp" and t.devices == 2 and t.precision == "fp32"]
    monkeypatch.setenv(OOM_ONCE, victim)
    monkeypatch.setenv(PAUSE_DIR, str(tmp_path))
    # a GiB of context and a few MB of MLP per worker: two fit in 95 % of 2.6 GiB, three do not
    monkeypatch.setenv("XBENCH_DEVICE_MEMORY_GIB", "2.6")
    result, _, groups, starts = verify_numpy_mlp(tmp_path, monkeypatch, parallel)
    assert (tmp_path / "out-of-memory-once").exists()
    if parallel == 3:
        assert len(starts) == len(groups) + 1 and len(groups) >= 2, starts
        assert result.failed == {"numpy-mlp+bf16-scaled"} and not result.problems, (result.failed, result.problems)
        # two workers: half of 95 % of the device each, less a GiB for the context
        assert result.memory_share == pytest.approx((0.95 * 2.6 / 2 - 1) / 2.6, abs=2e-4)
        assert (tmp_path / "out-of-memory-once").read_text() == f"{result.memory_share:.4f}"
        assert (tmp_path / "again").read_text() == "none"
    else:
        assert (tmp_path / "out-of-memory-once").read_text() == "none" and result.memory_share is None
        assert "out of memory" in result.problems[victim] and "numpy-mlp" in result.failed, result.problems


@pytest.mark.parametrize("devices, workers", [(1, 1), (2, 2)])
def test_a_failed_trial_ends_an_spmd_worker_only_where_other_ranks_may_wait_on_it(
        run_cli, fake_backends, tmp_path, devices, workers):
    """The one rank of a 1-device spmd job goes on after a failure (verification's shared
    workers meet many: each variant a backend refuses on this platform), as a subprocess worker
    does; the ranks of a 2-device job start afresh."""
    from tests.conftest import order_seed_starting_with
    from xbench.results.records import read_records

    first = order_seed_starting_with(f"numpy-spmd/medium/d{devices}/b16/spmd/r0", "numpy-spmd", [16, 32], [devices],
                                     "spmd")
    code, _, err = run_cli("compare", "--backends", "numpy-spmd", "--model", "medium", "--steps", "2",
                           "--warmup-steps", "0", "--no-verify", "--devices", str(devices), "--batch-sizes", "16,32",
                           "--order-seed", first, "--option", "numpy-spmd.fail_batch=16",
                           "--out", str(tmp_path / "run"))
    assert (tmp_path / "run" / "records.jsonl").exists(), err
    statuses = [(r["trial_id"], r["status"]) for r in read_records(tmp_path / "run") if r["trial"]["replicate"] == 0]
    assert code == 1 and [status for _, status in statuses] == ["failed", "ok"], statuses
    starts = [line for line in (tmp_path / "run" / "workers.log").read_text().splitlines()
              if line.startswith(f"=== numpy-spmd on {devices} device(s), replicate 0") and "worker pid(s)" in line]
    assert len(starts) == workers, starts
