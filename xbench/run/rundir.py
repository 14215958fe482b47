"""A run directory has one owner at a time and one identity.

The owner holds an exclusive lock (`flock` on LOCK_FILE) for as long as it writes into the
directory: a second run on it is refused and told who holds it. The kernel drops the lock
when its process dies, however it dies, so a lock file left by a dead process is stale by
construction and the next run simply takes it. The identity is run.json's run id (and the
spec and command it records): a new run refuses a directory that already holds anything of a
run, and `--resume` refuses records that belong to another run.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from xbench.errors import XbenchError
from xbench.results.schema import LOG_FILE, RUN_FILE, RUN_FILES

LOCK_FILE = ".xbench.lock"


class RunDirLock:
    """The exclusive right to write into a run directory, from `acquire` to `release`."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None

    def acquire(self, command: str) -> RunDirLock:
        """Take the lock or raise a one-line error naming the run that holds it."""
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise XbenchError(f"cannot lock {self.path.parent} for this run: {err.strerror or err}; "
                                  "choose a directory you can write to") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise XbenchError(f"{self.path.parent} is in use by another xbench run ({holder}); wait for it to "
                                  "finish, or choose another --out") from None
            # The holder before us may have removed the file between our open and our lock:
            # then we hold a lock on a file nobody else sees; take the one that is there.
            if _same_file(fd, self.path):
                break
            os.close(fd)
        _write_holder(fd, command)
        self.fd = fd
        return self

    @property
    def held(self) -> bool:
        return self.fd is not None

    def release(self) -> None:
        if self.fd is None:
            return
        if _same_file(self.fd, self.path):  # while still held: nobody can take a file about to vanish
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _write_holder(fd: int, command: str) -> None:
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
              "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    data = json.dumps(holder).encode()
    os.ftruncate(fd, 0)
    try:
        os.pwrite(fd, data, 0)
    except OSError:
        pass  # a full disk: the lock holds without its description


def _read_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {holder['pid']} on {holder['host']} since {holder['since']}: {holder['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its description is unreadable"


def run_files(run_dir: Path) -> list[str]:
    """The files of a run that `run_dir` holds (none for a new or empty directory)."""
    return [name for name in RUN_FILES if (Path(run_dir) / name).exists()]


def present_run_files(run_dir: Path) -> frozenset[str]:
    """The run files and workers' per-member logs `run_dir` holds now, by name."""
    run_dir = Path(run_dir)
    return frozenset([*run_files(run_dir), *(p.name for p in run_dir.glob(f"{LOG_FILE}.*"))])


def discard_run_files(run_dir: Path, keep: Iterable[str] = ()) -> None:
    """Remove the run files (and the workers' per-member logs) from `run_dir`, except those
    named in `keep`: for a run that never started, which takes back only what it wrote (`keep`:
    what the directory held when the run claimed it)."""
    for name in present_run_files(run_dir) - set(keep):
        (Path(run_dir) / name).unlink(missing_ok=True)


def check_new_run_dir(run_dir: Path) -> None:
    """A new run needs a directory that holds nothing of another run."""
    found = run_files(run_dir)
    if found:
        raise XbenchError(f"{run_dir} already holds a run ({', '.join(found)}); finish it with "
                          f"`xbench {_command_of(run_dir)} --resume {run_dir}`, or choose a new --out directory")


def _command_of(run_dir: Path) -> str:
    """The xbench command that started the run in `run_dir` (run.json's), "compare" where it
    does not say: a sweep resumes as a sweep, to be fitted at its end."""
    try:
        started = json.loads((Path(run_dir) / RUN_FILE).read_text(encoding="utf-8")).get("command", "")
    except (OSError, ValueError, AttributeError):
        return "compare"
    return "sweep" if str(started).startswith("xbench sweep") else "compare"

