"""What a record or run.json read back must hold before a reader uses it (each problem a
one-line reason naming what is wrong), and the migrations of older records to the schema of
this code."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeGuard

from xbench.contract import ALL_REDUCE, AS_WRITTEN, COLLECTIVES, DATA_PARALLEL
from xbench.errors import XbenchError, brief
from xbench.results.schema import ALLREDUCE_FILE, SCHEMA_VERSION, STATUSES


def checked_line(line: str, path: Path, number: int) -> dict[str, Any]:
    """One line as a record of the file's kind, or a one-line error naming file and line."""
    where = f"{path}:{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        raise XbenchError(f"{where} is not a JSON record; the file was edited or damaged") from None
    if not isinstance(record, dict):
        raise XbenchError(f"{where} is {type(record).__name__}, not a record; the file was edited or damaged")
    schema = record.get("schema")
    if not _is_int(schema) or schema < 1:
        raise XbenchError(f"{where} has record schema {brief(schema)}, not a version of xbench's records (1 to "
                          f"{SCHEMA_VERSION}); the file was edited or damaged")
    if schema > SCHEMA_VERSION:
        raise XbenchError(f"{where} has record schema {brief(schema)}, newer than this xbench understands "
                          f"({SCHEMA_VERSION}); upgrade xbench")
    problem = (_record_problem if path.name != ALLREDUCE_FILE else _allreduce_problem)(record)
    if problem:
        raise XbenchError(f"{where} {problem}; not an xbench record (the file was edited or damaged)")
    return record


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _record_problem(record: Mapping[str, Any]) -> str | None:
    """What makes a trial record unusable by the readers, or None."""
    if "trial" not in record:
        return "lacks trial"
    trial = record["trial"]
    if not isinstance(trial, dict):
        return "has a trial that is not a table"
    for key, ok in (("backend", lambda v: isinstance(v, str) and v),
                    ("devices", lambda v: _is_int(v) and 0 < v <= MOST_DEVICES),
                    ("global_batch", lambda v: _is_int(v) and 0 < v <= MOST_SAMPLES),
                    ("model", lambda v: isinstance(v, dict) and isinstance(v.get("name"), str))):
        if not ok(trial.get(key)):
            return f"has trial.{key} {brief(trial.get(key))}"
    if not isinstance(record.get("trial_id"), str) or not record["trial_id"]:
        return f"lacks a trial_id (has {brief(record.get('trial_id'))})"
    problem = _protocol_problem(trial.get("protocol"))
    if problem:
        return problem
    if record.get("status") not in STATUSES:
        return f"has status {brief(record.get('status'))}, not one of {', '.join(STATUSES)}"
    if record["status"] == "ok":
        return _timing_problem(record.get("timing"))
    return None


# What a measurement can be. No timer measures a window shorter than a nanosecond, no trial
# runs a week, and a step count must survive the float arithmetic of the statistics (2**53):
# anything outside is damage (a hand edit, a broken disk), and would overflow or divide by
# almost nothing downstream.
SHORTEST_S = 1e-9
LONGEST_S = 7 * 24 * 3600.0
MOST_STEPS = 2**53
MOST_DEVICES = 65_536
MOST_SAMPLES = 2**31 - 1


def _seconds(value: Any, shortest: float = SHORTEST_S) -> bool:
    return _is_number(value) and math.isfinite(value) and shortest <= value <= LONGEST_S


def _protocol_problem(protocol: Any) -> str | None:
    """The protocol's fractions that the statistics read (absent or null in older records)."""
    if protocol is None:
        return None
    if not isinstance(protocol, dict):
        return f"has trial.protocol {brief(protocol)}, not a table"
    for key in ("interval_target", "run_variation", "device_run_variation"):
        value = protocol.get(key)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and 0 <= value <= 1):
            return f"has trial.protocol.{key} {brief(value)}, not a fraction from 0 to 1"
    return None


def _timing_problem(timing: Any) -> str | None:
    if not isinstance(timing, dict):
        return "is ok but lacks its timing"
    windows = timing.get("window_s")
    if not isinstance(windows, list) or not windows or not all(_seconds(w) for w in windows):
        return (f"has timing.window_s that is not a list of seconds between {SHORTEST_S:g} and "
                f"{LONGEST_S:g}: {brief(windows)}")
    steps = timing.get("steps_per_window")
    if not _is_int(steps) or not 1 <= steps <= MOST_STEPS:
        return f"has timing.steps_per_window {brief(steps)}"
    if not _seconds(timing.get("first_call_s"), shortest=0.0):
        return f"has timing.first_call_s {brief(timing.get('first_call_s'))}"
    return None


def _allreduce_problem(record: Mapping[str, Any]) -> str | None:
    for key, ok in (("backend", lambda v: isinstance(v, str) and v),
                    ("devices", lambda v: _is_int(v) and 0 < v <= MOST_DEVICES),
                    ("nbytes", lambda v: _is_int(v) and 0 < v <= MOST_STEPS), ("status", lambda v: v in STATUSES)):
        if key not in record:
            return f"lacks {key}"
        if not ok(record[key]):
            return f"has {key} {brief(record[key])}"
    if record.get("collective", ALL_REDUCE) not in COLLECTIVES:
        return f"has collective {brief(record['collective'])}"
    if record["status"] == "ok":
        return _timing_problem(record.get("timing"))
    return None


def run_problem(run: Any) -> str | None:
    if not isinstance(run, dict):
        return f"holds {type(run).__name__}, not a run"
    required: tuple[tuple[str, type], ...] = (("run_id", str), ("command", str), ("spec", dict))
    for key, kind in required:
        if not isinstance(run.get(key), kind):
            return f"has {key} {brief(run.get(key))}" if key in run else f"lacks {key}"
    optional: tuple[tuple[str, type], ...] = (("launch", dict), ("devices", dict), ("resumed", list),
                                              ("breakdown", bool))
    for key, kind in optional:
        if key in run and not isinstance(run[key], kind):
            return f"has {key} {brief(run[key])}"
    if not isinstance(run["spec"].get("protocol"), dict):  # every release recorded the protocol
        return f"has spec.protocol {brief(run['spec'].get('protocol'))}, not a table"
    return _launch_problem(run.get("launch", {}))


def _launch_problem(launch: Mapping[str, Any]) -> str | None:
    """run.json's launch table, as `xbench.run.cluster.Launch.to_dict` writes it (plus the
    launcher each backend started with)."""
    def count(least: int) -> Callable[[Any], bool]:
        return lambda v: _is_int(v) and least <= v <= MOST_DEVICES

    kinds: dict[str, Callable[[Any], bool]] = {
        "launcher": lambda v: isinstance(v, str), "source": lambda v: isinstance(v, str),
        "nproc_per_node": lambda v: v is None or count(1)(v), "nnodes": count(1), "node_rank": count(0),
        "coordinator": lambda v: v is None or isinstance(v, str),
        "hosts": lambda v: isinstance(v, list) and all(isinstance(h, str) for h in v),
        "backends": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
    }
    for key, value in launch.items():
        if key not in kinds:
            return f"has launch.{brief(key, 30)}, which xbench never writes"
        if not kinds[key](value):
            return f"has launch.{key} {brief(value)}"
    if launch.get("node_rank", 0) >= launch.get("nnodes", 1):
        return f"has launch.node_rank {launch['node_rank']} of {launch.get('nnodes', 1)} nodes"
    return None


def migrate(record: dict[str, Any]) -> dict[str, Any]:
    """Upgrade a record as read (of any schema, either file) to SCHEMA_VERSION, one version
    at a time: a `Record` or an `AllReduceRecord` as this code declares them."""
    while record["schema"] < SCHEMA_VERSION:
        record = MIGRATIONS[record["schema"]](record)
    return record


def _v1_to_v2(record: dict[str, Any]) -> dict[str, Any]:
    unverified = {"status": "skipped", "reason": "recorded before xbench verified (schema 1)"}
    return {"verification": unverified, **record, "schema": 2}


def _v2_to_v3(record: dict[str, Any]) -> dict[str, Any]:
    if "trial" in record:
        record = {**record, "trial": {"all_reduce": True, **record["trial"]}}
    return {**record, "schema": 3}


def _v3_to_v4(record: dict[str, Any]) -> dict[str, Any]:
    """Before replicates every configuration ran in one process: replicate 0."""
    if "trial" not in record:
        return {**record, "schema": 4}
    trial = {**record["trial"], "replicate": record["trial"].get("replicate", 0)}
    ids = {"trial_id": f"{record['trial_id']}/r0"} if "trial_id" in record else {}
    return {**record, **ids, "trial": trial, "schema": 4}


def _v4_to_v5(record: dict[str, Any]) -> dict[str, Any]:
    """Before variants and plain programs every trial ran its backend's data-parallel program
    as written."""
    if "trial" not in record:
        return {**record, "schema": 5}
    trial = {"variant": AS_WRITTEN, "program": DATA_PARALLEL, **record["trial"]}
    return {**record, "trial": trial, "schema": 5}


MIGRATIONS = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5}
