"""Work made once per test session and read by many test modules, whichever pytest-xdist worker
runs them: a session fixture alone runs once per worker, so a real run read by two modules
ran twice whenever the two landed on different workers."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
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


def once_per_session(tmp_path_factory, name: str, make: Callable[[Path], Any]) -> Any:
    """`make(directory)`'s result (JSON-able), made by the first worker to ask and read back by the
    others, which wait on a lock meanwhile. A `make` that raises leaves nothing: the next asks again."""
    directory = shared_directory(tmp_path_factory, name)
    directory.parent.mkdir(parents=True, exist_ok=True)
    result = directory.parent / f"{name}.json"
    with open(directory.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            shutil.rmtree(directory, ignore_errors=True)  # what a `make` that raised left behind
            directory.mkdir()
            written = result.with_suffix(".partial")
            written.write_text(json.dumps(make(directory)))
            os.replace(written, result)  # whole or absent, even if this worker dies mid-write
        return json.loads(result.read_text())
