"""Fault injection in verification: a verification worker killed by
SIGKILL must fail the run, never leave a program "passed" with 0 checks.

The worker is really killed, from outside, while it computes the reference gradients of one
trial: the fake numpy-mlp backend stops there (see `tests.support.fakes.PAUSE_TRIAL`) after writing
its pid, and this test sends that pid SIGKILL, as the kernel's OOM killer would. A worker that
xbench itself ends, on the user's Ctrl-C, is no crash: it is reported as none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ROOT
from tests.support.fakes import PAUSE_DIR, PAUSE_TRIAL
from tests.support.processes import TAG, new_tag, tagged_processes
from xbench.results.records import read_records

KILLED = "numpy-mlp/medium/d1/b32/r0"  # the data-parallel program's verification on 1 device


def kill_when_paused(directory, killed: list[int], timeout_s: float = 60) -> threading.Thread:
    """A thread that sends SIGKILL to the worker that paused (its pid in `directory`/pid)."""
    def wait_and_kill() -> None:
        path, deadline = directory / "pid", time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = path.read_text() if path.exists() else ""
            if text:
                os.kill(int(text), signal.SIGKILL)
                killed.append(int(text))
                return
            time.sleep(0.05)

    thread = threading.Thread(target=wait_and_kill, daemon=True)
    thread.start()
    return thread


def test_a_killed_verification_worker_fails_the_run_and_passes_nothing(fake_backends, run_cli, tmp_path,
                                                                       monkeypatch):
    """The issue's case: one backend on one device; its data-parallel program (verified, not
    timed) is killed; its plain program (timed) was compared with nothing else. Before: jax
    failed in verify.json, "jax plain: nothing to compare", records "passed" with 0 checks,
    exit 0."""
    monkeypatch.setenv(PAUSE_TRIAL, KILLED)
    monkeypatch.setenv(PAUSE_DIR, str(tmp_path))
    killed: list[int] = []
    killer = kill_when_paused(tmp_path, killed)
    out = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy-mlp", "--model", "medium", "--batch-sizes", "16",
                           "--devices", "1", "--single-device", "plain", "--repeats", "2", "--steps", "2",
                           "--warmup-steps", "0", "--out", str(out))
    killer.join(timeout=5)
    assert killed, "the verification worker never paused"
    assert code == 1, err
    flat = " ".join(err.split())
    assert "nothing to compare" not in flat and "passed" not in flat, err
    assert "verify numpy-mlp plain: FAILED" in flat
    verified = json.loads((out / "verify.json").read_text())
    assert verified["failed_backends"] == ["numpy-mlp", "numpy-mlp plain"]
    assert verified["problems"][KILLED].startswith("crashed: worker killed by signal 9")
    assert verified["problems"]["numpy-mlp/medium/d1/b32/plain/r0"].startswith(
        f"not verified: numpy-mlp d1 has no result ({KILLED} crashed: worker killed by signal 9")
    records = read_records(out)
    assert [r["trial_id"] for r in records] == [f"numpy-mlp/medium/d1/b16/plain/r{k}" for k in (0, 1)]
    for record in records:  # not timed: its work was never verified
        assert record["status"] == "skipped" and record["verification"]["status"] == "failed"
        assert "not verified: numpy-mlp d1 has no result" in record["reason"]
        assert any(f"{KILLED} crashed: worker killed by signal 9" in line
                   for line in record["verification"]["failed"])


PAUSED = "numpy-mlp/medium/d2/b32/r0"  # the data-parallel program's verification on 2 devices

XBENCH_WITH_FAKES = (  # `xbench ARGS...` in a process of its own, the test backends registered
    "import sys\n"
    "from xbench.run import registry\n"
    "from tests.conftest import FAKES\n"
    "installed = registry.list_entry_points()\n"
    "registry.list_entry_points = lambda: installed + FAKES\n"
    "from xbench.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("command", ["verify", "compare"])
def test_an_interrupt_reports_no_verification_run_in_flight_as_crashed(command, tmp_path):
    """Ctrl-C (SIGINT to xbench's process group, as a terminal or `timeout -s INT` sends it)
    while verification runs side by side: xbench ends the workers of the runs in flight, which
    did not crash. Before: "verifying 3/5: numpy-mlp medium d2 fp32: crashed: worker killed by
    signal 9; last output: (none) in 1 s", then "interrupted"."""
    tag = new_tag()
    out = tmp_path / "run"
    extra = ["--out", str(out), "--batch-sizes", "16", "--repeats", "2", "--steps", "2"] if command == "compare" else []
    process = subprocess.Popen(
        [sys.executable, "-c", XBENCH_WITH_FAKES, command, "--backends", "numpy-mlp", "--model", "medium",
         "--devices", "2", *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), TAG: tag, PAUSE_TRIAL: PAUSED, PAUSE_DIR: str(tmp_path)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGINT)  # its workers lead process groups of their own
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert "crashed" not in err and "killed by signal" not in err, err
    assert "numpy-mlp medium d2 fp32" not in err  # the run in flight: no verdict of any kind
    assert not (out / "verify.json").exists() and not (out / "records.jsonl").exists()  # a resumed run redoes it
    deadline = time.monotonic() + 10
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tagged_processes(tag) == []
