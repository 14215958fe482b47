"""Launchers: worker processes for each (backend, device count, launcher) group.

`subprocess`: one worker process drives all of a group's devices. `spmd`: one worker process
per device, started together as a gang with torchrun-style variables (see xbench.run.cluster).

A worker runs its group's trials in turn: the launcher sends it a `Job` and reads its events
(both typed in `xbench.wire`). It waits on the worker's event stream (a blocking read in a
thread, so no CPU is spent while trials are timed), each wait with a `Deadline`
(`xbench.run.bounds`), and turns every outcome into a record: a crash, a timeout (with the
phase the worker was in) or an event it cannot read costs only the trial in flight; the rest
of the group continues in a fresh worker. One process is `xbench.run.worker_process.Worker`;
the jobs that are not trials (a device description, the all-reduce) are `xbench.run.probes`.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from xbench.contract import Process, Trial
from xbench.errors import XbenchError, one_line
from xbench.results.fit import fit_or_not
from xbench.results.records import ProcessFacts, Record
from xbench.results.schema import LOG_FILE
from xbench.run.bounds import EXIT_GRACE_S, STARTUP_OPTION, TRIAL_OPTION, Deadline
from xbench.run.cluster import Launch, job_ports
from xbench.run.plan import Group
from xbench.run.worker_process import PER_WORKER, Arrival, Worker, worker_environment
from xbench.run.zygote import ForkedProcess, ForkServers
from xbench.wire import Done, Job, Ready, Result, SetupFailed, Start, Unavailable, Window, WireError
from xbench.wire import utc_now as _now

STARTUP_TIMEOUT_S = 300.0  # importing a framework and finding devices


class Listener(Protocol):
    """Progress callbacks; the CLI draws a progress bar from them."""

    def trial_started(self, trial: Trial) -> None: ...
    def window_done(self, trial: Trial, done: int) -> None: ...
    def trial_finished(self, trial: Trial, record: Record) -> None: ...


class _Silent:
    def trial_started(self, trial: Trial) -> None: ...
    def window_done(self, trial: Trial, done: int) -> None: ...
    def trial_finished(self, trial: Trial, record: Record) -> None: ...


@dataclass
class Context:
    """What every record of a run shares, and where worker output goes."""

    run_id: str
    run_dir: Path
    environment: dict[str, Any]
    write: Callable[[Record], None]
    listener: Listener = field(default_factory=_Silent)
    startup_timeout_s: float = STARTUP_TIMEOUT_S
    arrays_dir: Path | None = None  # set: capture verification arrays here (Job mode "verify"), not timings
    shard_counts: tuple[int, ...] = ()  # verify: the device counts whose slices 1-device runs report
    annotate: Callable[[Trial], dict[str, Any]] = lambda trial: {}  # extra record fields
    launch: Launch = field(default_factory=Launch)  # spmd node geometry
    env: dict[str, str] = field(default_factory=dict)  # extra environment of every worker
    cancel: threading.Event = field(default_factory=threading.Event)  # set: start no more workers
    fork_servers: ForkServers | None = None  # set: workers forked from a pre-imported server (xbench.run.zygote)
    spread_gpus: tuple[str, ...] = ()  # set (work not timed only): each job's GPUs start at its own one of these


def run_groups(groups: list[Group], ctx: Context, parallel: int = 1) -> list[Record]:
    """Run every group, up to `parallel` at once (only for work that is not timed); return
    all records (each also written through `ctx.write`), in the groups' order."""
    if parallel <= 1 or len(groups) <= 1:
        return [record for group in groups for record in run_group(group, ctx)]
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=min(parallel, len(groups)))
    futures = [pool.submit(run_group, group, ctx) for group in groups]
    try:
        records = [record for future in futures for record in future.result()]
    except BaseException:  # Ctrl-C: no new gang starts, every running one stops
        ctx.cancel.set()  # before any gang stops: the deaths it causes are then no crashes (`stopping`)
        pool.shutdown(wait=False, cancel_futures=True)
        with _LIVE_LOCK:
            live = list(_LIVE)
        for gang in live:
            gang.stop()
        raise
    pool.shutdown()
    return records


def start_fork_servers(groups: list[Group], ctx: Context) -> None:
    """Start the fork servers of the groups' backends now, from this thread, when `run_groups`
    will run them side by side from threads of its own, which start none (`ForkServers.fork`):
    else every worker would import its framework from scratch."""
    if ctx.fork_servers is not None:
        ctx.fork_servers.start([group.target for group in groups], {**worker_environment(), **ctx.env}, PER_WORKER)


def run_group(group: Group, ctx: Context) -> list[Record]:
    records: list[Record] = []
    pending = list(group.trials)
    startup_missed = False  # the last gang did not start in time: the next one that does not ends the group
    while pending and not ctx.cancel.is_set():
        # Nodes of a multi-node job derive its ports from this number, so it must not depend
        # on anything but the plan: the first pending trial's place in it.
        gang = start_gang(group, pending, ctx, job_index=group.positions[len(group.trials) - len(pending)])
        if ctx.cancel.is_set():  # interrupted while it started: the interrupt may have missed it
            gang.stop()
            break
        try:
            finished = gang.drive(pending, ctx, give_up_on_startup=startup_missed)
            if gang.done_with(pending, finished) and not ctx.cancel.is_set():
                gang.let_exit()
        finally:
            gang.stop()
        startup_missed = gang.startup_missed
        records.extend(finished)
        pending = pending[len(finished):]
    return records


def start_gang(group: Group, trials: list[Trial], ctx: Context, job_index: int = 0) -> Gang:
    """The processes for a group's `trials`: one worker, or one per local rank (spmd)."""
    job = Job(group.target, group.devices, trials[0].platform, mode="time" if ctx.arrays_dir is None else "verify",
              trials=tuple(trials), arrays_dir=ctx.arrays_dir,
              shard_counts=ctx.shard_counts if ctx.arrays_dir is not None else ())
    untimed = ctx.arrays_dir is not None  # a timed job's devices are the first GPUs, as the user's are
    # A verification worker runs trials of several replicate numbers (`verification_groups`).
    label = f"{group.backend} on {group.devices} device(s), " + (
        f"{len(trials)} verification run(s)" if untimed else f"replicate {trials[0].replicate}")
    shared = {**ctx.env, **spread_environment(ctx.spread_gpus if untimed else (), job_index)}
    if group.launcher != "spmd":
        return Gang.start([(job, shared)], ctx.run_dir / LOG_FILE, label, ctx.fork_servers)
    jobs = [(rank_job, {**shared, **env}) for rank_job, env in spmd_jobs(job, group.devices, ctx.launch, job_index)]
    return Gang.start(jobs, ctx.run_dir / LOG_FILE, f"{label}, spmd", ctx.fork_servers)


VISIBLE_GPUS = "CUDA_VISIBLE_DEVICES"


def spread_environment(gpus: tuple[str, ...], job_index: int) -> dict[str, str]:
    """The GPUs a job sees, in an order that starts at its own one of `gpus` (job by job in
    turn): jobs that run side by side (verification) put their first device, where a job
    of one device runs, on different GPUs instead of all on the first. Nothing without `gpus`."""
    if not gpus:
        return {}
    start = job_index % len(gpus)
    return {VISIBLE_GPUS: ",".join(gpus[start:] + gpus[:start])}


def spmd_jobs(job: Job, world: int, launch: Launch, job_index: int) -> list[tuple[Job, dict[str, str]]]:
    """One job per rank on this node, with the torchrun-style variables in its environment."""
    local = launch.local_ranks(world)
    coordinator, hosts = job_ports(launch, job_index, world)
    host, port = coordinator.rsplit(":", 1)
    jobs = []
    for local_rank in range(local):
        process = Process(rank=launch.node_rank * local + local_rank, world_size=world, local_rank=local_rank,
                          local_world_size=local, node_rank=launch.node_rank, nnodes=launch.nnodes,
                          coordinator=coordinator, hosts=hosts)
        env = {"RANK": str(process.rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
               "LOCAL_WORLD_SIZE": str(local), "GROUP_RANK": str(launch.node_rank), "MASTER_ADDR": host,
               "MASTER_PORT": port}
        jobs.append((dataclasses.replace(job, process=process), env))
    return jobs


_LIVE: set[Gang] = set()  # gangs started and not yet stopped (several at once only when not timing)
_LIVE_LOCK = threading.Lock()
_LOG_NUMBERS = itertools.count()  # each gang member writes a log file of its own


class Gang:
    """The worker processes of one job, started together and stopped together: one process
    (subprocess launcher) or one per local rank (spmd). Member 0 speaks for the job; every
    member must report each trial, and the first one to fail fails the trial. Members of an
    spmd job write their output to a file each (so a crash is explained by that rank's own
    last words), appended to the run's log when the gang stops."""

    def __init__(self, workers: list[Worker], events: queue.Queue[tuple[int, Arrival]], log_path: Path,
                 logs: list[tuple[Path, int]], ranks: list[int | None], asked: float) -> None:
        self.workers = workers
        self.events = events
        self.log_path = log_path
        self.logs = logs  # each member's log file and where its output starts
        self.ranks = ranks
        self.backlog: collections.deque[tuple[int, Arrival]] = collections.deque()  # read early, not yet handled
        self.finished: set[int] = set()  # members that said "done": their exit is expected
        self.ahead: list[tuple[int, Arrival]] = []  # a fast member's events for a later trial
        self.exited: set[int] = set()  # members that exited without "done" after reporting a trial
        self.stopped = False
        self.startup_missed = False  # set: some member sent nothing within the start-up timeout
        self.asked = asked  # when its processes were asked for (time.monotonic)
        self.process: ProcessFacts | None = None  # once every member is ready

    @classmethod
    def start(cls, jobs: list[tuple[Job, dict[str, str]]], log_path: Path, label: str,
              servers: ForkServers | None = None) -> Gang:
        events: queue.Queue[tuple[int, Arrival]] = queue.Queue()
        ranks = [job.process.rank if job.process is not None else None for job, _ in jobs]
        # Each member writes a file of its own (gangs may run side by side), appended to the
        # run's log when the gang stops, so a crash is explained by that member's own output.
        number = next(_LOG_NUMBERS)
        paths = [log_path.with_name(f"{log_path.name}.{os.getpid()}-{number}-{i}") for i in range(len(jobs))]
        workers, logs = [], []
        asked = time.monotonic()
        try:
            for index, ((job, env), path) in enumerate(zip(jobs, paths)):
                with open(path, "ab") as log:
                    logs.append((path, log.seek(0, os.SEEK_END)))
                    workers.append(Worker.start(index, job, env, log, events, servers))
        except BaseException:
            for worker in workers:
                worker.stop()
            raise
        pids = ", ".join(str(w.process.pid) for w in workers)
        forked = ", forked from a fork server" if any(isinstance(w.process, ForkedProcess) for w in workers) else ""
        append_log(log_path, f"=== {label}, worker pid(s) {pids}{forked}, {_now()}\n".encode())
        gang = cls(workers, events, log_path, logs, ranks, asked)
        with _LIVE_LOCK:
            _LIVE.add(gang)
        return gang

    @property
    def spmd(self) -> bool:
        return self.ranks[0] is not None

    def next_event(self, deadline: Deadline) -> tuple[int, Arrival] | None:
        """(member, what it sent) (see `Arrival`); None past the deadline."""
        if self.backlog:
            return self.backlog.popleft()
        try:
            return self.events.get(timeout=deadline.left())
        except queue.Empty:
            return None

    def drive(self, trials: list[Trial], ctx: Context, give_up_on_startup: bool = False) -> list[Record]:
        """Collect records for `trials` in order until they are done, the gang fails or the run stops.

        Returns the records made; a prefix of `trials`. Records for a failed setup cover all
        trials, so the caller never restarts a gang that cannot start. A start-up that timed
        out costs the first trial only (a stopped or stuck process is no property of the
        backend), unless `give_up_on_startup` (the gang before it timed out too).
        """
        ready = self._await_ready(ctx.startup_timeout_s)
        if "device_info" not in ready and stopping(ctx):
            return []  # its workers were ended by the interrupt: not a failure of the backend
        if "device_info" not in ready:
            if ready.get("timed_out") and ctx.launch.multi_node:
                for trial in trials:
                    self._unstarted_record(trial, {**ready, "status": "failed"}, ctx)
                # Every later job would wait as long for the same absent node: stop the run.
                raise XbenchError(f"no worker of this node ({ctx.launch.node_rank} of {ctx.launch.nnodes}) started "
                                  f"within {ctx.startup_timeout_s:g} s (--startup-timeout): another node is missing "
                                  "or failed; run the same xbench command on every node, then --resume")
            lost = trials[:1] if ready.get("timed_out") and not give_up_on_startup else trials
            return [self._unstarted_record(t, ready, ctx) for t in lost]
        done: list[Record] = []
        for trial in trials:
            record = self._trial_record(trial, ready["device_info"], ctx)
            if record["status"] != "ok" and stopping(ctx):
                break  # unfinished, not crashed (see `stopping`): unrecorded, so a resumed run redoes it
            # A failed rank may leave the others inside a collective: start afresh, as after
            # anything that stopped the gang (a timeout, an event it could not read). The one
            # rank of a 1-device job has no others (an spmd job's devices are its ranks, on
            # every node): it goes on, as a subprocess worker does.
            status = record["status"]
            collective = self.spmd and trial.devices > 1
            ended = status in ("timeout", "crashed") or self.stopped or (collective and status != "ok")
            if ctx.arrays_dir is None:
                fitted = fit_or_not(record)
                if done and fitted is not record and not ctx.launch.multi_node:
                    # Out of memory after other trials in this process: what they left in its
                    # allocator's pool (kept after it is freed, in pieces) is no measure of
                    # whether this one fits. Unrecorded: the group goes on in a fresh process
                    # with it first, where an out-of-memory error is the trial's own. Not across
                    # nodes: the other node's ranks record the trial and go on to the next.
                    append_log(self.log_path, f"=== {trial.id}: out of memory after {len(done)} trial(s) in this "
                                              "process; run again in a fresh one\n".encode())
                    break
                record = fitted
            if self.process is not None:
                record["process"] = self.process
            done.append(record)
            ctx.write(record)
            ctx.listener.trial_finished(trial, record)
            if ended:
                break
        return done

    def _await_ready(self, timeout_s: float) -> dict[str, Any]:
        """{"device_info": member 0's} once every member is ready, else what went wrong."""
        deadline, waiting = Deadline(timeout_s, "start-up", STARTUP_OPTION), set(range(len(self.workers)))
        infos: dict[int, dict[str, Any]] = {}
        early = []  # a ready member's later events, while others still start
        while waiting:
            item = self.next_event(deadline)
            if item is None:
                self.stop()
                self.startup_missed = True
                late = f" (rank {', '.join(str(self.ranks[i]) for i in sorted(waiting))})" if self.spmd else ""
                return {"status": "timeout", "timed_out": True,
                        "reason": f"{deadline.missed()}{late}: the worker sent nothing; it was ended"}
            index, event = item
            if index not in waiting:
                early.append(item)
                continue
            if event is None:
                return {"status": "failed", "reason": f"worker failed to start: {self._exit_reason(index)}"}
            if isinstance(event, WireError):
                return {"status": "failed", "reason": self._who(index) + unreadable(event)}
            if isinstance(event, Unavailable):
                return {"status": "skipped", "reason": self._who(index) + event.reason}
            if isinstance(event, SetupFailed):
                return {"status": "failed", "reason": f"backend setup failed: {self._who(index)}{event.reason}"}
            if isinstance(event, Ready):
                waiting.discard(index)
                infos[index] = event.device_info
        self.backlog.extend(early)
        self.process = {"pid": self.workers[0].process.pid, "start_s": round(time.monotonic() - self.asked, 3),
                        "forked": isinstance(self.workers[0].process, ForkedProcess)}
        # Member 0 speaks for the job; each rank names only its own device.
        names = [name for i in sorted(infos) for name in infos[i]["device_names"]]
        return {"device_info": {**infos[0], "device_names": names}}

    def _trial_record(self, trial: Trial, devices: dict[str, Any], ctx: Context) -> Record:
        started = _now()
        ctx.listener.trial_started(trial)
        self.backlog.extendleft(reversed(self.ahead))
        self.ahead = []
        if self.exited:
            index = min(self.exited)
            return _record(trial, ctx, "crashed", self._who(index) + self._exit_reason(index), devices, started)
        # Before its start a worker may still be collecting the last trial's garbage: the
        # start-up timeout on top of the trial's own.
        deadline = Deadline(ctx.startup_timeout_s + trial.protocol.trial_timeout_s, "the wait for the trial to start",
                            f"{STARTUP_OPTION} plus {TRIAL_OPTION}")
        results: dict[int, Result] = {}
        while True:
            item = self.next_event(deadline)
            if item is None:
                self.stop()
                return _record(trial, ctx, "timeout", deadline.missed(), devices, started)
            index, event = item
            if event is None and index in self.finished:
                continue  # said "done" after its last trial, then exited
            if event is None and index in results:
                self.exited.add(index)  # reported this trial, then died: the next trial fails at once
                continue
            if event is None:
                return _record(trial, ctx, "crashed", self._who(index) + self._exit_reason(index), devices, started)
            if isinstance(event, WireError):
                self.stop()  # what else it says cannot be trusted either
                return _record(trial, ctx, "failed", self._who(index) + unreadable(event), devices, started)
            if isinstance(event, (Start, Window, Result)) and event.trial != trial.id:
                self.ahead.append(item)  # this member already works on a later trial
                continue
            if isinstance(event, Done):
                self.finished.add(index)
            elif isinstance(event, Start) and index == 0:
                deadline = Deadline(trial.protocol.trial_timeout_s, _phase(trial, 0, ctx), TRIAL_OPTION)
            elif isinstance(event, Window) and index == 0:
                deadline.phase = _phase(trial, event.done, ctx)
                ctx.listener.window_done(trial, event.done)
            elif isinstance(event, Result):
                if event.status != "ok" and self.spmd:
                    return _record(trial, ctx, event.status, self._who(index) + str(event.reason), devices, started)
                results[index] = event
                if len(results) == len(self.workers):
                    first = results[0]
                    return _record(trial, ctx, first.status, first.reason, devices, started, first.measured())

    def _who(self, index: int) -> str:
        return f"rank {self.ranks[index]}: " if self.spmd else ""

    def _unstarted_record(self, trial: Trial, ready: dict[str, Any], ctx: Context) -> Record:
        record = _record(trial, ctx, ready["status"], ready["reason"], None, _now())
        ctx.write(record)
        ctx.listener.trial_finished(trial, record)
        return record

    def _exit_reason(self, index: int) -> str:
        code = self.workers[index].exit_code()
        if code is None:
            how = "exit status unknown (it was ended, or its fork server stopped answering)"
        else:
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"worker {how}; last output: {self._last_log_line(index)}"

    def _last_log_line(self, index: int) -> str:
        path, offset = self.logs[index]
        try:
            with open(path, "rb") as log:
                log.seek(offset)
                lines = log.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        meaningful = [line.strip() for line in lines if line.strip() and not line.startswith("=== ")]
        return one_line(meaningful[-1], 300) if meaningful else "(none)"

    def done_with(self, trials: list[Trial], records: list[Record]) -> bool:
        """Whether every member ran all of `trials` well, so ends its job (none waits in a collective)."""
        return len(records) == len(trials) and not (self.stopped or self.exited) and all(
            r["status"] == "ok" for r in records)

    def let_exit(self, grace_s: float = EXIT_GRACE_S) -> None:
        """Members that finished their job exit on their own: their exit handlers remove their
        temporary files (TensorFlow's generated code, a private compile cache). Waited for about
        `grace_s` (a forked worker also for its server's report); `stop` ends the rest."""
        ends = time.monotonic() + grace_s
        for worker in self.workers:
            worker.await_exit(ends - time.monotonic())

    def stop(self) -> None:
        """End every member and anything they started: all killed first, then reaped, so an
        interruption while waiting cannot leave a later rank alive. Member logs go into the
        run's log."""
        for worker in self.workers:
            worker.kill()
        for worker in self.workers:
            worker.stop()
        if not self.stopped:
            self._collect_logs()
        self.stopped = True
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def _collect_logs(self) -> None:
        for rank, (path, _) in zip(self.ranks, self.logs):
            try:
                text = path.read_bytes()
            except OSError:
                continue
            append_log(self.log_path, (f"--- rank {rank}\n".encode() if self.spmd else b"") + text)
            path.unlink(missing_ok=True)


def append_log(path: Path, data: bytes) -> None:
    """Add to the run's log. The log explains failures but is not a result: a full disk costs
    its lines, never the run (the records' own writer reports what is lost)."""
    try:
        with open(path, "ab") as log:
            log.write(data)
    except OSError:
        pass


def stopping(ctx: Context) -> bool:
    """Whether the run is being stopped (Ctrl-C: `run_groups` ends every live gang). A trial in flight
    is then unfinished, not crashed or failed: xbench ended its worker (or a rank of its collective)."""
    return ctx.cancel.is_set()


def _phase(trial: Trial, windows_done: int, ctx: Context) -> str:
    """What a worker does after `windows_done` timed windows of `trial` (a timeout names it)."""
    if ctx.arrays_dir is not None:
        return "the verification run"
    if windows_done == 0:
        return "preparation and warm-up (compilation), before window 1"
    repeats = trial.protocol.repeats
    return f"window {windows_done + 1} of {repeats}" if windows_done < repeats else "the trial's end (telemetry)"


def unreadable(err: WireError) -> str:
    return f"worker sent an event xbench cannot read: {err}"


def skipped_record(trial: Trial, ctx: Context, reason: str) -> Record:
    """The record of a trial that was not run, and why."""
    return _record(trial, ctx, "skipped", reason, None, _now())


def _record(trial: Trial, ctx: Context, status: str, reason: str | None, devices: dict | None,
            started: str, extra: Mapping[str, Any] | None = None) -> Record:
    # A Record as the schema in xbench.results.records declares it; its parts come from the
    # trial, the worker's events and `annotate`, which are typed where they are made.
    return cast(Record, {
        "run_id": ctx.run_id,
        "trial_id": trial.id,
        "status": status,
        "reason": reason,
        "trial": trial.to_dict(),
        "devices": devices,
        "environment": ctx.environment,
        "started_at": started,
        "finished_at": _now(),
        **ctx.annotate(trial),
        **(extra or {}),
    })
