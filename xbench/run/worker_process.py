"""One worker process, as the launcher starts it: forked from its backend's fork server or
started from scratch (`WORKER_COMMAND`), its job written to its stdin, its events read by a
thread of its own into a queue its gang shares, and ended as a process group."""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from xbench.contract import COMPILE_CACHE_VARIABLE, MEMORY_SHARE_VARIABLE
from xbench.run.bounds import EXIT_GRACE_S, end_group
from xbench.run.zygote import ForkedProcess, ForkServers
from xbench.wire import Event, Job, WireError, decode_event

WORKER_COMMAND = (sys.executable, "-m", "xbench.worker")

# What a member's reader thread hands over: an event, a line that is no valid event (the
# error says why), or None once the member has exited.
Arrival = Event | WireError | None

# Set by torchrun for xbench itself; a worker must see only what its own launcher sets
# (torch's TORCHELASTIC_USE_AGENT_STORE would make rank 0 wait for a store nobody hosts).
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


# What may differ between the workers of one fork server: the launch variables, the GPUs a
# worker sees and its share of their memory (read when the worker's framework first touches
# CUDA; the server never does), and the run's compilation cache (read when a program is
# prepared), so that verification's workers and timing's fork from the same server.
PER_WORKER = frozenset((*LAUNCH_VARIABLES, "CUDA_VISIBLE_DEVICES", MEMORY_SHARE_VARIABLE, COMPILE_CACHE_VARIABLE))


def worker_environment() -> dict[str, str]:
    """xbench's own environment for a worker, less what only xbench's launcher may set: the
    launch variables, the run's compilation cache (a run without one has none) and a worker's
    share of its devices' memory; its temporary directory `workers_temporary_directory`."""
    private = (*LAUNCH_VARIABLES, COMPILE_CACHE_VARIABLE, MEMORY_SHARE_VARIABLE)
    env = {k: v for k, v in os.environ.items() if k not in private and not k.startswith("TORCHELASTIC_")}
    temporary = workers_temporary_directory()
    if temporary is not None:
        env["TMPDIR"] = temporary
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep framework chatter out of the log
    env["PYTHONUNBUFFERED"] = "1"
    env["XBENCH_PARENT_PID"] = str(os.getpid())  # the worker dies with it (see xbench.worker.main._die_with_parent)
    return env


# base temporary directory -> the workers' directory in it, for this process's life; the lock:
# workers start from several threads at once (the devices' probes, verification)
_WORKERS_TEMPORARY: dict[str, str] = {}
_WORKERS_TEMPORARY_LOCK = threading.Lock()


def workers_temporary_directory() -> str | None:
    """A directory of this process's own, inside the temporary directory it would use (TMPDIR),
    for its workers' temporary files, removed when this process exits. A worker removes its own
    at exit (TensorFlow's autograph code, a compiler's cache), but one that was killed (a timeout,
    Ctrl-C, a hang) cannot: they stayed in /tmp, a megabyte or so a killed compiled trial. None
    where no directory can be made there (the workers then use the usual one)."""
    base = os.environ.get("TMPDIR") or tempfile.gettempdir()
    with _WORKERS_TEMPORARY_LOCK:
        path = _WORKERS_TEMPORARY.get(base)
        if path is not None and os.path.isdir(path):
            return path
        try:
            path = tempfile.mkdtemp(prefix="xbench-workers-", dir=base)
        except OSError:
            return None
        if not _WORKERS_TEMPORARY:
            atexit.register(remove_workers_temporary)
        _WORKERS_TEMPORARY[base] = path
        return path


def remove_workers_temporary() -> None:
    """Remove the workers' temporary directories with what they left there (at exit)."""
    with _WORKERS_TEMPORARY_LOCK:
        while _WORKERS_TEMPORARY:
            shutil.rmtree(_WORKERS_TEMPORARY.popitem()[1], ignore_errors=True)


class Worker:
    """One running worker process and the thread that reads its events into a queue shared
    with the rest of its gang, tagged with its index."""

    def __init__(self, index: int, process: subprocess.Popen | ForkedProcess,
                 events: queue.Queue[tuple[int, Arrival]]) -> None:
        self.index = index
        self.process = process
        self.events = events
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    @classmethod
    def start(cls, index: int, job: Job, env: Mapping[str, str], log: Any,
              events: queue.Queue[tuple[int, Arrival]], servers: ForkServers | None = None) -> Worker:
        full = {**worker_environment(), **env}
        process: subprocess.Popen | ForkedProcess | None = None
        if servers is not None:
            process = servers.fork(job.target, full, PER_WORKER, log)
        if process is None:
            process = subprocess.Popen(WORKER_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                       env=full, start_new_session=True)
        stdin = process.stdin
        assert stdin is not None  # asked for with PIPE
        # Written by a thread: a job larger than the pipe holds would block until the worker
        # reads it, and a worker that never does is bounded by the start-up deadline instead.
        threading.Thread(target=_send, args=(stdin, job.to_json().encode()), daemon=True).start()
        return cls(index, process, events)

    def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None  # asked for with PIPE
        with stream:
            for line in stream:
                arrival = _arrival(line)
                if arrival is not None:
                    self.events.put((self.index, arrival))
        self.events.put((self.index, None))

    def kill(self) -> None:
        """End the worker and anything it started (it leads its own process group), stopped
        or not."""
        end_group(self.process.pid)

    def await_exit(self, seconds: float) -> None:
        """Wait at most `seconds` for the worker to exit on its own."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=max(0.0, seconds))

    def stop(self) -> None:
        self.kill()
        self.exit_code()
        self.reader.join(timeout=EXIT_GRACE_S)

    def exit_code(self) -> int | None:
        """Its exit code once it has exited, within `EXIT_GRACE_S` of being asked, else after it
        was ended; None where it is unknown (it did not go, or its fork server stopped
        answering)."""
        for _ in range(2):
            try:
                return self.process.wait(timeout=EXIT_GRACE_S)
            except subprocess.TimeoutExpired:
                self.kill()
        return None


def _send(stdin: Any, job: bytes) -> None:
    """Write a worker's job; a worker that died or was ended first explains itself by its exit."""
    try:
        with stdin:
            stdin.write(job)
    except (OSError, ValueError):
        pass


def _arrival(line: bytes) -> Event | WireError | None:
    """What one line of a worker's output says, or None for a line that says nothing: one cut
    off by the worker's death (its exit explains it), or output that is no JSON object (a
    sitecustomize banner before the worker claimed its stdout). A JSON object that is no
    valid event is a broken promise of the worker: the trial in flight fails with the reason."""
    if not line.endswith(b"\n") or not line.lstrip().startswith(b"{"):
        return None
    try:
        return decode_event(line)
    except WireError as err:
        return err
