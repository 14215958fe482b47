"""The worker process: one backend, one device count, one framework imported.

Started by `xbench.run.launcher` as `python -m xbench.worker`; reads one `Job` on stdin and
writes events, one per line, on its original stdout (both typed in `xbench.wire`). Everything
else the process or its framework prints goes to stderr, so framework noise can never corrupt
the event stream.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import IO, Any

from xbench.contract import (
    ALL_REDUCE,
    AllReduceCapable,
    Backend,
    CompilesQuickly,
    DeviceInfo,
    DeviceUnavailable,
    ForgetsTrials,
    GathersAndScatters,
    Process,
    ReportsMemory,
    SpmdCapable,
    Trial,
    Unsupported,
    families_of,
    missing_methods,
)
from xbench.contract.timing import window_protocol
from xbench.contract.work import Work, build_work
from xbench.errors import one_line
from xbench.wire import (
    AllReduce,
    Done,
    Event,
    Job,
    Ready,
    Result,
    SetupFailed,
    Start,
    Unavailable,
    Window,
    WireError,
    save_reference,
)
from xbench.wire import utc_now as _now
from xbench.worker.capture import reference_run, timed
from xbench.worker.measure import measure, observe, telemetry_steps
from xbench.worker.telemetry import host_state, open_sampler, open_window_watch

BACKENDS_GROUP = "xbench.backends"  # the entry-point group backends register under

Emit = Callable[[Event], None]


def main() -> int:
    _die_with_parent()
    emit = _emitter(_claim_stdout())
    try:
        job = Job.from_json(sys.stdin.buffer.read())
    except WireError as err:
        emit(SetupFailed(f"the worker could not read its job: {err}"))
        return 2
    backend = load_target(job.target)
    try:
        info = _setup(backend, job)
    except DeviceUnavailable as err:
        emit(Unavailable(str(err)))
        return 0
    except Exception as err:
        emit(SetupFailed(failure(err)))
        traceback.print_exc()
        return 1
    emit(Ready(asdict(info)))
    ranks = Ranks(backend, job.process)
    if job.mode == "allreduce":
        run_allreduces(backend, job, emit, ranks)
    else:
        run_trials(backend, job.trials, emit, _trial_action(job, info, ranks))
    emit(Done())
    return 0


def _setup(backend: Backend, job: Job) -> DeviceInfo:
    prefer_quick_compilation(backend, job)
    if job.process is None:
        return backend.setup(job.devices, job.platform)
    if not isinstance(backend, SpmdCapable):
        raise DeviceUnavailable(f"backend {backend.name!r} cannot run one process per device: it lacks "
                                f"{', '.join(missing_methods(backend, SpmdCapable))}; use --launcher subprocess")
    return backend.setup_process(job.process, job.platform)


def prefer_quick_compilation(backend: Backend, job: Job) -> None:
    """Verification needs the same arithmetic, not the fastest kernels: its workers may skip
    the kernel search that timing pays for (`CompilesQuickly`). Timed jobs never do."""
    if job.mode == "verify" and isinstance(backend, CompilesQuickly):
        backend.prefer_quick_compilation()


def _trial_action(job: Job, info: DeviceInfo, ranks: Ranks) -> Action:
    """What each trial of a job of mode "time" or "verify" is for."""
    if job.arrays_dir is not None:  # mode "verify" (Job allows arrays_dir there only)
        return _verification(job.arrays_dir, save=job.process is None or job.process.local_rank == 0,
                             shard_counts=job.shard_counts, ranks=ranks)
    return _timing(info, ranks)


class Ranks:
    """The other processes of an spmd job, as far as timing needs them: agreeing on step
    counts (a rank running more steps than the others would wait forever in a collective)
    and gathering every rank's window times. Without an spmd job, both are identities."""

    def __init__(self, backend: Backend, process: Process | None) -> None:
        self.process = process
        several = process is not None and process.world_size > 1
        self.gather = backend.all_gather if several and isinstance(backend, SpmdCapable) else None

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
        """Every rank's framework memory peak (each process reports its own device); the
        trial's own only where every rank's is (a rank's scope is its own counter's)."""
        if self.gather is None:
            return memory
        mine = float(max(memory["peak_bytes"])) if memory else -1.0
        own = 1.0 if memory and memory["scope"] == "trial" else 0.0
        gathered = self.gather([mine, own])
        if memory is None or min(v[0] for v in gathered) < 0:  # every rank gathers, whether it has a peak or not
            return None
        scope = memory["scope"] if all(v[1] == 1.0 for v in gathered) else "worker process"
        return {"peak_bytes": [int(v[0]) for v in gathered], "scope": scope}


# Runs one prepared trial; returns the measurement fields of its `Result`.
Action = Callable[[Backend, Any, Trial, Work, Emit], dict[str, Any]]


def run_trials(backend: Backend, trials: Sequence[Trial], emit: Emit, action: Action) -> None:
    """Each trial in turn, none inheriting another's state: a framework's model state holds
    reference cycles, so a finished trial's arrays outlive it until the cyclic collector runs,
    and while they, or the framework's caches of its compiled programs, live they can slow the
    next trials (the large MLP on 2 simulated CPU devices, timed after three other
    configurations in one process: docs/statistics.md, "Bimodal processes"). So the backend
    forgets the trial (`ForgetsTrials`) and its garbage is collected before the next starts."""
    works: dict[tuple, Work] = {}
    for trial in trials:
        run_trial(backend, trial, works, emit, action)
        forget(backend)
        gc.collect()


def forget(backend: Backend) -> None:
    """The backend's `forget_trial`, if it has one; its failure is logged, and the next trials run."""
    if isinstance(backend, ForgetsTrials):
        try:
            backend.forget_trial()
        except Exception:
            traceback.print_exc()


def run_trial(backend: Backend, trial: Trial, works: dict[tuple, Work], emit: Emit, action: Action) -> None:
    """Prepare one trial and apply `action` to it; any exception becomes a failed result."""
    emit(Start(trial.id, _now()))
    try:
        if trial.model.family not in families_of(backend):
            raise Unsupported(f"backend {backend.name!r} builds no {trial.model.family!r} models "
                              f"(it builds: {', '.join(families_of(backend))})")
        key = (trial.model, trial.samples, trial.seed)
        phases: dict[str, float] = {}
        with timed(phases, "work"):
            if key not in works:
                works[key] = build_work(trial.model, trial.samples, trial.seed)
        work = works[key]
        with timed(phases, "prepare"):
            prepared = backend.prepare(trial, work)
        fields = action(backend, prepared, trial, work, emit)
        if "phases" in fields:  # the action timed its own phases; the work and program come first
            fields["phases"] = {**phases, **fields["phases"]}
    except Unsupported as err:
        emit(Result(trial.id, "unsupported", _now(), reason=str(err)))
        return
    except Exception as err:
        traceback.print_exc()
        emit(Result(trial.id, "failed", _now(), reason=failure(err)))
        return
    emit(Result(trial.id, "ok", _now(),
                work={"params": work.params, "weights_hash": work.weights_hash, "data_hash": work.data_hash},
                backend=asdict(prepared.info), **fields))


def _timing(info: DeviceInfo, ranks: Ranks) -> Action:
    watch = _window_watch(info, ranks)

    def time_trial(backend: Backend, prepared: Any, trial: Trial, work: Work, emit: Emit) -> dict[str, Any]:
        host_before = host_state()
        result = measure(backend, prepared, trial.protocol,
                         on_window=lambda done: emit(Window(trial.id, done)), agree=ranks.agree,
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
    telemetry["framework_memory"] = framework_memory(backend, prepared, ranks)
    return telemetry


def framework_memory(backend: Backend, prepared: Any, ranks: Ranks) -> dict[str, Any] | None:
    """Every rank's framework memory peak (`ReportsMemory`), gathered: every rank must call it."""
    memory = backend.memory_peak_bytes(prepared) if isinstance(backend, ReportsMemory) else None
    return ranks.peaks(memory)


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


def _verification(arrays_dir: Path, save: bool, shard_counts: tuple[int, ...], ranks: Ranks) -> Action:
    """Reference arrays for verify, and every rank's framework memory peak; in an spmd job
    every rank computes them (collectives), one per node saves the arrays."""
    def capture(backend: Backend, prepared: Any, trial: Trial, work: Work, emit: Emit) -> dict[str, Any]:
        path = arrays_dir / f"{trial.id.replace('/', '_')}.npz"
        phases: dict[str, float] = {}
        reference = reference_run(backend, prepared, trial.protocol.steps, trial, shard_counts, phases)
        memory = framework_memory(backend, prepared, ranks)  # before the save, which one rank does
        with timed(phases, "save"):
            if save:
                save_reference(path, reference)
        return {"arrays": str(path), "phases": phases, "framework_memory": memory}
    return capture


def run_allreduces(backend: Backend, job: Job, emit: Emit, ranks: Ranks) -> None:
    """Time the backend's collective at each of the job's sizes."""
    for collective, nbytes in job.collective_sizes():
        status = run_allreduce(backend, nbytes, job.options, emit, ranks, collective)
        if status != "ok" and ranks.gather is not None:
            break  # the other ranks' collectives would no longer match this one's


def run_allreduce(backend: Backend, nbytes: int, options: dict[str, Any], emit: Emit, ranks: Ranks,
                  collective: str = ALL_REDUCE) -> str:
    """Time the backend's `collective` of `nbytes` (nccl-tests' size: the all-reduce's buffer
    on each device); returns the status it reported."""
    protocol = window_protocol(nbytes)
    try:
        steps = _collective_steps(backend, collective)
        prepared = steps.prepare(nbytes, options)
        # Every rank runs the same windows: a rank that stopped early on its own would leave
        # the others waiting in a collective until the framework's timeout.
        result = measure(steps, prepared, protocol, agree=ranks.agree, all_stop=ranks.any_stop)
        timing = ranks.timing(result)
    except Unsupported as err:
        emit(AllReduce(nbytes, "unsupported", reason=str(err), collective=collective))
        return "unsupported"
    except Exception as err:
        traceback.print_exc()
        emit(AllReduce(nbytes, "failed", reason=failure(err), collective=collective))
        return "failed"
    emit(AllReduce(nbytes, "ok", timing=timing, collective=collective))
    return "ok"


def _collective_steps(backend: Backend, collective: str) -> _AllReduceSteps | _CollectiveSteps:
    """The backend's `collective` as the steps `measure` times; Unsupported where it has none."""
    if collective == ALL_REDUCE:
        if not isinstance(backend, AllReduceCapable):
            raise Unsupported(f"backend {backend.name!r} has no allreduce_prepare/allreduce_run")
        return _AllReduceSteps(backend)
    if not isinstance(backend, GathersAndScatters):
        raise Unsupported(f"backend {backend.name!r} has no collective_prepare/collective_run")
    return _CollectiveSteps(backend, collective)


class _AllReduceSteps:
    """Presents all-reduce operations as the steps `measure` times."""

    def __init__(self, backend: AllReduceCapable) -> None:
        self.backend = backend

    def prepare(self, nbytes: int, options: dict[str, Any]) -> Any:
        return self.backend.allreduce_prepare(nbytes, options)

    def run(self, prepared: Any, steps: int) -> None:
        self.backend.allreduce_run(prepared, steps)


class _CollectiveSteps:
    """Presents all-gathers or reduce-scatters as the steps `measure` times."""

    def __init__(self, backend: GathersAndScatters, collective: str) -> None:
        self.backend, self.collective = backend, collective

    def prepare(self, nbytes: int, options: dict[str, Any]) -> Any:
        return self.backend.collective_prepare(self.collective, nbytes, options)

    def run(self, prepared: Any, steps: int) -> None:
        self.backend.collective_run(prepared, steps)


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


def _emitter(stream: IO[str]) -> Emit:
    def emit(event: Event) -> None:
        stream.write(event.to_json() + "\n")
        stream.flush()
    return emit


def failure(err: BaseException) -> str:
    """An exception as the one line a Result or SetupFailed carries."""
    return one_line(f"{type(err).__name__}: {err}".strip(), 500)


def load_target(target: str) -> Backend:
    """Import a backend from its entry-point value (used inside worker processes)."""
    return backend_class(target)()


def backend_class(target: str) -> type:
    """The backend class an entry-point value names, imported and not instantiated."""
    return EntryPoint(name="", value=target, group=BACKENDS_GROUP).load()


if __name__ == "__main__":
    sys.exit(main())
