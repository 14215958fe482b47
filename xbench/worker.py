"""The worker process: one backend, one device count, one framework imported.

Started by `xbench.launcher` as `python -m xbench.worker`; reads one JSON job on stdin and
writes JSON events, one per line, on its original stdout. Everything else the process or its
framework prints goes to stderr, so framework noise can never corrupt the event stream.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import traceback
from dataclasses import asdict
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from xbench.contract import Backend, DeviceInfo, DeviceUnavailable, Process, Trial, Unsupported, families_of
from xbench.allreduce import window_protocol
from xbench.measure import measure, observe, telemetry_steps
from xbench.records import utc_now as _now
from xbench.telemetry import host_state, open_sampler, open_window_watch
from xbench.registry import load_target
from xbench.verify import reference_run, save_reference
from xbench.work import Work, build_work


def main() -> int:
    _die_with_parent()
    events = _claim_stdout()
    job = json.loads(sys.stdin.read())
    emit = _emitter(events)
    backend = load_target(job["target"])
    process = Process(**{**job["process"], "hosts": tuple(job["process"]["hosts"])}) if job.get("process") else None
    try:
        info = _setup(backend, job, process)
    except DeviceUnavailable as err:
        emit("unavailable", reason=str(err))
        return 0
    except Exception as err:
        emit("setup_failed", reason=_one_line(err))
        traceback.print_exc()
        return 1
    emit("ready", device_info=asdict(info))
    ranks = Ranks(backend, process)
    if job.get("mode") == "allreduce":
        for nbytes in job["sizes"]:
            status = run_allreduce(backend, nbytes, job.get("options", {}), emit, ranks)
            if status != "ok" and ranks.gather is not None:
                break  # the other ranks' collectives would no longer match this one's
        emit("done")
        return 0
    works: dict[tuple, Work] = {}
    if job.get("mode") == "verify":
        action = _verification(Path(job["arrays_dir"]), save=process is None or process.local_rank == 0)
    else:
        action = _timing(info, ranks)
    for raw in job.get("trials", []):
        run_trial(backend, Trial.from_dict(raw), works, emit, action)
    emit("done")
    return 0


def _setup(backend: Backend, job: dict[str, Any], process: Process | None) -> DeviceInfo:
    if process is None:
        return backend.setup(job["devices"], job["platform"])
    missing = [m for m in ("setup_process", "all_gather") if not callable(getattr(backend, m, None))]
    if missing:
        raise DeviceUnavailable(f"backend {backend.name!r} cannot run one process per device: it lacks "
                                f"{', '.join(missing)}; use --launcher subprocess")
    return backend.setup_process(process, job["platform"])


class Ranks:
    """The other processes of an spmd job, as far as timing needs them: agreeing on step
    counts (a rank running more steps than the others would wait forever in a collective)
    and gathering every rank's window times. Without an spmd job, both are identities."""

    def __init__(self, backend: Backend, process: Process | None) -> None:
        self.process = process
        self.gather = backend.all_gather if process is not None and process.world_size > 1 else None

    @property
    def samples_telemetry(self) -> bool:
        """One process per node samples the node's GPUs."""
        return self.process is None or self.process.local_rank == 0

    @property
    def node_share(self) -> float:
        """The part of each global batch this node's GPUs (which one process samples) process."""
        return 1.0 if self.process is None else self.process.local_world_size / self.process.world_size

    def gpu_indices(self, trial: Trial) -> range:
        return range(trial.devices) if self.process is None else range(self.process.local_world_size)

    def gpu_indices_for(self, info: DeviceInfo) -> range:
        """This node's GPUs of the job, known at setup (NVML numbers GPUs as CUDA does unless
        CUDA_VISIBLE_DEVICES reorders them)."""
        return range(len(info.device_names)) if self.process is None else range(self.process.local_world_size)

    def agree(self, steps: int) -> int:
        """The largest of every rank's proposed step count."""
        if self.gather is None:
            return steps
        return int(max(values[0] for values in self.gather([float(steps)])))

    def any_stop(self, stop: bool) -> bool:
        """Stop the timed windows when any rank would (every rank must run the same windows)."""
        if self.gather is None:
            return stop
        return max(values[0] for values in self.gather([float(stop)])) > 0

    def timing(self, result: Any) -> dict[str, Any]:
        """Timing fields; in an spmd job each window is the slowest rank's, and every rank's
        own times are kept under "ranks"."""
        fields = _timing_fields(result)
        if self.gather is None:
            return fields
        gathered = self.gather([result.first_call_s, *result.window_s])
        fields["ranks"] = [{"rank": r, "first_call_s": v[0], "window_s": list(v[1:])} for r, v in enumerate(gathered)]
        fields["first_call_s"] = max(v[0] for v in gathered)
        fields["window_s"] = [max(column) for column in zip(*(v[1:] for v in gathered))]
        return fields

    def peaks(self, memory: dict[str, Any] | None) -> dict[str, Any] | None:
        """Every rank's framework memory peak (each process reports its own device)."""
        if self.gather is None:
            return memory
        mine = float(max(memory["peak_bytes"])) if memory else -1.0
        values = [v[0] for v in self.gather([mine])]
        if min(values) < 0:
            return None
        return {"peak_bytes": [int(v) for v in values], "scope": memory["scope"]}


Action = Callable[[Backend, Any, Trial, Work, Callable[..., None]], dict[str, Any]]


def run_trial(backend: Backend, trial: Trial, works: dict[tuple, Work], emit, action: Action) -> None:
    """Prepare one trial and apply `action` to it; any exception becomes a failed result."""
    emit("start", trial=trial.id, at=_now())
    try:
        if trial.model.family not in families_of(backend):
            raise Unsupported(f"backend {backend.name!r} builds no {trial.model.family!r} models "
                              f"(it builds: {', '.join(families_of(backend))})")
        key = (trial.model, trial.samples, trial.seed)
        if key not in works:
            works[key] = build_work(trial.model, trial.samples, trial.seed)
        work = works[key]
        prepared = backend.prepare(trial, work)
        fields = action(backend, prepared, trial, work, emit)
    except Unsupported as err:
        emit("result", trial=trial.id, status="unsupported", reason=str(err), at=_now())
        return
    except Exception as err:
        traceback.print_exc()
        emit("result", trial=trial.id, status="failed", reason=_one_line(err), at=_now())
        return
    emit("result", trial=trial.id, status="ok", at=_now(),
         work={"params": work.params, "weights_hash": work.weights_hash, "data_hash": work.data_hash},
         backend=asdict(prepared.info), **fields)


def _timing(info: DeviceInfo, ranks: Ranks) -> Action:
    watch = _window_watch(info, ranks)

    def time_trial(backend: Backend, prepared: Any, trial: Trial, work: Work, emit) -> dict[str, Any]:
        host_before = host_state()
        result = measure(backend, prepared, trial.protocol,
                         on_window=lambda done: emit("window", trial=trial.id, done=done), agree=ranks.agree,
                         watch=watch.watching if not isinstance(watch, str) else contextlib.nullcontext,
                         all_stop=ranks.any_stop)
        timing = ranks.timing(result)
        telemetry = _telemetry(backend, prepared, trial, info, ranks, watch, timing)
        replicate = {"index": trial.replicate, "host_before": host_before, "host_after": host_state(),
                     "settings": dict(prepared.info.settings), "stopped": result.stopped,
                     "throttled": bool(telemetry.get("throttled")),
                     "throttle_reasons": list(telemetry.get("throttle_reasons") or [])}
        return {"timing": timing, "telemetry": telemetry, "replicate": replicate}
    return time_trial


def _window_watch(info: DeviceInfo, ranks: Ranks) -> Any:
    """NVML reads around each trial's timed windows, or why there are none; one process per
    node watches the node's GPUs."""
    if info.platform != "gpu":
        return "no GPU in use"
    if not ranks.samples_telemetry:
        return "sampled by local rank 0"
    return open_window_watch(ranks.gpu_indices_for(info))


def _telemetry(backend: Backend, prepared: Any, trial: Trial, info: DeviceInfo, ranks: Ranks, watch: Any,
               timing: dict[str, Any]) -> dict[str, Any]:
    """GPU telemetry over the timed windows (the driver's own samples, read afterwards), and
    the framework's peak memory. Only where the driver had no utilisation sample for them
    (windows shorter than its sampling period) does the first replicate run a short untimed
    stretch of training under a polling sampler, as every rank of an spmd job must."""
    windows_samples = len(timing["window_s"]) * timing["steps_per_window"]
    if isinstance(watch, str):
        telemetry: dict[str, Any] = {"available": False, "reason": watch}
    else:
        telemetry = watch.summary(windows_samples * trial.global_batch * ranks.node_share)
    if _needs_tail(telemetry, trial, info, ranks):
        telemetry["after_windows"] = _tail(backend, prepared, trial, ranks, telemetry_steps(timing, trial.protocol))
    peak = getattr(backend, "memory_peak_bytes", None)
    telemetry["framework_memory"] = ranks.peaks(peak(prepared) if callable(peak) else None)
    return telemetry


def _needs_tail(telemetry: dict[str, Any], trial: Trial, info: DeviceInfo, ranks: Ranks) -> bool:
    """Every rank of an spmd job takes part in the decision (the tail trains, so all must run
    it); only the processes that watch GPUs have a say."""
    if info.platform != "gpu" or trial.replicate != 0:
        return False
    no_samples = ranks.samples_telemetry and not any(d.get("util_samples") for d in telemetry.get("devices") or [])
    return ranks.any_stop(no_samples)


def _tail(backend: Backend, prepared: Any, trial: Trial, ranks: Ranks, steps: int) -> dict[str, Any]:
    sampler: Any = open_sampler(ranks.gpu_indices(trial)) if ranks.samples_telemetry else "sampled by local rank 0"
    watch = sampler.sampling if not isinstance(sampler, str) else contextlib.nullcontext
    try:
        observe(backend, prepared, steps, watch)
        return ({"available": False, "reason": sampler} if isinstance(sampler, str)
                else sampler.summary(steps * trial.global_batch * ranks.node_share))
    finally:
        if not isinstance(sampler, str):
            sampler.close()


def _timing_fields(result: Any) -> dict[str, Any]:
    return {"first_call_s": result.first_call_s, "window_s": list(result.window_s),
            "steps_per_window": result.steps_per_window, "stopped": result.stopped}


def _verification(arrays_dir: Path, save: bool) -> Action:
    """Reference arrays for verify; in an spmd job every rank computes them (collectives),
    one per node saves them."""
    def capture(backend: Backend, prepared: Any, trial: Trial, work: Work, emit) -> dict[str, Any]:
        path = arrays_dir / f"{trial.id.replace('/', '_')}.npz"
        reference = reference_run(backend, prepared, trial.protocol.steps)
        if save:
            save_reference(path, reference)
        return {"arrays": str(path)}
    return capture


def run_allreduce(backend: Backend, nbytes: int, options: dict[str, Any], emit, ranks: Ranks) -> str:
    """Time the backend's all-reduce of an `nbytes` float32 buffer per device; returns the
    status it reported."""
    protocol = window_protocol(nbytes)
    try:
        if not callable(getattr(backend, "allreduce_prepare", None)):
            raise Unsupported(f"backend {backend.name!r} has no allreduce_prepare/allreduce_run")
        prepared = backend.allreduce_prepare(nbytes, options)
        # Every rank runs the same windows: a rank that stopped early on its own would leave
        # the others waiting in an all-reduce until the framework's timeout.
        result = measure(_AllReduceSteps(backend), prepared, protocol, agree=ranks.agree,
                         all_stop=ranks.any_stop)
        timing = ranks.timing(result)
    except Unsupported as err:
        emit("allreduce", nbytes=nbytes, status="unsupported", reason=str(err))
        return "unsupported"
    except Exception as err:
        traceback.print_exc()
        emit("allreduce", nbytes=nbytes, status="failed", reason=_one_line(err))
        return "failed"
    emit("allreduce", nbytes=nbytes, status="ok", timing=timing)
    return "ok"


class _AllReduceSteps:
    """Presents all-reduce operations as the steps `measure` times."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def run(self, prepared: Any, steps: int) -> None:
        self.backend.allreduce_run(prepared, steps)


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when the xbench process that started it dies, however it
    dies (SIGKILL included): workers lead their own process groups, so a signal to xbench's
    group never reaches them. (Linux ties this to the thread that started the worker; xbench
    starts the workers that outlive a call from its main thread.)"""
    parent = os.environ.get("XBENCH_PARENT_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(parent):  # it died before the request took effect
        os._exit(1)


def _claim_stdout() -> IO[str]:
    """Keep the real stdout for events and point fd 1 at stderr for everything else."""
    sys.stdout.flush()
    events = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    return events


def _emitter(stream: IO[str]):
    def emit(event: str, **fields: Any) -> None:
        stream.write(json.dumps({"event": event, **fields}) + "\n")
        stream.flush()
    return emit


def _one_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return " ".join(text.split())[:500]


if __name__ == "__main__":
    sys.exit(main())
