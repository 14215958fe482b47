"""The worker jobs that are not trials: a backend's description of the devices it sees on one
device (`describe_all`, before a run), and its all-reduce microbenchmark (`allreduce_events`,
`xbench allreduce` and --breakdown), each in a gang of its own with a deadline for every wait."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xbench.run.bounds import STARTUP_OPTION, Deadline
from xbench.run.cluster import Launch
from xbench.run.launcher import STARTUP_TIMEOUT_S, Gang, spmd_jobs, unreadable
from xbench.run.zygote import ForkServers
from xbench.wire import AllReduce, Done, Job, SetupFailed, Unavailable, WireError


def describe_all(targets: Sequence[tuple[str, Path]], platform: str, timeout_s: float = STARTUP_TIMEOUT_S,
                 servers: ForkServers | None = None) -> list[dict[str, Any]]:
    """What each (target, log path)'s worker sees on one device: {"device_info": ...} or
    {"reason": ...}, forked from `servers` where they have one. The workers start at once and
    are waited for in turn from this thread, so that Ctrl-C or an error ends them all at once. Each may take
    `timeout_s` from when its turn comes (so its record's "timed out after" holds): a start-up
    that hangs costs its timeout once, and k that hang cost k of them."""
    gangs: list[Gang] = []
    try:
        for target, log_path in targets:
            gangs.append(Gang.start([(Job(target, 1, platform), {})], log_path, label=f"describe {target}",
                                    servers=servers))
        answers = [gang._await_ready(timeout_s) for gang in gangs]
        return [ready if "device_info" in ready else {"reason": ready["reason"]} for ready in answers]
    finally:
        for gang in gangs:
            gang.stop()


def allreduce_events(target: str, devices: int, platform: str, sizes: list[int], options: dict[str, Any],
                     log_path: Path, timeout_s: float, launcher: str = "subprocess",
                     launch: Launch | None = None, startup_timeout_s: float = STARTUP_TIMEOUT_S,
                     collectives: Sequence[str] = (), servers: ForkServers | None = None) -> list[dict[str, Any]]:
    """Run the collectives microbenchmark in one job; one result per size, with the fields of
    an `AllReduce` event (status ok, failed, or why the job could not run it). `collectives`
    names each size's collective (none: all all-reduces). With spmd, member 0's events carry
    the gathered timing, and the first size any rank fails ends the job (the ranks'
    collectives no longer match). Its workers fork from `servers` where they have one."""
    job = Job(target, devices, platform, mode="allreduce", sizes=tuple(sizes), options=options,
              collectives=tuple(collectives))
    jobs = spmd_jobs(job, devices, launch or Launch("spmd"), 0) if launcher == "spmd" else [(job, {})]
    gang = Gang.start(jobs, log_path, label=f"all-reduce {target} on {devices}", servers=servers)
    try:
        results = _AllReduceReader(gang, job.collective_sizes(), timeout_s, startup_timeout_s).read()
        if all(r["status"] == "ok" for r in results):
            gang.let_exit()  # its job is done: as a trial's gang (`run_group`)
        return results
    finally:
        gang.stop()


class _AllReduceReader:
    """Turns a gang's all-reduce events into one result per size."""

    GRACE_S = 10.0  # after a rank fails: time for member 0 to report the sizes before it

    def __init__(self, gang: Gang, items: list[tuple[str, int]], timeout_s: float, startup_timeout_s: float) -> None:
        self.gang, self.items, self.timeout_s, self.startup_timeout_s = gang, items, timeout_s, startup_timeout_s
        self.order = {item: i for i, item in enumerate(items)}  # (collective, size) -> its place in the job
        self.results: list[dict[str, Any]] = []
        self.finished: set[int] = set()  # members that said "done" (and may exit before member 0)
        self.failure: dict[str, Any] | None = None  # the first size a rank failed (spmd)
        self.failed_rank: int | None = None  # and that rank

    def read(self) -> list[dict[str, Any]]:
        deadline = Deadline(self.startup_timeout_s + self.timeout_s, "the all-reduce timing",
                            f"{STARTUP_OPTION} plus the all-reduce timeout")
        while True:
            item = self.gang.next_event(deadline)
            if item is None or (item[1] is None and item[0] not in self.finished):  # timed out, or exited early
                if self.failure is not None:
                    return self._after_failure(self.failure)
                why = f"timed out after {self.timeout_s:g} s" if item is None else self.gang._exit_reason(item[0])
                return self._rest_failed(why)
            index, event = item
            who = self.gang._who(index)
            if event is None:
                continue  # said "done", then exited
            if isinstance(event, WireError):
                return self._rest_failed(who + unreadable(event))
            if isinstance(event, (Unavailable, SetupFailed)):
                status = "skipped" if isinstance(event, Unavailable) else "failed"
                return [_size_result(c, n, status, who + event.reason) for c, n in self.items]
            if isinstance(event, AllReduce) and event.status != "ok" and self.gang.spmd and self.failure is None:
                self.failure = _size_result(event.collective, event.nbytes, event.status, who + str(event.reason))
                self.failed_rank = self.gang.ranks[index]
                deadline.at = min(deadline.at, time.monotonic() + self.GRACE_S)
            elif isinstance(event, AllReduce) and index == 0:
                if self.failure is not None and self.order[_key(event)] >= self.order[_key(self.failure)]:
                    return self._after_failure(self.failure)
                self.results.append(dataclasses.asdict(event))
            elif isinstance(event, Done):
                self.finished.add(index)
                if index == 0:
                    return self._after_failure(self.failure) if self.failure is not None else self.results

    def _after_failure(self, failed: dict[str, Any]) -> list[dict[str, Any]]:
        self.results = [r for r in self.results if _key(r) != _key(failed)] + [failed]
        at = f"{failed['nbytes']} bytes" + ("" if failed["collective"] == "allreduce" else f" ({failed['collective']})")
        return self._rest_failed(f"not run: rank {self.failed_rank}: failed at {at}")

    def _rest_failed(self, why: str) -> list[dict[str, Any]]:
        done = {_key(r) for r in self.results}
        return self.results + [_size_result(c, n, "failed", why) for c, n in self.items if (c, n) not in done]


def _key(result: AllReduce | dict[str, Any]) -> tuple[str, int]:
    """(collective, size): what orders a job's results."""
    if isinstance(result, AllReduce):
        return result.collective, result.nbytes
    return result["collective"], result["nbytes"]


def _size_result(collective: str, nbytes: int, status: str, reason: str,
                 timing: dict[str, Any] | None = None) -> dict[str, Any]:
    """One size's result, as an `AllReduce` event has it (the launcher adds "skipped")."""
    return {"nbytes": nbytes, "status": status, "reason": reason, "timing": timing, "collective": collective}
