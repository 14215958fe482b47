"""The subprocess launcher: one worker process per (backend, device count) group.

A worker runs its group's trials in turn. The launcher waits on the worker's event stream
(a blocking read in a thread, so no CPU is spent while trials are timed), enforces each
trial's timeout, and turns every outcome into a record: a crash or timeout costs only the
trial in flight; the rest of the group continues in a fresh worker.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from xbench.contract import Trial
from xbench.plan import Group
from xbench.records import utc_now as _now

STARTUP_TIMEOUT_S = 300.0  # importing a framework and finding devices
LOG_FILE = "workers.log"


class Listener(Protocol):
    """Progress callbacks; the CLI draws a progress bar from them."""

    def trial_started(self, trial: Trial) -> None: ...
    def window_done(self, trial: Trial, done: int) -> None: ...
    def trial_finished(self, trial: Trial, record: Mapping[str, Any]) -> None: ...


class _Silent:
    def trial_started(self, trial: Trial) -> None: ...
    def window_done(self, trial: Trial, done: int) -> None: ...
    def trial_finished(self, trial: Trial, record: Mapping[str, Any]) -> None: ...


@dataclass
class Context:
    """What every record of a run shares, and where worker output goes."""

    run_id: str
    run_dir: Path
    environment: dict[str, Any]
    write: Callable[[dict[str, Any]], None]
    listener: Listener = field(default_factory=_Silent)
    startup_timeout_s: float = STARTUP_TIMEOUT_S
    job_extra: dict[str, Any] = field(default_factory=dict)  # e.g. {"mode": "verify", ...}
    annotate: Callable[[Trial], dict[str, Any]] = lambda trial: {}  # extra record fields


def run_groups(groups: list[Group], ctx: Context) -> list[dict[str, Any]]:
    """Run every group; return all records (each also written through `ctx.write`)."""
    records: list[dict[str, Any]] = []
    for group in groups:
        records.extend(run_group(group, ctx))
    return records


def run_group(group: Group, ctx: Context) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    pending = list(group.trials)
    while pending:
        worker = Worker.start(group.target, group.devices, pending[0].platform, pending,
                              ctx.run_dir / LOG_FILE, label=f"{group.backend} on {group.devices} device(s)",
                              extra=ctx.job_extra)
        try:
            finished = worker.drive(pending, ctx)
        finally:
            worker.stop()
        records.extend(finished)
        pending = pending[len(finished):]
    return records


class Worker:
    """One running worker process and the thread that reads its events."""

    def __init__(self, process: subprocess.Popen, log_path: Path, log_offset: int) -> None:
        self.process = process
        self.log_path = log_path
        self.log_offset = log_offset
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    @classmethod
    def start(cls, target: str, devices: int, platform: str, trials: list[Trial], log_path: Path,
              label: str, extra: Mapping[str, Any] | None = None) -> Worker:
        job = {"target": target, "devices": devices, "platform": platform,
               "trials": [t.to_dict() for t in trials], **(extra or {})}
        with open(log_path, "ab") as log:
            offset = log.seek(0, os.SEEK_END)
            process = subprocess.Popen(
                [sys.executable, "-m", "xbench.worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                env=worker_environment(), start_new_session=True,
            )
            log.write(f"=== {label}, worker pid {process.pid}, {_now()}\n".encode())
        process.stdin.write(json.dumps(job).encode())
        process.stdin.close()
        return cls(process, log_path, offset)

    def _read(self) -> None:
        with self.process.stdout as stream:
            for line in stream:
                try:
                    self.events.put(json.loads(line))
                except json.JSONDecodeError:
                    continue  # not an event; the worker keeps its event stream clean
        self.events.put(None)

    def next_event(self, deadline: float) -> dict[str, Any] | None | str:
        """The next event, None when the worker has exited, "timeout" past the deadline."""
        try:
            return self.events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return "timeout"

    def drive(self, trials: list[Trial], ctx: Context) -> list[dict[str, Any]]:
        """Collect records for `trials` in order until they are done or the worker fails.

        Returns the records made; a prefix of `trials`. Records for a failed setup cover all
        trials, so the caller never restarts a worker that cannot start.
        """
        first = self.next_event(time.monotonic() + ctx.startup_timeout_s)
        if not isinstance(first, dict) or first.get("event") != "ready":
            return [self._unstarted_record(t, first, ctx) for t in trials]
        devices = first["device_info"]
        records: list[dict[str, Any]] = []
        for trial in trials:
            record = self._trial_record(trial, devices, ctx)
            records.append(record)
            ctx.write(record)
            ctx.listener.trial_finished(trial, record)
            if record["status"] in ("timeout", "crashed"):
                break
        return records

    def _trial_record(self, trial: Trial, devices: dict[str, Any], ctx: Context) -> dict[str, Any]:
        started = _now()
        ctx.listener.trial_started(trial)
        deadline = time.monotonic() + ctx.startup_timeout_s + trial.protocol.trial_timeout_s
        while True:
            event = self.next_event(deadline)
            if event == "timeout":
                self.stop()
                reason = f"timed out after {trial.protocol.trial_timeout_s:g} s (protocol.trial_timeout_s)"
                return _record(trial, ctx, "timeout", reason, devices, started)
            if event is None:
                return _record(trial, ctx, "crashed", self._exit_reason(), devices, started)
            kind = event.get("event")
            if kind == "start":
                deadline = time.monotonic() + trial.protocol.trial_timeout_s
            elif kind == "window":
                ctx.listener.window_done(trial, event["done"])
            elif kind == "result":
                extra = {k: event[k] for k in ("work", "backend", "timing", "arrays", "telemetry") if k in event}
                return _record(trial, ctx, event["status"], event.get("reason"), devices, started, extra)

    def _unstarted_record(self, trial: Trial, event: Any, ctx: Context) -> dict[str, Any]:
        if isinstance(event, dict) and event.get("event") == "unavailable":
            record = _record(trial, ctx, "skipped", event["reason"], None, _now())
        elif isinstance(event, dict) and event.get("event") == "setup_failed":
            record = _record(trial, ctx, "failed", f"backend setup failed: {event['reason']}", None, _now())
        elif event == "timeout":
            self.stop()
            record = _record(trial, ctx, "failed", f"worker did not start within {ctx.startup_timeout_s:g} s",
                             None, _now())
        else:
            record = _record(trial, ctx, "failed", f"worker failed to start: {self._exit_reason()}", None, _now())
        ctx.write(record)
        ctx.listener.trial_finished(trial, record)
        return record

    def _exit_reason(self) -> str:
        code = self.process.wait()
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"worker {how}; last output: {self._last_log_line()}"

    def _last_log_line(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                lines = log.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        meaningful = [line.strip() for line in lines if line.strip() and not line.startswith("=== ")]
        return meaningful[-1][:300] if meaningful else "(none)"

    def stop(self) -> None:
        """End the worker and anything it started (it leads its own process group)."""
        try:  # also when the leader has exited: its children may live on
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        self.reader.join(timeout=10)


def skipped_record(trial: Trial, ctx: Context, reason: str) -> dict[str, Any]:
    """The record of a trial that was not run, and why."""
    return _record(trial, ctx, "skipped", reason, None, _now())


def worker_environment() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep framework chatter out of the log
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _record(trial: Trial, ctx: Context, status: str, reason: str | None, devices: dict | None,
            started: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
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
    }




def describe(target: str, platform: str, log_path: Path,
             timeout_s: float = STARTUP_TIMEOUT_S) -> dict[str, Any]:
    """What a backend's worker sees on one device: {"device_info": ...} or {"reason": ...}."""
    worker = Worker.start(target, 1, platform, [], log_path, label=f"describe {target}")
    try:
        event = worker.next_event(time.monotonic() + timeout_s)
        if isinstance(event, dict) and event.get("event") == "ready":
            return {"device_info": event["device_info"]}
        if isinstance(event, dict) and "reason" in event:
            return {"reason": event["reason"]}
        if event == "timeout":
            return {"reason": f"worker did not start within {timeout_s:g} s"}
        return {"reason": f"worker failed to start: {worker._exit_reason()}"}
    finally:
        worker.stop()


def allreduce_events(target: str, devices: int, platform: str, sizes: list[int], options: dict[str, Any],
                     log_path: Path, timeout_s: float) -> list[dict[str, Any]]:
    """Run the all-reduce microbenchmark in one worker; one event per size (status ok, failed,
    or why the worker could not run it)."""
    worker = Worker.start(target, devices, platform, [], log_path, label=f"all-reduce {target} on {devices}",
                          extra={"mode": "allreduce", "sizes": sizes, "options": options})
    deadline = time.monotonic() + STARTUP_TIMEOUT_S + timeout_s
    results: list[dict[str, Any]] = []
    try:
        while True:
            event = worker.next_event(deadline)
            if event == "timeout" or event is None:
                why = f"timed out after {timeout_s:g} s" if event == "timeout" else worker._exit_reason()
                done = {r["nbytes"] for r in results}
                return results + [{"nbytes": n, "status": "failed", "reason": why} for n in sizes if n not in done]
            kind = event.get("event")
            if kind in ("unavailable", "setup_failed"):
                return [{"nbytes": n, "status": "skipped" if kind == "unavailable" else "failed",
                         "reason": event["reason"]} for n in sizes]
            if kind == "allreduce":
                results.append(event)
            elif kind == "done":
                return results
    finally:
        worker.stop()
