"""A fork server's preload that notes each process importing it ("server PID", a line each)
in the file that XBENCH_TEST_PRELOADS names: how many fork servers a run started for its
backend. `noted_worker` adds a worker's parent ("worker PPID"): which of them it forked from."""

import os

PRELOADS = "XBENCH_TEST_PRELOADS"


def note(line: str) -> None:
    if os.environ.get(PRELOADS):
        with open(os.environ[PRELOADS], "a", encoding="utf-8") as noted:
            noted.write(line + "\n")


def noted_worker() -> None:
    note(f"worker {os.getppid()}")


def noted(path) -> dict[str, list[int]]:
    """"server" and "worker" -> the pids noted."""
    found: dict[str, list[int]] = {"server": [], "worker": []}
    for line in path.read_text(encoding="utf-8").splitlines():
        kind, pid = line.split()
        found[kind].append(int(pid))
    return found


note(f"server {os.getpid()}")
