"""Running plugin code xbench does not control (backends' and model families' entry points):
each call in a daemon thread, all at once, waited for at most `XBENCH_PROBE_TIMEOUT_S`
seconds in all. Whatever a call raises, `SystemExit` included, is kept as the reason the
plugin is unusable; a call that does not return in time is left behind in its thread, which
ends with the process. Only KeyboardInterrupt gets through (it is the user's)."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from xbench.errors import XbenchError, brief, one_line

TIMEOUT_VARIABLE = "XBENCH_PROBE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 20.0  # a plugin reads metadata and must not import its framework: generous
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # past a week, waits overflow the clock


def plugin_timeout() -> float:
    """Seconds the plugins being loaded may take, in all."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT_S:  # also refuses nan
        raise XbenchError(f"{TIMEOUT_VARIABLE} must be a positive number of seconds up to {MAX_TIMEOUT_S:g}, "
                          f"got {brief(text)}")
    return seconds


@dataclass
class Call:
    """One plugin call in its thread: its value, or what it raised, once `done` is set."""

    name: str
    value: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def run(self, call: Callable[[], Any]) -> None:
        try:
            self.value = call()
        except BaseException as err:  # SystemExit too: a broken plugin must not end xbench
            self.error = err
        finally:
            self.done.set()


def call_all(calls: Mapping[str, Callable[[], Any]], timeout: float) -> dict[str, Call]:
    """Every call started in a daemon thread of its own; returned once all are done or
    `timeout` seconds have passed (a call not `done` then did not answer)."""
    started = {name: Call(name) for name in calls}
    for name, call in calls.items():
        threading.Thread(target=started[name].run, args=(call,), name=f"xbench-plugin-{name}", daemon=True).start()
    deadline = time.monotonic() + timeout
    for call_state in started.values():
        call_state.done.wait(max(0.0, deadline - time.monotonic()))
    for call_state in started.values():
        if call_state.done.is_set() and isinstance(call_state.error, KeyboardInterrupt):
            raise call_state.error
    return started


MAX_REASON = 300  # characters of a plugin's own words that xbench shows


def described(error: BaseException) -> str:
    """`Type: message` on one line of reasonable length, e.g. "SystemExit: 3"."""
    message = one_line(str(error), MAX_REASON)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
