"""Worker processes forked from a fork server (`xbench.worker.zygote`) instead of started
from scratch: the interpreter and the backend's framework are imported once per run and
backend, and each worker is a fresh process with its own device context and compilation.

A worker process costs seconds before its first step, most of them importing its framework
(measured: 0.4 to 4 s per process, docs/statistics.md); a fork of a process that has
imported it takes milliseconds. Nothing else is shared: the server never touches a device
and compiles nothing, so every replicate still pays (and shows the variation of) its own
device set-up, compilation and autotuning.

Used on Linux, one set per run: started from the main thread to find the run's devices
(`xbench.run.readiness.ready_with_fork_servers`; a server started by another thread would die
with that thread: see `xbench.worker.main._die_with_parent`), then forked from by the run's
verification workers (side by side, from other threads), timed workers and all-reduce ranks;
a worker whose environment differs in more than `xbench.run.worker_process.PER_WORKER` gets
a server of its own.
The bounds below count over the whole run, from finding the devices to the all-reduce.
`XBENCH_WORKER_START=exec` turns it off; a server that fails to start falls back to plain
worker processes, which then fail or succeed as they always did. A server that misses a bound
(`xbench.run.bounds`: its import, a fork request, a worker's exit it must report) is ended
and replaced once; a second miss turns the fork servers off for the rest of the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from xbench.run.bounds import EXIT_GRACE_S, STARTUP_OPTION, Deadline, end_group, running

START_VARIABLE = "XBENCH_WORKER_START"  # "exec": every worker from scratch, no fork server
MISSES_ALLOWED = 1  # a server that misses a bound is replaced this many times, then turned off


class ServerGone(Exception):
    """The fork server is not there (it failed to start, or exited)."""


class ForkedProcess:
    """A forked worker as the launcher uses a `subprocess.Popen`: pid, stdin, stdout, wait()
    and returncode (negative: killed by that signal)."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes], server: Server) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.server = server
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code; None where it is unknown (the server stopped answering, and was
        ended); TimeoutExpired while the worker still runs."""
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, timeout)
        return self.returncode


class Server:
    """One fork server process and the thread that reads its messages."""

    def __init__(self, target: str, env: Mapping[str, str], log: Path, ready_timeout_s: float,
                 wait: bool = True) -> None:
        """Start the server; with `wait`, return once it is ready or has failed (`ready`),
        else leave that to `await_ready` (servers started together import side by side)."""
        ours, theirs = socket.socketpair()
        try:
            with open(log, "ab") as stderr:
                self.process = subprocess.Popen(
                    (sys.executable, "-m", "xbench.worker.zygote", target, str(theirs.fileno())),
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                    env=dict(env), start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.channel = ours
        self.replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self.exits: dict[int, int] = {}
        self.gone = False
        self.missed: str | None = None  # set: it missed a bound (and was ended): which, and how
        self.said = False  # whether the run's log says why this server forks nothing
        self.changed = threading.Condition()
        self.request_lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.deadline = Deadline(ready_timeout_s, "its import", STARTUP_OPTION)
        self.ready: str | None = "it is still starting"  # None once ready, else why it is not
        if wait:
            self.await_ready()

    def await_ready(self) -> None:
        """Wait for the server's first reply (`ready` says how it went); one that failed is ended."""
        try:
            self.ready = self._first_reply(self.deadline)
        except BaseException:  # interrupted while the framework imports
            self.close()
            raise
        if self.ready is not None:
            self.close(at_once=True)

    def _first_reply(self, deadline: Deadline) -> str | None:
        """None once the server is ready, else why it is not."""
        try:
            reply = self.replies.get(timeout=deadline.left())
        except queue.Empty:
            self.missed = deadline.missed()
            return f"no answer within {deadline.seconds:g} s"
        return None if "ready" in reply else str(reply.get("failed") or reply)

    def _read(self) -> None:
        try:
            with self.channel.makefile("rb") as stream:
                for line in stream:
                    message = json.loads(line)
                    with self.changed:
                        if "exit" in message:
                            self.exits[message["exit"]] = message["code"]
                            self.changed.notify_all()
                            continue
                        if "pid" in message:  # a pid used before may come again: not its old exit
                            self.exits.pop(message["pid"], None)
                    self.replies.put(message)
        except (OSError, ValueError):
            pass  # a closed channel or a line it cannot read: the server is of no further use
        finally:
            with self.changed:
                self.gone = True
                self.changed.notify_all()
            self.replies.put({"failed": "the fork server exited"})

    def fork(self, env: Mapping[str, str], stderr: IO[Any], deadline: Deadline) -> ForkedProcess:
        """A worker forked with `env`, its stderr `stderr`, and pipes for stdin and stdout; the
        server answers by `deadline`, or is ended (`missed` says so)."""
        if self.ready is not None or self.gone:
            raise ServerGone(self.missed or self.ready or "the fork server exited")
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        try:
            request = json.dumps({"env": dict(env), "cwd": os.getcwd()}).encode() + b"\n"
            with self.request_lock:
                # Never blocks: a request is far smaller than the socket's buffer, and a server
                # that left earlier ones unread has already missed its bound.
                sent = socket.send_fds(self.channel, [request], [stdin_read, stdout_write, stderr.fileno()],
                                       socket.MSG_DONTWAIT)
                if sent != len(request):
                    raise OSError(f"sent {sent} of {len(request)} bytes")
                reply = self.replies.get(timeout=deadline.left())
            if "pid" not in reply:
                raise OSError(str(reply.get("failed") or reply))
        except queue.Empty:
            self._close_pipes(stdin_write, stdout_read)
            self.fail(deadline.missed())
            raise ServerGone(self.ready or "") from None
        except OSError as err:
            self._close_pipes(stdin_write, stdout_read)
            # A late answer would be taken for the next request's: no next request.
            self.ready = f"the fork server did not answer: {err or 'no reply'}"
            self.close()
            raise ServerGone(self.ready) from None
        finally:
            os.close(stdin_read)
            os.close(stdout_write)
        return ForkedProcess(reply["pid"], os.fdopen(stdin_write, "wb"), os.fdopen(stdout_read, "rb"), self)

    @staticmethod
    def _close_pipes(*fds: int) -> None:
        for fd in fds:
            os.close(fd)

    def fail(self, missed: str) -> None:
        """The server missed a bound: end it (its workers die with it), so that nothing it says
        late is taken for an answer to a later request."""
        self.missed = missed
        self.ready = f"the fork server {missed}"
        self.close(at_once=True)

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """Worker `pid`'s exit code, as the server reports it. A worker that is gone while its
        exit goes unreported for `EXIT_GRACE_S` means a server that stopped answering: it is
        ended, and the code is unknown (None)."""
        with self.changed:
            if self.changed.wait_for(lambda: pid in self.exits or self.gone, timeout):
                return self._exit_of(pid)
            if running(pid):
                raise subprocess.TimeoutExpired(f"worker {pid}", timeout or 0)
            if self.changed.wait_for(lambda: pid in self.exits or self.gone, EXIT_GRACE_S):
                return self._exit_of(pid)
        self.fail(f"did not report the exit of worker {pid} within {EXIT_GRACE_S:g} s")
        return None

    def _exit_of(self, pid: int) -> int | None:
        if pid in self.exits:
            return self.exits[pid]
        return None if self.missed else -signal.SIGKILL  # the server's death took its children

    def close(self, at_once: bool = False) -> None:
        """Hang up: the server exits, and its workers with it (they die with their parent).
        `at_once`, or when it does not exit within `EXIT_GRACE_S` (a server that is stopped, or
        whose import never returns, cannot hear the hang-up): ended with its process group,
        whatever its import started."""
        with contextlib.suppress(OSError):
            self.channel.shutdown(socket.SHUT_RDWR)
        self.channel.close()
        if at_once:
            end_group(self.process.pid)  # it leads its own session
        try:
            self.process.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            end_group(self.process.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=EXIT_GRACE_S)
        if self.reader is not threading.current_thread():
            self.reader.join(timeout=EXIT_GRACE_S)


class ForkServers:
    """The fork servers of one run: one per backend and worker environment, started when a
    worker is first asked of it. `fork` returns None where a worker must start from scratch
    (the server failed, the fork servers are off, or the caller is not the main thread).

    A server that misses a bound is ended and replaced, `MISSES_ALLOWED` times over the run;
    the next miss turns every fork server off for the rest of the run (`turned_off` hears
    why, once). A server that fails otherwise (its import raised, it exited) is not replaced:
    its backend's workers start from scratch."""

    def __init__(self, log: Path, ready_timeout_s: float,
                 turned_off: Callable[[str], None] | None = None) -> None:
        self.log = log
        self.ready_timeout_s = ready_timeout_s  # the run's start-up timeout: the import is most of a start
        self.turned_off = turned_off
        self.servers: dict[tuple, Server] = {}
        self.misses = 0
        self.off: str | None = None  # set: why no worker is forked any more
        self.lock = threading.Lock()

    def fork(self, target: str, env: Mapping[str, str], per_worker: frozenset[str],
             stderr: IO[Any]) -> ForkedProcess | None:
        """A worker of backend `target` with environment `env`; the variables in `per_worker`
        differ between workers (a rank's), so the server is shared across them."""
        shared = {k: v for k, v in env.items() if k not in per_worker}
        key = _key(target, shared)
        while True:
            with self.lock:
                server = self._server(key, target, shared)
            if server is None:
                return None
            try:
                return server.fork(env, stderr, Deadline(self.ready_timeout_s, "a fork request", STARTUP_OPTION))
            except ServerGone as err:
                if not self._replaced(key, target, server, str(err)):
                    return None

    def start(self, targets: Sequence[str], env: Mapping[str, str], per_worker: frozenset[str]) -> None:
        """Start the servers that `fork` will use for workers of `targets` with environment
        `env` now, side by side, from this thread: the main thread, where a caller that forks
        from other threads (`launcher.run_groups`' side-by-side jobs) must start them, since
        `fork` starts none there."""
        shared = {k: v for k, v in env.items() if k not in per_worker}
        started = []
        with self.lock:
            for target in dict.fromkeys(targets):
                if self.off is None and _key(target, shared) not in self.servers:
                    server = self._server(_key(target, shared), target, shared, wait=False)
                    started += [server] if server is not None else []
        for server in started:
            server.await_ready()

    def _server(self, key: tuple, target: str, shared: Mapping[str, str], wait: bool = True) -> Server | None:
        """The server for `key`, started if need be; None where fork servers are off, or where
        it cannot be started from this thread."""
        if self.off is not None:
            return None
        server = self.servers.get(key)
        if server is None:
            if threading.current_thread() is not threading.main_thread():
                return None
            server = self.servers[key] = Server(target, shared, self.log, self.ready_timeout_s, wait)
        return server

    def _replaced(self, key: tuple, target: str, server: Server, why: str) -> bool:
        """After `server` failed: whether the next fork may try a new one."""
        if server.missed is None:
            if not server.said:
                server.said = True
                self._log(f"=== no fork server for {target} ({why}): workers start from scratch\n")
            return False
        with self.lock:
            if self.servers.get(key) is not server:
                return True  # another caller replaced it already
            del self.servers[key]
            self.misses += 1
            if self.misses <= MISSES_ALLOWED:
                self._log(f"=== the fork server for {target} {server.missed}: ended, and replaced\n")
                return True
            self.off = f"the fork server for {target} {server.missed}, its second miss"
        self._log(f"=== {self.off}: fork servers off for the rest of the run, workers start from scratch\n")
        if self.turned_off is not None:
            self.turned_off(self.off)
        return False

    def _log(self, line: str) -> None:
        with contextlib.suppress(OSError), open(self.log, "ab") as log:
            log.write(line.encode())

    def close(self) -> None:
        with self.lock:
            servers, self.servers = list(self.servers.values()), {}
        for server in servers:
            server.close()


def _key(target: str, shared: Mapping[str, str]) -> tuple:
    """What tells servers apart: the backend, and the environment all its workers share."""
    return target, tuple(sorted(shared.items()))


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get(START_VARIABLE, "fork") != "exec"


@contextlib.contextmanager
def closed_on_error(servers: ForkServers | None) -> Iterator[None]:
    """Ends `servers` (None: nothing to end) where the block raises, and lets it raise: for the
    steps between starting a run's servers and handing them to what ends them."""
    try:
        yield
    except BaseException:
        if servers is not None:
            servers.close()
        raise


@contextlib.contextmanager
def fork_servers(log: Path, ready_timeout_s: float,
                 turned_off: Callable[[str], None] | None = None) -> Iterator[ForkServers | None]:
    """Fork servers for the length of a run (None where they are off); their own output
    goes to `log`; each bound on them is the run's start-up timeout, `ready_timeout_s`;
    `turned_off` hears once why they were turned off, if they are."""
    if not enabled():
        yield None
        return
    servers = ForkServers(log, ready_timeout_s, turned_off)
    try:
        yield servers
    finally:
        servers.close()
