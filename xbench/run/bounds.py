"""Every wait of xbench on a process it started has a deadline: a `Deadline` names the phase the
child is in and the option that bounds it, and a child past it is ended with `end_group`.

The bounds (docs/launchers.md, "Bounds"): a fork server's import, a request to it and a
worker's start-up (its first message) get `--startup-timeout`; a trial gets
`protocol.trial_timeout_s` from its start (`--trial-timeout`), and up to `--startup-timeout`
more before it; a process that was killed, or that closed its output, gets `EXIT_GRACE_S`
to be gone, and a worker that finished its job as long to exit on its own. A child that was
stopped (SIGSTOP, a debugger) or hangs in a call that never returns is then ended and
recorded with the phase it was in; the run goes on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

# A killed process is gone within milliseconds; a fork server reports its workers' exits as
# fast; a worker that finished its job exits within about a second (its exit handlers). This
# bounds what the kernel, a stopped fork server or a hanging exit handler could hold up.
EXIT_GRACE_S = 10.0

STARTUP_OPTION = "--startup-timeout"
TRIAL_OPTION = "protocol.trial_timeout_s"


class Deadline:
    """When a wait on a child process ends, what the child was doing meanwhile (`phase`, which
    the caller updates as the child reports progress) and which option set the bound."""

    def __init__(self, seconds: float, phase: str, option: str) -> None:
        self.seconds = seconds
        self.phase = phase
        self.option = option
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() >= self.at

    def missed(self) -> str:
        """The reason a record gives for a child that missed this deadline."""
        return f"timed out after {self.seconds:g} s ({self.option}) in {self.phase}"


def end_group(pid: int) -> None:
    """End the process group `pid` leads, whatever state its members are in: SIGCONT first, so
    that a stopped member runs on to its death, then SIGKILL. Also when the leader has exited:
    what it started may live on."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def running(pid: int) -> bool:
    """Whether `pid` still runs (a zombie does not: it only waits to be reaped)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
