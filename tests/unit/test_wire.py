"""The process boundary (xbench.wire): every job and event survives its JSON form, anything
else is refused with a one-line message that names what is wrong, a worker refuses a job it
cannot read, and the launcher turns a worker's unreadable event into a clear trial failure."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.conftest import ROOT
from xbench.contract import Process, Trial
from xbench.errors import XbenchError
from xbench.experiment import load_spec
from xbench.run.plan import plan_trials
from xbench.wire import (
    EVENT_TYPES,
    WIRE_VERSION,
    AllReduce,
    Done,
    Job,
    Ready,
    Result,
    SetupFailed,
    Start,
    Unavailable,
    Window,
    WireError,
    decode_event,
)


def trials(batch_sizes: tuple[int, ...] = (16, 32)) -> list[Trial]:
    spec = load_spec(None, {"backends": ["numpy"], "models": ["medium"], "batch_sizes": list(batch_sizes),
                            "devices": [1], "replicates": 2, "order_seed": 0})
    return [trial for trial in plan_trials(spec, ["numpy"]) if trial.replicate == 0]


PROCESS = Process(rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0, nnodes=1,
                  coordinator="127.0.0.1:29500", hosts=("127.0.0.1",))


# -- round trips ----------------------------------------------------------------------------------

def jobs() -> list[Job]:
    timed = Job("tests.support.fakes:NumpyBackend", 1, "cpu", trials=tuple(trials()))
    return [
        timed,
        Job("a:B", 2, "gpu", mode="verify", trials=timed.trials, arrays_dir=Path("/tmp/arrays"), process=PROCESS),
        Job("a:B", 2, "cpu", mode="allreduce", sizes=(4096, 2**20), options={"rank": 1, "nested": {"x": [1.5]}}),
        Job("a:B", 1, "cpu"),  # describe: no trials
    ]


@pytest.mark.parametrize("job", jobs(), ids=lambda job: job.mode)
def test_every_job_survives_its_json(job):
    text = job.to_json()
    assert json.loads(text)["wire"] == WIRE_VERSION
    assert Job.from_json(text) == job
    assert Job.from_json(text.encode()) == job


EVENTS = [
    Ready({"framework": "numpy", "device_names": ["fake:0"], "simulated": True, "available": 4}),
    Unavailable("asked for 8 devices; numpy fakes 4"),
    SetupFailed("RuntimeError: no GPU"),
    Start("numpy/medium/d1/b16/r0", "2026-01-01T00:00:00+00:00"),
    Window("numpy/medium/d1/b16/r0", 3),
    Result("numpy/medium/d1/b16/r0", "ok", "2026-01-01T00:00:01+00:00", work={"params": 10},
           backend={"params": 10, "notes": []}, timing={"window_s": [0.1, 0.2], "steps_per_window": 4},
           telemetry={"available": False}, replicate={"index": 0}),
    Result("numpy/medium/d1/b16/r0", "ok", "now", work={"params": 10}, backend={}, arrays="/tmp/a.npz"),
    Result("numpy/medium/d1/b16/r0", "failed", "now", reason="RuntimeError: planned failure"),
    AllReduce(4096, "ok", timing={"window_s": [0.001]}),
    AllReduce(4096, "unsupported", reason="no allreduce_prepare"),
    Done(),
]


def test_the_round_trips_cover_every_event_kind():
    assert {type(event).KIND for event in EVENTS} == set(EVENT_TYPES)


@pytest.mark.parametrize("event", EVENTS, ids=lambda event: type(event).KIND)
def test_every_event_survives_its_json(event):
    line = event.to_json()
    assert "\n" not in line and json.loads(line)["event"] == type(event).KIND
    assert decode_event(line) == event
    assert decode_event(line.encode() + b"\n") == event


def test_a_result_keeps_only_the_measurements_the_worker_filled_in():
    timed, captured, failed = EVENTS[5], EVENTS[6], EVENTS[7]
    assert list(timed.measured()) == ["work", "backend", "timing", "telemetry", "replicate"]
    assert captured.measured() == {"work": {"params": 10}, "backend": {}, "arrays": "/tmp/a.npz"}
    assert failed.measured() == {}


# -- malformed messages ---------------------------------------------------------------------------

def event_line(kind: str, **fields) -> str:
    return json.dumps({"wire": WIRE_VERSION, "event": kind, **fields})


@pytest.mark.parametrize("line, message", [
    ("not an event", "event is not JSON (Expecting value: line 1 column 1 (char 0)): 'not an event'"),
    ('{"wire": 1, "event": "window"', "event is not JSON (Expecting ',' delimiter"),
    (b'{"wire": 1, \xff}', "event is not JSON ('utf-8' codec can't decode byte 0xff"),
    ("[1, 2]", "event is not a JSON object: [1, 2]"),
    ('{"event": "done"}', "event carries no wire version ('wire' field)"),
    ('{"wire": 99, "event": "done"}', "event is of wire version 99, this xbench speaks 4"),
    (event_line("finished"), "event kind 'finished' is unknown (known: ready, unavailable, setup_failed, start,"),
    (json.dumps({"wire": WIRE_VERSION, "done": 1}), "event has no kind ('event' field)"),
    (event_line("window", trial="t"), "'window' event: field 'done' is missing"),
    (event_line("window", trial="t", done=1, total=3), "'window' event: unknown field 'total'"),
    (event_line("window", trial="t", done="1"), "'window' event: field 'done' must be int, got str '1'"),
    (event_line("window", trial="t", done=True), "'window' event: field 'done' must be int, got bool True"),
    (event_line("ready", device_info=["fake:0"]), "'ready' event: field 'device_info' must be an object, got list"),
    (event_line("allreduce", nbytes=4, status="skipped", reason=None, timing=None, collective="allreduce"),
     "'allreduce' event: field 'status' must be one of 'ok', 'failed', 'unsupported', got str 'skipped'"),
    (event_line("result", trial="t", status="ok", at="now", reason=None, work=None, backend=None, timing=None,
                arrays=7, phases=None, framework_memory=None, telemetry=None, replicate=None),
     "'result' event: field 'arrays' must be str, got int 7"),
])
def test_a_malformed_event_is_refused_naming_what_is_wrong(line, message):
    with pytest.raises(WireError) as caught:
        decode_event(line)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value) and isinstance(caught.value, XbenchError)


def job_dict(**changes) -> dict:
    raw = json.loads(jobs()[1].to_json())
    raw.update(changes)
    return raw


@pytest.mark.parametrize("raw, message", [
    ({**job_dict(), "wire": 0}, "job is of wire version 0, this xbench speaks 4"),
    ({k: v for k, v in job_dict().items() if k != "platform"}, "job: field 'platform' is missing"),
    (job_dict(priority=1), "job: unknown field 'priority'"),
    (job_dict(devices=2.0), "job: field 'devices' must be int, got float 2.0"),
    (job_dict(mode="train"), "job: field 'mode' must be one of 'time', 'verify', 'allreduce', got str 'train'"),
    (job_dict(sizes=[1, "2"]), "job: field 'sizes[1]' must be int, got str '2'"),
    (job_dict(process={**job_dict()["process"], "rank": "1"}), "job: field 'process.rank' must be int, got str '1'"),
    (job_dict(process={**job_dict()["process"], "gpu": 0}), "job: unknown field 'process.gpu'"),
    (job_dict(trials=[{"backend": "numpy"}]), "job: field 'trials[0]' is not a trial (KeyError: 'model')"),
    (job_dict(arrays_dir=None), "job: mode 'verify' needs arrays_dir (only mode 'verify' has one)"),
])
def test_a_malformed_job_is_refused_naming_what_is_wrong(raw, message):
    with pytest.raises(WireError) as caught:
        Job.from_json(json.dumps(raw))
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_a_malformed_job_text_is_refused():
    with pytest.raises(WireError, match=r"^job is not JSON \("):
        Job.from_json("{target: numpy}")


# -- the worker package's imports ------------------------------------------------------------------

ALLOWED = ("xbench.contract", "xbench.wire", "xbench.stats", "xbench.errors", "xbench.worker")


def xbench_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "xbench":  # from xbench import stats
            found |= {f"xbench.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return {name for name in found if name == "xbench" or name.startswith("xbench.")}


@pytest.mark.parametrize("path", sorted((ROOT / "xbench" / "worker").glob("*.py")) + [ROOT / "xbench" / "wire.py"],
                         ids=lambda path: path.name)
def test_the_worker_side_imports_only_the_contract_wire_stats_and_errors(path):
    foreign = {name for name in xbench_imports(path) if not any(name == a or name.startswith(a + ".") for a in ALLOWED)}
    assert foreign == set()


def test_a_verification_result_carries_its_phases_across_the_wire():
    sent = Result("jax/medium/d1/b16/r0", "ok", "now", arrays="/tmp/a.npz", phases={"work": 0.5, "gradients": 2.0})
    received = decode_event(sent.to_json())
    assert received == sent and received.measured()["phases"] == {"work": 0.5, "gradients": 2.0}
