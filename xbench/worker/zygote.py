"""A fork server: one backend's modules imported once, a fresh worker process forked per job.

Started by `xbench.run.zygote` as `python -m xbench.worker.zygote TARGET FD`. It imports the
backend's module and the modules its class names in `fork_preload` (`DeclaresForkPreload`: its
framework), touching no device, then serves requests on the socket FD: each request (a JSON
line with the worker's environment and working directory, and three file descriptors: the
worker's stdin, stdout and stderr) is answered with a forked child's pid; when a child exits,
its exit code follows.

What keeps a forked worker honest: it is a new process, with its own device context (the
server never touched a device) and its own compilation (the server compiled nothing); only
the import, which is the same bytes in every process, is shared. A child runs exactly
`xbench.worker.main.main`, as `python -m xbench.worker` would.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import tempfile
import traceback
import warnings

from xbench.contract import fork_preload_of
from xbench.worker import main as worker

MAX_FDS = 3  # stdin, stdout, stderr of a worker


def main(argv: list[str]) -> int:
    worker._die_with_parent()  # and its children die with it (they ask for the same)
    target, fd = argv[0], int(argv[1])
    channel = socket.socket(fileno=fd)
    try:
        preload(target)
    except Exception as err:  # the launcher falls back to plain worker processes and says why
        send(channel, {"failed": worker.failure(err)})
        return 1
    send(channel, {"ready": os.getpid()})
    serve(channel)
    return 0


def preload(target: str) -> None:
    """Import the backend's class and the modules it names, without instantiating it; then
    move everything imported out of the cyclic collector's reach, so that a worker's collection
    between trials (`worker.run_trials`) neither walks the framework's objects nor copies the
    pages it shares with this process."""
    for module in fork_preload_of(worker.backend_class(target)):
        importlib.import_module(module)
    gc.collect()
    gc.freeze()


def serve(channel: socket.socket) -> None:
    """Fork a worker per request and report each one's exit, until the launcher hangs up.
    SIGCHLD wakes the loop through a pipe, so it never polls."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    buffer, fds = b"", list[int]()
    while True:
        readable, _, _ = select.select([channel.fileno(), wake_read], [], [])
        if wake_read in readable:
            os.read(wake_read, 512)
            reap(channel, children)
        if channel.fileno() not in readable:
            continue
        data, more, _, _ = socket.recv_fds(channel, 1 << 20, MAX_FDS)
        if not data:
            return  # the launcher closed its end: its run is over
        buffer, fds = buffer + data, fds + more
        if b"\n" in buffer:  # one request at a time: the launcher waits for each answer
            line, buffer = buffer.split(b"\n", 1)
            pid = fork_worker(json.loads(line), fds, channel, (wake_read, wake_write))
            children.add(pid)
            send(channel, {"pid": pid})
            fds = []


def fork_worker(request: dict, fds: list[int], channel: socket.socket, wake: tuple[int, int]) -> int:
    """Fork one worker; returns its pid once it leads its own process group, so that the
    launcher's kill of that group reaches it from the first moment, as with a Popen'd worker."""
    sys.stdout.flush()
    sys.stderr.flush()
    server = os.getpid()
    started_read, started_write = os.pipe()
    with warnings.catch_warnings():
        # The framework's import left idle pool threads (a BLAS pool, an allocator's
        # background thread) that register their own fork handlers; the child starts its
        # device context and thread pools afresh.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os.setsid()  # first: leads its own process group, as the launcher's workers do
        os.close(started_write)  # the server's read ends: the group exists
        os._exit(run_worker(request, fds, (*wake, started_read, channel.fileno()), server))
    os.close(started_write)
    os.read(started_read, 1)  # returns at the child's close (or its death)
    os.close(started_read)
    for fd in fds:
        os.close(fd)
    return pid


def run_worker(request: dict, fds: list[int], inherited: tuple[int, ...], server: int) -> int:
    """In the forked child: become what `python -m xbench.worker` would have been, run it, and
    end as Python would (exit handlers run, the exit status by SystemExit's rules)."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in (*fds, *inherited):
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # as in a fresh process: from this environment's TMPDIR, not one cached before
        os.environ["XBENCH_PARENT_PID"] = str(server)  # dies with this server
        os.chdir(request["cwd"])
        code = exit_status(worker.main())
    except SystemExit as done:
        code = exit_status(done.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # e.g. a backend's temporary compiler cache, removed at exit
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def exit_status(code: object) -> int:
    """The status `sys.exit(code)` gives: None 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def reap(channel: socket.socket, children: set[int]) -> None:
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)
            send(channel, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def send(channel: socket.socket, message: dict) -> None:
    channel.sendall(json.dumps(message).encode() + b"\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
