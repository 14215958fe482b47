"""No wait without a bound: a worker or fork server that stops answering (SIGSTOP, as a
debugger or job control would) ends as a recorded timeout with its phase, or is replaced,
within its bound; the run goes on, leaves no process behind, and `--resume` completes it
keeping the finished records byte for byte."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.process.test_compare_cli import FAST
from tests.process.test_faults import leftovers, one_line_error
from tests.support.fakes import STOP, STOP_DIR, STOP_RANK, STOP_SKIP
from tests.support.processes import TAG, new_tag, tagged_processes
from xbench.results.records import RECORDS_FILE, read_records
from xbench.run.zygote import START_VARIABLE

BOUND_S = 10  # --startup-timeout of these runs: a worker from scratch starts in a few seconds on a busy core
SLACK_S = 30  # what a run may take beyond its bound
RUN = ("compare", *FAST, "--batch-sizes", "16,32", "--devices", "1", "--replicates", "2",
       "--startup-timeout", str(BOUND_S), "--trial-timeout", "20")


@pytest.fixture
def tagged(monkeypatch, tmp_path):
    """Every process the test's run starts carries a tag; a process asked to stop claims a
    file in tmp_path first (tests.support.fakes.stop_once)."""
    tag = new_tag()
    monkeypatch.setenv(TAG, tag)
    monkeypatch.setenv(STOP_DIR, str(tmp_path))
    monkeypatch.setenv(STOP_SKIP, "1")  # past the worker that finds the backend's devices before the run
    return tag


def timed(run_cli, *args: str) -> tuple[int, str, float]:
    start = time.monotonic()
    code, _, err = run_cli(*args)
    return code, err, time.monotonic() - start


def ended_cleanly(tag: str, out: Path) -> None:
    assert tagged_processes(tag) == [], "a process of the run outlived it"
    assert leftovers(out) == []


def resume_keeps_finished_records(run_cli, out: Path) -> None:
    before = (out / RECORDS_FILE).read_bytes().splitlines(keepends=True)
    code, _, err = run_cli("compare", "--resume", str(out))
    assert code == 0, err
    after = (out / RECORDS_FILE).read_bytes().splitlines(keepends=True)
    assert after[:len(before)] == before  # finished records kept byte for byte
    assert {r["status"] for r in read_records(out)} == {"ok"}


def one_timeout(out: Path, phase: str) -> dict:
    """The run's one timed-out trial, named with `phase`; every other trial ok."""
    records = read_records(out)
    lost = [r for r in records if r["status"] != "ok"]
    assert len(lost) == 1 and lost[0]["status"] == "timeout", records
    assert f"timed out after {BOUND_S} s (--startup-timeout) in {phase}" in lost[0]["reason"], lost[0]
    assert len(records) == 2 * 2  # 2 batches x 2 replicates: none left out
    return lost[0]


def test_a_forked_worker_stopped_at_start_up_costs_one_trial(fake_backends, run_cli, tmp_path, tagged,
                                                             monkeypatch):
    monkeypatch.setenv(STOP, "worker")
    out = tmp_path / "run"
    code, err, took = timed(run_cli, *RUN, "--backends", "numpy", "--out", str(out))
    assert (tmp_path / "worker.1").exists(), "no worker stopped"
    assert code == 1 and took < BOUND_S + SLACK_S, err
    one_timeout(out, "start-up")
    assert all(r["process"]["forked"] for r in read_records(out) if r["status"] == "ok")
    ended_cleanly(tagged, out)
    resume_keeps_finished_records(run_cli, out)


def test_a_worker_from_scratch_stopped_at_start_up_costs_one_trial(fake_backends, run_cli, tmp_path, tagged,
                                                                   monkeypatch):
    monkeypatch.setenv(START_VARIABLE, "exec")
    monkeypatch.setenv(STOP, "worker")
    out = tmp_path / "run"
    code, err, took = timed(run_cli, *RUN, "--backends", "numpy", "--out", str(out))
    assert (tmp_path / "worker.1").exists(), "no worker stopped"
    assert code == 1 and took < BOUND_S + SLACK_S, err
    one_timeout(out, "start-up")
    ended_cleanly(tagged, out)
    resume_keeps_finished_records(run_cli, out)


def test_an_spmd_rank_stopped_at_start_up_costs_one_trial(fake_backends, run_cli, tmp_path, tagged, monkeypatch):
    monkeypatch.setenv(STOP, "worker")
    monkeypatch.setenv(STOP_RANK, "1")
    out = tmp_path / "run"
    code, err, took = timed(run_cli, "compare", *FAST, "--backends", "numpy-spmd", "--batch-sizes", "16,32",
                            "--devices", "2", "--startup-timeout", str(BOUND_S), "--out", str(out))
    assert (tmp_path / "worker.1").exists(), "no rank stopped"
    assert code == 1 and took < BOUND_S + SLACK_S, err
    records = read_records(out)
    lost = [r for r in records if r["status"] != "ok"]
    assert len(records) == 2 * 2 and len(lost) == 1 and lost[0]["status"] == "timeout", records
    assert lost[0]["reason"].startswith(f"timed out after {BOUND_S} s (--startup-timeout) in start-up (rank 1)")
    ended_cleanly(tagged, out)
    resume_keeps_finished_records(run_cli, out)


def test_a_fork_server_stopped_at_start_up_is_replaced_and_no_trial_is_lost(fake_backends, run_cli, tmp_path,
                                                                            tagged, monkeypatch):
    monkeypatch.setenv(STOP, "server")
    monkeypatch.setenv(STOP_SKIP, "0")
    out = tmp_path / "run"
    code, err, took = timed(run_cli, *RUN, "--backends", "numpy-stopping-preload", "--out", str(out))
    assert (tmp_path / "server.0").exists(), "no fork server stopped"
    assert code == 0 and took < BOUND_S + SLACK_S, err
    records = read_records(out)
    assert len(records) == 2 * 2 and all(r["status"] == "ok" and r["process"]["forked"] for r in records)
    log = (out / "workers.log").read_text()
    assert f"timed out after {BOUND_S} s (--startup-timeout) in its import: ended, and replaced" in log
    assert "fork_server_off" not in json.loads((out / "run.json").read_text())
    ended_cleanly(tagged, out)


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def stop_the_fork_server_after_the_first_record(out: Path, tag: str, stopped: list[int]) -> threading.Thread:
    """A thread that stops the run's fork servers (not their workers, forked from them with
    the same command line) once a trial is recorded."""

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (out / RECORDS_FILE).exists() and (out / RECORDS_FILE).read_bytes().count(b"\n") >= 1:
                servers = [pid for pid in tagged_processes(tag) if parent(pid) == os.getpid()
                           and b"xbench.worker.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes()]
                for pid in servers:
                    os.kill(pid, signal.SIGSTOP)
                stopped.extend(servers)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_fork_server_stopped_mid_run_is_replaced_and_no_trial_is_lost(fake_backends, run_cli, tmp_path, tagged):
    out, stopped = tmp_path / "run", []
    watcher = stop_the_fork_server_after_the_first_record(out, tagged, stopped)
    code, err, took = timed(run_cli, *RUN, "--replicates", "3", "--backends", "numpy", "--out", str(out))
    watcher.join(timeout=5)
    assert stopped, "the fork server was not stopped"
    assert code == 0 and took < BOUND_S + SLACK_S, err
    records = read_records(out)
    assert len(records) == 2 * 3 and {r["status"] for r in records} == {"ok"}
    assert "ended, and replaced" in (out / "workers.log").read_text()
    ended_cleanly(tagged, out)


def test_a_fork_server_that_misses_twice_is_turned_off_said_once_and_recorded(fake_backends, run_cli, tmp_path,
                                                                              tagged):
    out = tmp_path / "run"
    code, err, took = timed(run_cli, *RUN, "--backends", "numpy-hanging-preload", "--out", str(out))
    assert code == 0 and took < 2 * BOUND_S + SLACK_S, err
    records = read_records(out)
    assert len(records) == 2 * 2 and all(r["status"] == "ok" and not r["process"]["forked"] for r in records)
    off = json.loads((out / "run.json").read_text())["fork_server_off"]
    assert "in its import, its second miss" in off
    assert " ".join(err.split()).count("fork servers off, workers start from scratch") == 1, err
    ended_cleanly(tagged, out)


def test_a_verification_worker_stopped_at_start_up_fails_its_verification_in_time(fake_backends, run_cli,
                                                                                  tmp_path, tagged, monkeypatch):
    monkeypatch.setenv(STOP, "worker")
    out = tmp_path / "run"
    code, err, took = timed(run_cli, "compare", "--backends", "numpy-mlp", "--model", "medium", "--batch-sizes",
                            "16", "--devices", "1", "--repeats", "2", "--steps", "2", "--warmup-steps", "0",
                            "--startup-timeout", str(BOUND_S), "--out", str(out))
    assert (tmp_path / "worker.1").exists(), "no worker stopped"
    assert code == 1 and took < BOUND_S + SLACK_S, err
    problems = json.loads((out / "verify.json").read_text())["problems"]
    assert any(text.startswith(f"timeout: timed out after {BOUND_S} s (--startup-timeout) in start-up")
               for text in problems.values()), problems
    ended_cleanly(tagged, out)


@pytest.mark.parametrize("option,value", [("--trial-timeout", "0"), ("--trial-timeout", "-5"),
                                          ("--trial-timeout", "soon"), ("--startup-timeout", "soon")])
def test_a_bound_that_is_no_positive_number_is_a_one_line_error(fake_backends, run_cli, tmp_path, option, value):
    code, _, err = run_cli(*RUN, "--backends", "numpy", option, value, "--out", str(tmp_path / "run"))
    assert code == 2
    one_line_error(err, option if value == "soon" else "must be a positive finite number")
    assert not (tmp_path / "run").exists()


def test_a_finished_worker_stopped_before_its_exit_is_waited_for_within_the_grace_then_ended(tmp_path):
    """`Gang.let_exit` waits for a worker's own exit only so long: one stopped (SIGSTOP) after
    its job is ended by `stop`, as any other bound ends a child."""
    import queue
    import subprocess
    import sys

    from xbench.run.launcher import Gang
    from xbench.run.worker_process import Worker

    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdout=subprocess.PIPE,
                               start_new_session=True)
    os.kill(process.pid, signal.SIGSTOP)
    events: queue.Queue = queue.Queue()
    gang = Gang([Worker(0, process, events)], events, tmp_path / "workers.log", [], [None], time.monotonic())
    started = time.monotonic()
    gang.let_exit(grace_s=0.5)
    waited = time.monotonic() - started
    gang.stop()
    assert 0.4 < waited < 5 and process.poll() == -signal.SIGKILL
