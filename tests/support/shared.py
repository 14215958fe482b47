"""Work made once per test session and read by many test modules, whichever pytest-xdist worker
runs them: a session fixture alone runs once per worker, so a real run read by two modules
ran twice whenever the two landed on different workers."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def shared_root(tmp_path_factory) -> Path:
    """The session's directory that every worker sees: under xdist each worker's basetemp is a
    sibling in one directory of the session; without it, the basetemp itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_directory(tmp_path_factory, name: str) -> Path:
    """Where `once_per_session(..., name, ...)` made its work."""
    return shared_root(tmp_path_factory) / "shared" / name


# How long a worker waits for another's `make` (the longest, a real run, takes about a minute
# alone and two on a busy 2-core machine).
WAIT_S = 900


def once_per_session(tmp_path_factory, name: str, make: Callable[[Path], Any], wait_s: float = WAIT_S) -> Any:
    """`make(directory)`'s result (JSON-able), made by the first worker to ask and read back by the
    others, which wait on a lock meanwhile, `wait_s` at most. A `make` that raised leaves
    nothing behind for the next to trip on: it makes it again."""
    directory = shared_directory(tmp_path_factory, name)
    directory.parent.mkdir(parents=True, exist_ok=True)
    result = directory.parent / f"{name}.json"
    with open(directory.parent / f"{name}.lock", "w") as lock:
        _lock_within(lock, wait_s, name)
        if not result.exists():
            shutil.rmtree(directory, ignore_errors=True)  # what a `make` that raised left behind
            directory.mkdir()
            written = result.with_suffix(".partial")
            written.write_text(json.dumps(make(directory)))
            os.replace(written, result)  # whole or absent, even if this worker dies mid-write
        return json.loads(result.read_text())


def _lock_within(lock, wait_s: float, name: str) -> None:
    """The lock, or a TimeoutError after `wait_s` (a worker stuck in `make` must not hang the others)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"another test worker held {name!r} for over {wait_s:g} s") from None
            time.sleep(0.2)
