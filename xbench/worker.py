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
from datetime import datetime, timezone
from typing import IO, Any

from xbench.contract import Backend, DeviceUnavailable, Trial
from xbench.measure import measure
from xbench.registry import load_target
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
    works: dict[tuple, Work] = {}
    for raw in job.get("trials", []):
        run_trial(backend, Trial.from_dict(raw), works, emit)
    emit("done")
    return 0


def run_trial(backend: Backend, trial: Trial, works: dict[tuple, Work], emit) -> None:
    """Prepare and time one trial; any exception becomes a failed result, not a crash."""
    emit("start", trial=trial.id, at=_now())
    try:
        key = (trial.model, trial.samples, trial.seed)
        if key not in works:
            works[key] = build_work(trial.model, trial.samples, trial.seed)
        work = works[key]
        prepared = backend.prepare(trial, work)
        result = measure(backend, prepared, trial.protocol,
                         on_window=lambda done: emit("window", trial=trial.id, done=done))
    except Exception as err:
        traceback.print_exc()
        emit("result", trial=trial.id, status="failed", reason=_one_line(err), at=_now())
        return
    emit(
        "result",
        trial=trial.id,
        status="ok",
        at=_now(),
        work={"params": work.params, "weights_hash": work.weights_hash, "data_hash": work.data_hash},
        backend=asdict(prepared.info),
        timing={"first_call_s": result.first_call_s, "window_s": list(result.window_s),
                "steps_per_window": result.steps_per_window},
    )


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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


if __name__ == "__main__":
    sys.exit(main())
