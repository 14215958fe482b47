"""Child processes for tests that must run a framework in a process of its own (device counts
fixed at the framework's start, one process per rank): each child runs a test module as a
script, `python MODULE JOB.json`, and pickles its result to the job's "out"."""

from __future__ import annotations

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
                 env: dict[str, str] | None = None, python_flags: tuple[str, ...] = STRICT) -> dict[str, Any]:
    """Start every job at once and wait for all within one deadline; a child that hangs or
    fails fails the test with the end of its log, and none outlives this call."""
    procs: dict[str, tuple[subprocess.Popen, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        for name, job in jobs.items():
            spec = tmp_path / f"{name}.json"
            spec.write_text(json.dumps({**job, "out": str(tmp_path / f"{name}.pkl")}))
            log = open(tmp_path / f"{name}.log", "w")
            procs[name] = (subprocess.Popen([sys.executable, *python_flags, str(script), str(spec)], cwd=tmp_path,
                                            stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}), log)
        for name, (proc, _) in procs.items():
            try:
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"job {name} did not finish in {timeout_s:g} s:\n{child_log(tmp_path, name)}")
            assert code == 0, f"job {name} exited {code}:\n{child_log(tmp_path, name)}"
    finally:
        for proc, log in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            log.close()
    return {name: pickle.loads((tmp_path / f"{name}.pkl").read_bytes()) for name in jobs}


def child_log(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.log").read_text()[-4000:]


def child_main(run) -> None:
    """A test module's `if __name__ == "__main__":` body: run(job) for the job file named on
    the command line, its result pickled to the job's "out"."""
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(job["out"]).write_bytes(pickle.dumps(run(job)))
