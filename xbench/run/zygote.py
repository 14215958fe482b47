"""Worker processes forked from a fork server (`xbench.worker.zygote`) instead of started
from scratch: the interpreter and the backend's framework are imported once per run and
backend, and each worker is a fresh process with its own device context and compilation.

A worker process costs seconds before its first step, most of them importing its framework
(measured: 0.4 to 4 s per process, docs/statistics.md); a fork of a process that has
imported it takes milliseconds. Nothing else is shared: the server never touches a device
and compiles nothing, so every replicate still pays (and shows the variation of) its own
device set-up, compilation and autotuning.

Used on Linux, for timing runs driven from the main thread (a server started by another
thread would die with that thread: see `xbench.worker.main._die_with_parent`).
`XBENCH_WORKER_START=exec` turns it off; a server that fails to start falls back to plain
worker processes, which then fail or succeed as they always did.
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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

START_VARIABLE = "XBENCH_WORKER_START"  # "exec": every worker from scratch, no fork server
REPLY_TIMEOUT_S = 30.0  # a fork


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

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, timeout)
        return self.returncode


class Server:
    """One fork server process and the thread that reads its messages."""

    def __init__(self, target: str, env: Mapping[str, str], log: Path, ready_timeout_s: float) -> None:
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
        self.said = False  # whether the run's log says why this server forks nothing
        self.changed = threading.Condition()
        self.request_lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        try:
            self.ready = self._first_reply(ready_timeout_s)
        except BaseException:  # interrupted while the framework imports
            self.close()
            raise
        if self.ready is not None:
            self.close(at_once=True)

    def _first_reply(self, timeout: float) -> str | None:
        """None once the server is ready, else why it is not."""
        try:
            reply = self.replies.get(timeout=timeout)
        except queue.Empty:
            return f"no answer within {timeout:g} s"
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

    def fork(self, env: Mapping[str, str], stderr: IO[Any]) -> ForkedProcess:
        """A worker forked with `env`, its stderr `stderr`, and pipes for stdin and stdout."""
        if self.ready is not None or self.gone:
            raise ServerGone(self.ready or "the fork server exited")
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        try:
            request = json.dumps({"env": dict(env), "cwd": os.getcwd()}).encode() + b"\n"
            with self.request_lock:
                sent = socket.send_fds(self.channel, [request], [stdin_read, stdout_write, stderr.fileno()])
                if sent != len(request):
                    raise OSError(f"sent {sent} of {len(request)} bytes")
                reply = self.replies.get(timeout=REPLY_TIMEOUT_S)
            if "pid" not in reply:
                raise OSError(str(reply.get("failed") or reply))
        except (OSError, queue.Empty) as err:
            for fd in (stdin_write, stdout_read):
                os.close(fd)
            # A late answer would be taken for the next request's: no next request.
            self.ready = f"the fork server did not answer: {err or 'no reply'}"
            self.close()
            raise ServerGone(self.ready) from None
        finally:
            os.close(stdin_read)
            os.close(stdout_write)
        return ForkedProcess(reply["pid"], os.fdopen(stdin_write, "wb"), os.fdopen(stdout_read, "rb"), self)

    def exit_code(self, pid: int, timeout: float | None) -> int:
        with self.changed:
            if not self.changed.wait_for(lambda: pid in self.exits or self.gone, timeout):
                raise subprocess.TimeoutExpired(f"worker {pid}", timeout or 0)
            return self.exits.get(pid, -signal.SIGKILL)  # the server's death took its children

    def close(self, at_once: bool = False) -> None:
        """Hang up: the server exits, and its workers with it (they die with their parent).
        `at_once`: a server that never became ready (an import that does not return cannot
        hear the hang-up) is killed with its process group, whatever its import started."""
        with contextlib.suppress(OSError):
            self.channel.shutdown(socket.SHUT_RDWR)
        self.channel.close()
        if at_once:
            with contextlib.suppress(OSError):
                os.killpg(self.process.pid, signal.SIGKILL)  # it leads its own session
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.reader is not threading.current_thread():
            self.reader.join(timeout=10)


class ForkServers:
    """The fork servers of one run: one per backend and worker environment, started when a
    worker is first asked of it. `fork` returns None where a worker must start from scratch
    (the server failed, or the caller is not the main thread)."""

    def __init__(self, log: Path, ready_timeout_s: float) -> None:
        self.log = log
        self.ready_timeout_s = ready_timeout_s  # the run's start-up timeout: the import is most of a start
        self.servers: dict[tuple, Server] = {}
        self.lock = threading.Lock()

    def fork(self, target: str, env: Mapping[str, str], per_worker: frozenset[str],
             stderr: IO[Any]) -> ForkedProcess | None:
        """A worker of backend `target` with environment `env`; the variables in `per_worker`
        differ between workers (a rank's), so the server is shared across them."""
        shared = {k: v for k, v in env.items() if k not in per_worker}
        key = (target, tuple(sorted(shared.items())))
        with self.lock:
            server = self.servers.get(key)
            if server is None:
                if threading.current_thread() is not threading.main_thread():
                    return None
                server = self.servers[key] = Server(target, shared, self.log, self.ready_timeout_s)
        try:
            return server.fork(env, stderr)
        except ServerGone as err:
            if not server.said:
                server.said = True
                with open(self.log, "ab") as log:
                    log.write(f"=== no fork server for {target} ({err}): workers start from scratch\n".encode())
            return None

    def close(self) -> None:
        with self.lock:
            servers, self.servers = list(self.servers.values()), {}
        for server in servers:
            server.close()


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get(START_VARIABLE, "fork") != "exec"


@contextlib.contextmanager
def fork_servers(log: Path, ready_timeout_s: float) -> Iterator[ForkServers | None]:
    """Fork servers for the length of a run (None where they are off); their own output
    goes to `log`; one not ready within `ready_timeout_s` (the run's start-up timeout) is given
    up for workers started from scratch."""
    if not enabled():
        yield None
        return
    servers = ForkServers(log, ready_timeout_s)
    try:
        yield servers
    finally:
        servers.close()
