"""A machine-drift control, timed before and after a run's replicates.

Replicates inside one run share that run's state of the machine (clocks, other load, thermal
state), so they cannot see it change between runs. Two fixed workloads, the same in every run
and every xbench version, make it visible: a host-dispatch loop (pure Python calls, the cost a
host-bound step pays) and a fixed compute kernel (a numpy float32 matmul on the host's BLAS).
`xbench diff` compares them between runs (`xbench.results.control`) to tell a machine that moved
from code that changed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from xbench.results.control import CONTROL_FILE
from xbench.wire import utc_now

REPETITIONS = 9
LOOP_CALLS = 200_000
MATMUL_SIZE = 256
MATMULS = 20


def _step(x: int) -> int:
    return x + 1


def _host_loop_s() -> float:
    started = time.perf_counter()
    x = 0
    for _ in range(LOOP_CALLS):
        x = _step(x)
    return time.perf_counter() - started


def _matmul_s(a: np.ndarray) -> float:
    started = time.perf_counter()
    for _ in range(MATMULS):
        a @ a
    return time.perf_counter() - started


def measure() -> dict[str, list[float]]:
    """Seconds of each repetition of both workloads (about half a second in all on a 2-core
    CPU), each after an untimed one: a core that just woke up runs the first slowly."""
    a = np.random.default_rng(0).standard_normal((MATMUL_SIZE, MATMUL_SIZE)).astype(np.float32)
    _matmul_s(a)  # first touch: BLAS start-up, page faults
    _host_loop_s()
    return {"host_loop_s": [_host_loop_s() for _ in range(REPETITIONS)],
            "matmul_s": [_matmul_s(a) for _ in range(REPETITIONS)]}


def record(run_dir: Path, when: str) -> None:
    """Time the control and append it to the run's control.jsonl ("before" or "after")."""
    line = json.dumps({"when": when, "at": utc_now(), **measure()}) + "\n"
    with open(run_dir / CONTROL_FILE, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
