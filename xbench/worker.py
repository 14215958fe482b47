"""The worker process: one backend, one device count, one framework imported.

Started by `xbench.launcher` as `python -m xbench.worker`; reads one JSON job on stdin and
writes JSON events, one per line, on its original stdout. Everything else the process or its
framework prints goes to stderr, so framework noise can never corrupt the event stream.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import asdict
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from xbench.contract import Backend, DeviceInfo, DeviceUnavailable, Trial, Unsupported
from xbench.allreduce import window_protocol
from xbench.measure import measure, observe
from xbench.records import utc_now as _now
from xbench.telemetry import open_sampler
from xbench.registry import load_target
from xbench.verify import reference_run, save_reference
from xbench.work import Work, build_work


def main() -> int:
    events = _claim_stdout()
    job = json.loads(sys.stdin.read())
    emit = _emitter(events)
    backend = load_target(job["target"])
    try:
        info = backend.setup(job["devices"], job["platform"])
    except DeviceUnavailable as err:
        emit("unavailable", reason=str(err))
        return 0
    except Exception as err:
        emit("setup_failed", reason=_one_line(err))
        traceback.print_exc()
        return 1
    emit("ready", device_info=asdict(info))
    if job.get("mode") == "allreduce":
        for nbytes in job["sizes"]:
            run_allreduce(backend, nbytes, job.get("options", {}), emit)
        emit("done")
        return 0
    works: dict[tuple, Work] = {}
    action = _verification(Path(job["arrays_dir"])) if job.get("mode") == "verify" else _timing(info)
    for raw in job.get("trials", []):
        run_trial(backend, Trial.from_dict(raw), works, emit, action)
    emit("done")
    return 0


Action = Callable[[Backend, Any, Trial, Work, Callable[..., None]], dict[str, Any]]


def run_trial(backend: Backend, trial: Trial, works: dict[tuple, Work], emit, action: Action) -> None:
    """Prepare one trial and apply `action` to it; any exception becomes a failed result."""
    emit("start", trial=trial.id, at=_now())
    try:
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


def _timing(info: DeviceInfo) -> Action:
    def time_trial(backend: Backend, prepared: Any, trial: Trial, work: Work, emit) -> dict[str, Any]:
        result = measure(backend, prepared, trial.protocol,
                         on_window=lambda done: emit("window", trial=trial.id, done=done))
        telemetry = _telemetry(backend, prepared, trial, info)
        return {"timing": _timing_fields(result), "telemetry": telemetry}
    return time_trial


def _telemetry(backend: Backend, prepared: Any, trial: Trial, info: DeviceInfo) -> dict[str, Any]:
    """GPU telemetry over an untimed stretch of training after the timed windows."""
    # NVML numbers GPUs as CUDA does unless CUDA_VISIBLE_DEVICES reorders them.
    sampler = open_sampler(range(trial.devices)) if info.platform == "gpu" else "no GPU in use"
    if isinstance(sampler, str):
        telemetry: dict[str, Any] = {"available": False, "reason": sampler}
    else:
        try:
            steps, _ = observe(backend, prepared, trial.protocol, sampler.sampling)
            telemetry = sampler.summary(steps * trial.global_batch)
        finally:
            sampler.close()
    peak = getattr(backend, "memory_peak_bytes", None)
    telemetry["framework_memory"] = peak(prepared) if callable(peak) else None
    return telemetry


def _timing_fields(result: Any) -> dict[str, Any]:
    return {"first_call_s": result.first_call_s, "window_s": list(result.window_s),
            "steps_per_window": result.steps_per_window}


def _verification(arrays_dir: Path) -> Action:
    def capture(backend: Backend, prepared: Any, trial: Trial, work: Work, emit) -> dict[str, Any]:
        path = arrays_dir / f"{trial.id.replace('/', '_')}.npz"
        save_reference(path, reference_run(backend, prepared, trial.protocol.steps))
        return {"arrays": str(path)}
    return capture


def run_allreduce(backend: Backend, nbytes: int, options: dict[str, Any], emit) -> None:
    """Time the backend's all-reduce of an `nbytes` float32 buffer per device."""
    protocol = window_protocol(nbytes)
    try:
        if not callable(getattr(backend, "allreduce_prepare", None)):
            raise Unsupported(f"backend {backend.name!r} has no allreduce_prepare/allreduce_run")
        prepared = backend.allreduce_prepare(nbytes, options)
        result = measure(_AllReduceSteps(backend), prepared, protocol)
    except Unsupported as err:
        emit("allreduce", nbytes=nbytes, status="unsupported", reason=str(err))
        return
    except Exception as err:
        traceback.print_exc()
        emit("allreduce", nbytes=nbytes, status="failed", reason=_one_line(err))
        return
    emit("allreduce", nbytes=nbytes, status="ok", timing=_timing_fields(result))


class _AllReduceSteps:
    """Presents all-reduce operations as the steps `measure` times."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def run(self, prepared: Any, steps: int) -> None:
        self.backend.allreduce_run(prepared, steps)


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
