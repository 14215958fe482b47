"""Child processes for tests that must run a framework in a process of its own (device counts
fixed at the framework's start, one process per rank): each child runs a test module as a
script, `python MODULE JOB.json`, and pickles its result to the job's "out"."""

from __future__ import annotations

import atexit
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRICT = ("-W", "error")  # warnings are errors in children too


def run_children(script: str | Path, jobs: dict[str, dict[str, Any]], tmp_path: Path, timeout_s: float,
                 env: dict[str, str] | None = None, python_flags: tuple[str, ...] = STRICT,
                 at_once: int | None = None) -> dict[str, Any]:
    """Run every job, at most `at_once` at a time (default: the cores this process may use,
    shared with the other pytest-xdist workers, at least one) and the ranks of one gang (jobs
    with the same "gang") together, each within `timeout_s` of its own start, so that a busy
    machine delays a job rather than failing it; a child that hangs or fails fails the test with
    the end of its log, and none outlives this call."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    slots = at_once or max(1, len(os.sched_getaffinity(0)) // workers)
    pending = _gangs(jobs)
    running: dict[str, tuple[subprocess.Popen, Any, float]] = {}
    started: list[tuple[subprocess.Popen, Any]] = []
    try:
        while pending or running:
            while pending and (not running or len(running) + len(pending[0]) <= slots):
                for name in pending.pop(0):
                    proc, log = _start(script, name, jobs[name], tmp_path, env, python_flags)
                    started.append((proc, log))
                    running[name] = (proc, log, time.monotonic() + timeout_s)
            for name, (proc, _, deadline) in list(running.items()):
                code = proc.poll()
                if code is None and time.monotonic() > deadline:
                    pytest.fail(f"job {name} did not finish in {timeout_s:g} s:\n{child_log(tmp_path, name)}")
                if code is not None:
                    assert code == 0, f"job {name} exited {code}:\n{child_log(tmp_path, name)}"
                    del running[name]
            time.sleep(0.05)
    finally:
        for proc, log in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            log.close()
    return {name: pickle.loads((tmp_path / f"{name}.pkl").read_bytes()) for name in jobs}


def _gangs(jobs: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The jobs in their order, those of one gang (ranks that wait for each other) as one unit."""
    units: dict[str, list[str]] = {}
    for name, job in jobs.items():
        units.setdefault(job.get("gang") or name, []).append(name)
    return list(units.values())


def _start(script: str | Path, name: str, job: dict[str, Any], tmp_path: Path, env: dict[str, str] | None,
           python_flags: tuple[str, ...]) -> tuple[subprocess.Popen, Any]:
    spec = tmp_path / f"{name}.json"
    spec.write_text(json.dumps({**job, "out": str(tmp_path / f"{name}.pkl")}))
    log = open(tmp_path / f"{name}.log", "w")
    # The checkout, after any overlay the tests run under (a working tree's backends/ as
    # xbench_backends, say, without reinstalling), which the child must import too.
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    proc = subprocess.Popen([sys.executable, *python_flags, str(script), str(spec)], cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": path, **(env or {})})
    return proc, log


def child_log(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.log").read_text()[-4000:]


def child_main(run) -> None:
    """A test module's `if __name__ == "__main__":` body: run(job) for the job file named on
    the command line, its result pickled to the job's "out"."""
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(job["out"]).write_bytes(pickle.dumps(run(job)))
    # The result is written: run the exit hooks (temporary directories, process groups), then
    # leave without the interpreter's finalization, where torch's gloo threads have twice
    # aborted a finished rank in CI ("terminate called without an active exception", exit -6).
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
