"""The wire across real processes: a worker that cannot read its job, and a launcher that
meets an event it cannot read (the rest of the wire is tested in tests/unit/test_wire.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.unit.test_wire import jobs, trials
from xbench.run import launcher, probes, worker_process
from xbench.run.plan import group_trials
from xbench.wire import WIRE_VERSION, SetupFailed, decode_event


def test_a_worker_that_cannot_read_its_job_says_so_and_exits_non_zero():
    job = json.dumps({**json.loads(jobs()[3].to_json()), "wire": 0})
    done = subprocess.run([sys.executable, "-m", "xbench.worker"], input=job.encode(), capture_output=True,
                          timeout=60, cwd=ROOT)
    events = [decode_event(line) for line in done.stdout.splitlines()]
    assert done.returncode != 0
    assert events == [SetupFailed("the worker could not read its job: job is of wire version 0, this xbench "
                                  f"speaks {WIRE_VERSION} (xbench and its worker come from different installations)")]



# -- the launcher and an unreadable event ----------------------------------------------------------

# A worker that keeps the protocol except where told: a stray banner first (skipped), then for
# batch 16 a result with a field no event has; every other trial gets a proper result.
FAKE_WORKER = """
import sys, time
from xbench.wire import WIRE_VERSION, AllReduce, Done, Job, Ready, Result, Start

def emit(event):
    print(event.to_json(), flush=True)

job = Job.from_json(sys.stdin.buffer.read())
print("a banner from sitecustomize, not an event", flush=True)
emit(Ready({"device_names": ["fake:0"], "platform": "cpu"}))
for trial in job.trials:
    emit(Start(trial.id, "now"))
    if trial.global_batch == 16:
        print('{"wire": %d, "event": "result", "trial": "%s", "status": "ok", "speedup": 2}' % (WIRE_VERSION, trial.id),
              flush=True)
        time.sleep(600)  # the launcher must not wait for it
    emit(Result(trial.id, "unsupported", "now", reason="not this one"))
for n, nbytes in enumerate(job.sizes):
    if n == 1:
        print('{"wire": %d, "event": "allreduce", "nbytes": "%d", "status": "ok", "reason": null, "timing": null, '
              '"collective": "allreduce"}'
              % (WIRE_VERSION, nbytes), flush=True)
        time.sleep(600)
    emit(AllReduce(nbytes, "ok", timing={"window_s": [0.001]}))
emit(Done())
"""


@pytest.fixture
def fake_worker(monkeypatch):
    monkeypatch.setattr(worker_process, "WORKER_COMMAND", (sys.executable, "-c", FAKE_WORKER))


def test_an_unreadable_event_fails_its_trial_clearly_and_the_group_goes_on(fake_worker, tmp_path):
    records: list[dict] = []
    ctx = launcher.Context(run_id="t", run_dir=tmp_path, environment={}, write=records.append)
    started = time.monotonic()
    launcher.run_groups(group_trials(trials(), {"numpy": "unused:Backend"}), ctx)
    by_batch = {r["trial"]["global_batch"]: r for r in records}
    assert by_batch[16]["status"] == "failed"
    assert by_batch[16]["reason"] == "worker sent an event xbench cannot read: 'result' event: unknown field 'speedup'"
    assert by_batch[32]["status"] == "unsupported" and by_batch[32]["reason"] == "not this one"  # a fresh worker
    assert by_batch[32]["devices"]["device_names"] == ["fake:0"]
    assert time.monotonic() - started < 60  # not the trial timeout


def test_an_unreadable_all_reduce_event_fails_the_sizes_left(fake_worker, tmp_path):
    results = probes.allreduce_events("unused:Backend", 1, "cpu", [4096, 8192, 16384], {},
                                        tmp_path / launcher.LOG_FILE, timeout_s=600)
    assert results[0] == {"nbytes": 4096, "status": "ok", "reason": None, "timing": {"window_s": [0.001]},
                          "collective": "allreduce"}
    why = "worker sent an event xbench cannot read: 'allreduce' event: field 'nbytes' must be int, got str '8192'"
    assert results[1:] == [{"nbytes": n, "status": "failed", "reason": why, "timing": None, "collective": "allreduce"}
                           for n in (8192, 16384)]
