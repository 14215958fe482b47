"""Result records: one JSON line per trial in `<run dir>/records.jsonl`, appended as each
trial ends, so a crash, timeout or Ctrl-C loses nothing already measured.

Every record carries `schema`. `read_records` upgrades older records one version at a time
(`MIGRATIONS`) and refuses a schema newer than this code knows.

Schema history:
1. the first release.
2. adds `verification` (the identical-work check before timing; `xbench verify`).
3. adds `trial.all_reduce` (False for --breakdown's compute-only twins), `telemetry`, and
   allreduce.jsonl records.
4. one record per replicate: `trial.replicate`, a trial id ending in "/r<replicate>", and
   `replicate` (host load before and after, kernel-choice settings, why the windows stopped,
   throttling); telemetry over the timed windows. Older records are replicate 0.
5. adds `trial.variant` (a backend's named variant, or "as-written") and `trial.program`
   ("data-parallel", or "plain": the single-device program without distribution); a trial
   id names them when they are not the default. Older records are as written, data-parallel.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from xbench.contract import AS_WRITTEN, DATA_PARALLEL
from xbench.errors import XbenchError

SCHEMA_VERSION = 5
RECORDS_FILE = "records.jsonl"
ALLREDUCE_FILE = "allreduce.jsonl"  # the all-reduce microbenchmark, one record per size
RUN_FILE = "run.json"


def utc_now() -> str:
    """A timestamp for records: UTC, ISO 8601, seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def prepare_run_dir(path: Path) -> Path:
    """Create the run directory and prove it is writable, before any trial runs."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise XbenchError(f"cannot write results to {path}: {reason}; choose another --out") from None
    records = path / RECORDS_FILE
    if records.exists() and records.stat().st_size:
        raise XbenchError(f"{path} already holds records; choose a new --out directory")
    return path


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    """Write a whole JSON file atomically (a reader never sees half of it)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class RecordWriter:
    """Appends records to a run directory, one complete line per write, synced to disk."""

    def __init__(self, run_dir: Path, name: str = RECORDS_FILE) -> None:
        self.path = Path(run_dir) / name

    def append(self, record: Mapping[str, Any]) -> None:
        line = json.dumps({"schema": SCHEMA_VERSION, **record}, sort_keys=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


def read_records(run_dir: Path, name: str = RECORDS_FILE) -> list[dict[str, Any]]:
    """All records of a run directory, oldest first; an empty file is an error (a run that
    finished no trial has nothing to report)."""
    records = list(iter_records(Path(run_dir) / name))
    if not records:
        raise XbenchError(f"{Path(run_dir) / name} holds no records; the run finished no trial")
    return latest_per_trial(records) if name == RECORDS_FILE else records


def latest_per_trial(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per trial, the last written (a resumed run appends a retried trial's new
    record after its failed one), in the order the trials first ran."""
    latest = {record.get("trial_id", str(i)): record for i, record in enumerate(records)}
    return list(latest.values())


# A resumed run retries trials whose last record has one of these statuses.
RETRIED_STATUSES = ("failed", "crashed", "timeout", "skipped")


def finished_trials(run_dir: Path) -> set[str]:
    """Trial ids a resumed run skips: those whose last record is final."""
    path = Path(run_dir) / RECORDS_FILE
    if not path.exists():
        return set()
    return {r["trial_id"] for r in latest_per_trial(list(iter_records(path))) if r["status"] not in RETRIED_STATUSES}


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        raise XbenchError(f"no {RECORDS_FILE} in {path.parent}; is it an xbench run directory?")
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise XbenchError(f"{path}:{number} is not a JSON record; the file was edited or damaged") from None
            schema = record.get("schema")
            if not isinstance(schema, int) or schema > SCHEMA_VERSION:
                raise XbenchError(
                    f"{path}:{number} has record schema {schema!r}, newer than this xbench "
                    f"understands ({SCHEMA_VERSION}); upgrade xbench")
            missing = [key for key in REQUIRED.get(path.name, ()) if key not in record]
            if missing:
                raise XbenchError(f"{path}:{number} lacks {', '.join(missing)}; not an xbench record")
            yield migrate(record)


def migrate(record: dict[str, Any]) -> dict[str, Any]:
    """Upgrade a record to SCHEMA_VERSION, one version at a time."""
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

# What every record of each file must hold; anything less is a damaged or foreign file.
REQUIRED = {RECORDS_FILE: ("trial", "status"), ALLREDUCE_FILE: ("backend", "devices", "nbytes", "status")}
