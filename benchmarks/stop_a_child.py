"""Run an xbench command and stop one of the processes it starts, as a debugger, a job-control
signal or a hung driver call would: `worker` stops the first worker (a process running
`xbench.worker`, forked or started from scratch, any rank) DELAY seconds after it appears,
`server` the first fork server. Prints when it stopped what, how the run ended and after how
long, and whether any process of the run outlived it (none should: xbench ends what it started).

    python benchmarks/stop_a_child.py [--limit S] [--forked] worker 0.5 -- compare --backends jax --model medium ...

Exit status: 0 when the run ended by itself within --limit seconds and left nothing alive, else 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SERVER = "xbench.worker.zygote"
WORKER = "xbench.worker"


def descendants(root: int) -> list[int]:
    """Every live process below `root`, oldest first."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [root]
    while frontier:
        children = sorted(pid for pid, parent in parents.items() if parent in frontier)
        found += children
        frontier = children
    return found


def command(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def target(root: int, what: str, forked: bool = False) -> int | None:
    """The first process of the kind asked for, or None yet: a fork server, or a worker (a fork
    server's child where there is a fork server, else, unless `forked`, a worker started from
    scratch: a device probe, a rank, a worker where fork servers are off)."""
    processes = [(pid, command(pid)) for pid in descendants(root)]
    servers = [pid for pid, line in processes if SERVER in line]
    if what == "server":
        return servers[0] if servers else None
    children = descendants(servers[0]) if servers else []
    if children:
        return children[0]
    if forked:
        return None
    return next((pid for pid, line in processes if WORKER in line and SERVER not in line), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("worker", "server"))
    parser.add_argument("delay", type=float, help="seconds after it appears")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds before the run counts as hung")
    parser.add_argument("--forked", action="store_true", help="a worker forked from a fork server only (a trial's)")
    parser.add_argument("xbench", nargs=argparse.REMAINDER, help="-- and the xbench command's arguments")
    args = parser.parse_args()
    argv = args.xbench[1:] if args.xbench[:1] == ["--"] else args.xbench
    start = time.monotonic()
    run = subprocess.Popen([sys.executable, "-m", "xbench", *argv], start_new_session=True)
    stopped = None
    while run.poll() is None and time.monotonic() - start < args.limit:
        if stopped is None:
            pid = target(run.pid, args.what, args.forked)
            if pid is not None:
                time.sleep(args.delay)
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:  # it ended meanwhile (a device probe, say): the next one
                    continue
                stopped = pid
                print(f"stopped {args.what} {pid} ({command(pid)[:80]}) at {time.monotonic() - start:.1f} s",
                      flush=True)
        time.sleep(0.05)
    code, wall = run.poll(), time.monotonic() - start
    print(f"exit {code} after {wall:.1f} s" if code is not None else f"still running after {wall:.1f} s", flush=True)
    left = descendants(run.pid) + ([run.pid] if code is None else [])
    if left:
        print(f"left alive: {left}", flush=True)
        os.killpg(run.pid, signal.SIGKILL)
    return 0 if code is not None and not left else 1


if __name__ == "__main__":
    sys.exit(main())
