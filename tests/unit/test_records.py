"""The record types in xbench.results.records are the schema: what the code writes, what the
validation demands and what is on disk must all be what they declare."""

import json
import types
import typing
from dataclasses import asdict
from pathlib import Path

import pytest

from xbench.contract import DeviceInfo, PreparedInfo, Trial
from xbench.contract.timing import TimingProtocol
from xbench.errors import XbenchError
from xbench.models.model_spec import ModelSpec
from xbench.results.records import (
    ALLREDUCE_FILE,
    RECORDS_FILE,
    SCHEMA_VERSION,
    AllReduceRecord,
    Record,
    RecordWriter,
    StoredDeviceInfo,
    StoredModel,
    StoredPreparedInfo,
    StoredProtocol,
    StoredTrial,
    Timing,
    migrate,
    read_records,
)

ROOT = Path(__file__).resolve().parents[2]


def declared(kind) -> frozenset[str]:
    return kind.__required_keys__ | kind.__optional_keys__


def typed_dict_in(hint):
    """The TypedDict a field holds, alone, optional or in a list; None for anything else."""
    if typing.is_typeddict(hint):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType, list):
        return next((found for arg in typing.get_args(hint) if (found := typed_dict_in(arg))), None)
    return None


def problems(value: dict, kind, where: str = "record") -> list[str]:
    """Keys of `value`, at any depth, that `kind` does not declare or requires but are absent."""
    hints = typing.get_type_hints(kind)
    found = [f"{where}.{key} is not declared" for key in value if key not in hints]
    found += [f"{where}.{key} is required but absent" for key in kind.__required_keys__ if key not in value]
    for key, item in value.items():
        nested = typed_dict_in(hints.get(key))
        if nested is None:
            continue
        items = item if isinstance(item, list) else [item]
        for index, element in enumerate(items):
            if isinstance(element, dict):
                found += problems(element, nested, f"{where}.{key}" + (f"[{index}]" if item is items else ""))
    return found


def trial() -> Trial:
    model = ModelSpec("tiny", widths=(8,), batch_sizes=(4,), inputs=3, outputs=2)
    return Trial("jax", model, 2, 4, "strong", "fp32", "cpu", 1e-3, 0, 16, TimingProtocol(replicates=2))


def launcher_record() -> dict:
    """An ok record as the launcher writes it: its own fields, the worker's result and the
    verification outcome."""
    devices = DeviceInfo("jax", "0.4", "cpu", ("cpu:0", "cpu:1"), True, 2)
    prepared = PreparedInfo(params=42, weights_hash="ab", precision={"matmul": "highest"})
    host = {"loadavg_1m": 0.5, "loadavg_5m": 0.4, "cpu_count": 2, "cpus_allowed": 2}
    return {
        "run_id": "2026-01-01T00-00-00", "trial_id": trial().id, "status": "ok", "reason": None,
        "trial": trial().to_dict(), "devices": asdict(devices), "environment": {"host": "h"},
        "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:00:05+00:00",
        "verification": {"status": "passed", "checks": 3, "failed": []},
        "work": {"params": 42, "weights_hash": "ab", "data_hash": "cd"}, "backend": asdict(prepared),
        "timing": {"first_call_s": 1.5, "window_s": [0.1, 0.11], "steps_per_window": 4, "stopped": "repeats"},
        "telemetry": {"available": False, "reason": "no GPU in use", "framework_memory": None},
        "replicate": {"index": 0, "host_before": host, "host_after": host, "settings": {}, "stopped": "repeats",
                      "throttled": False, "throttle_reasons": []},
    }


def written_and_read(tmp_path: Path, record: dict) -> dict:
    RecordWriter(tmp_path).append(record)
    [found] = read_records(tmp_path)
    return found


@pytest.mark.parametrize("stored, kind", [
    (lambda: trial().to_dict(), StoredTrial),
    (lambda: asdict(trial().model), StoredModel),
    (lambda: asdict(trial().protocol), StoredProtocol),
    (lambda: asdict(DeviceInfo("jax", "0.4", "cpu", ("cpu:0",), True, 1)), StoredDeviceInfo),
    (lambda: asdict(PreparedInfo(params=1, weights_hash="ab", precision={})), StoredPreparedInfo),
], ids=["Trial", "ModelSpec", "TimingProtocol", "DeviceInfo", "PreparedInfo"])
def test_each_stored_dataclass_has_exactly_the_declared_fields(stored, kind):
    assert set(stored()) == declared(kind)


def test_a_record_as_the_launcher_writes_it_is_what_the_type_declares_and_reads_back_unchanged(tmp_path):
    record = launcher_record()
    assert problems(record, Record) == []
    assert written_and_read(tmp_path, record) == {"schema": SCHEMA_VERSION, **json.loads(json.dumps(record))}
    line = (tmp_path / RECORDS_FILE).read_text()
    assert line == json.dumps({"schema": SCHEMA_VERSION, **record}, sort_keys=True) + "\n"


def paths(record: dict) -> list[tuple[str, ...]]:
    """Every key of a record, and of its trial and timing, as a path."""
    return ([(key,) for key in record] + [("trial", key) for key in record["trial"]]
            + [("timing", key) for key in record["timing"]])


@pytest.mark.parametrize("path", paths(launcher_record()), ids="/".join)
def test_every_field_the_validation_requires_is_declared_required(tmp_path, path):
    record = launcher_record()
    *parents, key = path
    table = record
    for parent in parents:
        table = table[parent]
    del table[key]
    try:
        written_and_read(tmp_path, record)
    except XbenchError:  # the validation refuses a record without it: the type must require it
        kind = {(): Record, ("trial",): StoredTrial, ("timing",): Timing}[tuple(parents)]
        assert key in kind.__required_keys__ or (path == ("timing",) and key in Record.__optional_keys__)


def test_only_an_ok_record_needs_what_a_measurement_adds(tmp_path):
    """timing, required of ok records alone, is declared optional: a failed trial has none."""
    record = launcher_record()
    for key in ("timing", "work", "backend", "telemetry", "replicate"):
        del record[key]
    failed = {**record, "status": "crashed", "reason": "worker killed by signal 9", "devices": None}
    assert problems(failed, Record) == []
    assert written_and_read(tmp_path, failed)["status"] == "crashed"


def test_a_schema_1_record_migrates_to_the_declared_keys():
    old = launcher_record()
    for key in ("verification", "telemetry", "replicate"):
        del old[key]
    for key in ("all_reduce", "replicate", "variant", "program", "launcher"):
        del old["trial"][key]
    old["trial_id"] = "jax/tiny/d2/b4"
    old["timing"].pop("stopped")
    migrated = migrate({**old, "schema": 1})
    assert problems(migrated, Record) == []
    assert migrated["trial_id"] == "jax/tiny/d2/b4/r0" and migrated["verification"]["status"] == "skipped"


def test_an_allreduce_record_of_schema_3_migrates_to_the_declared_keys():
    old = {"schema": 3, "kind": "allreduce", "backend": "jax", "devices": 2, "platform": "cpu", "nbytes": 4096,
           "status": "ok", "reason": None, "environment": {},
           "timing": {"first_call_s": 0.1, "window_s": [0.01], "steps_per_window": 100}}
    assert problems(migrate(old), AllReduceRecord) == []


def stored_runs(name: str) -> list[Path]:
    return sorted(path.parent for path in (ROOT / "results").glob(f"*/{name}"))


@pytest.mark.parametrize("run_dir", stored_runs(RECORDS_FILE), ids=lambda path: path.name)
def test_the_records_on_disk_are_what_the_type_declares(run_dir):
    found = [problem for record in read_records(run_dir) for problem in problems(record, Record)]
    assert found == []


@pytest.mark.parametrize("run_dir", stored_runs(ALLREDUCE_FILE), ids=lambda path: path.name)
def test_the_allreduce_records_on_disk_are_what_the_type_declares(run_dir):
    found = [problem for record in read_records(run_dir, ALLREDUCE_FILE)
             for problem in problems(record, AllReduceRecord)]
    assert found == []
