"""Result records on disk: one JSON line per trial in `<run dir>/records.jsonl`, appended as each
trial ends, so a crash, timeout or Ctrl-C loses nothing already measured; run.json; and the
atomic writes every results file goes through. The schema is `xbench.results.schema`; what a
line must hold, and the migrations of older ones, `xbench.results.validation`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, cast, overload

from xbench.errors import XbenchError, brief
from xbench.results.schema import (  # the schema's names, where readers and writers look for them
    ALLREDUCE_FILE as ALLREDUCE_FILE,
)
from xbench.results.schema import RECORDS_FILE as RECORDS_FILE
from xbench.results.schema import RETRIED_STATUSES as RETRIED_STATUSES
from xbench.results.schema import RUN_FILE as RUN_FILE
from xbench.results.schema import SCHEMA_VERSION as SCHEMA_VERSION
from xbench.results.schema import STATUSES as STATUSES
from xbench.results.schema import AllReduceRecord as AllReduceRecord
from xbench.results.schema import ClockRange as ClockRange
from xbench.results.schema import DeviceTelemetry as DeviceTelemetry
from xbench.results.schema import FrameworkMemory as FrameworkMemory
from xbench.results.schema import HostState as HostState
from xbench.results.schema import MemoryFacts as MemoryFacts
from xbench.results.schema import ProcessFacts as ProcessFacts
from xbench.results.schema import RankTiming as RankTiming
from xbench.results.schema import Record as Record
from xbench.results.schema import ReplicateFacts as ReplicateFacts
from xbench.results.schema import Resumption as Resumption
from xbench.results.schema import RunInfo as RunInfo
from xbench.results.schema import StoredDeviceInfo as StoredDeviceInfo
from xbench.results.schema import StoredModel as StoredModel
from xbench.results.schema import StoredPreparedInfo as StoredPreparedInfo
from xbench.results.schema import StoredProtocol as StoredProtocol
from xbench.results.schema import StoredTrial as StoredTrial
from xbench.results.schema import Telemetry as Telemetry
from xbench.results.schema import ThrottleTime as ThrottleTime
from xbench.results.schema import Timing as Timing
from xbench.results.schema import VerificationOutcome as VerificationOutcome
from xbench.results.schema import WorkHashes as WorkHashes
from xbench.results.validation import checked_line, migrate, run_problem


class ResultsNotWritten(XbenchError):
    """A results file could not be written (a full disk, a lost mount): what was finished before
    is kept, and the message says what is lost and how to go on."""


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
    return path


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    """Write a whole JSON file atomically (a reader never sees half of it)."""
    write_atomic(path, (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def write_atomic(path: Path, data: bytes | Callable[[Path], None]) -> Path:
    """Write `path` whole or not at all: into a temporary file beside it, synced, then renamed
    over it. `data` is the bytes, or a function that writes a given path (a figure's savefig).
    On failure the temporary file is removed and `ResultsNotWritten` names the file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if callable(data):
            data(tmp)
        else:
            tmp.write_bytes(data)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:  # a writer's own error or Ctrl-C too: never leave the temporary file
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise ResultsNotWritten(f"could not write {path}: {err.strerror or err}") from None
        raise
    return path


class RecordWriter:
    """Appends records to a run directory, one complete line per write, synced to disk. A write
    that fails is undone (the file is cut back to its last complete line), so a full disk never
    leaves half a record; a crash in mid-write can tear only the last line, which readers
    recognise (`last_line_torn`) and the next append cuts off."""

    def __init__(self, run_dir: Path, name: str = RECORDS_FILE) -> None:
        self.path = Path(run_dir) / name
        self.checked = False  # whether a torn last line (from an earlier crash) was cut off

    def append(self, record: Mapping[str, Any]) -> None:
        """Write a `Record` or an `AllReduceRecord` (this file's kind) with its `schema`. Typed
        as any mapping: the launcher builds records as plain dicts."""
        line = (json.dumps({"schema": SCHEMA_VERSION, **record}, sort_keys=True) + "\n").encode("utf-8")
        existed = self.path.exists()
        try:
            # Unbuffered: a buffer would retry the failed bytes when the file is cut back.
            with open(self.path, "ab", buffering=0) as handle:
                if not self.checked:
                    _cut_torn_tail(handle)
                    self.checked = True
                end = handle.seek(0, os.SEEK_END)
                try:
                    _write_line(handle, line)
                except OSError:
                    os.ftruncate(handle.fileno(), end)  # never leave half a record behind
                    raise
        except OSError as err:
            if not existed and self.path.exists() and self.path.stat().st_size == 0:
                self.path.unlink()
            what = f"the record of trial {record['trial_id']}" if "trial_id" in record else "a record"
            raise ResultsNotWritten(
                f"could not write {what} to {self.path}: {err.strerror or err}; that measurement is lost, every "
                f"earlier record is kept: free the space, then `xbench compare --resume {self.path.parent}` "
                f"reruns what is missing") from None


def _write_line(handle, line: bytes) -> None:
    """One record's line, whole, then synced (a test injects a full disk here)."""
    view = memoryview(line)
    while view:
        view = view[handle.write(view):]  # a raw write may take only part of it
    os.fsync(handle.fileno())


def _cut_torn_tail(handle) -> None:
    """Make the file end with a complete line before appending: a last line a crash cut off
    mid-write (`last_line_torn`, which readers leave out) is cut away; a whole record that lost
    only its newline (readers count it) gets the newline."""
    if handle.seek(0, os.SEEK_END) == 0:
        return
    torn = last_line_torn(Path(handle.name))
    if torn is None:
        with open(handle.name, "rb") as reader:
            reader.seek(-1, os.SEEK_END)
            if reader.read(1) != b"\n":
                _write_line(handle, b"\n")
        return
    with open(handle.name, "rb") as reader:
        data = reader.read()
    os.ftruncate(handle.fileno(), data.rfind(b"\n") + 1)


@overload
def read_records(run_dir: Path, name: Literal["records.jsonl"] = ...) -> list[Record]: ...


@overload
def read_records(run_dir: Path, name: Literal["allreduce.jsonl"]) -> list[AllReduceRecord]: ...


def read_records(run_dir: Path, name: str = RECORDS_FILE) -> list[Record] | list[AllReduceRecord]:
    """All records of a run directory (`name`: RECORDS_FILE or ALLREDUCE_FILE), oldest first;
    an empty file is an error (a run that finished no trial has nothing to report). A torn
    last line is left out (`last_line_torn`)."""
    path = Path(run_dir) / name
    raw = list(_valid_records(path))
    if not raw:
        raise XbenchError(f"{path} holds no records; the run finished no trial")
    if name == RECORDS_FILE and (Path(run_dir) / RUN_FILE).exists():  # all-reduce records carry no run id
        check_same_run(read_run(run_dir)["run_id"], (r.get("run_id") for r in raw), path)
    if name == ALLREDUCE_FILE:
        return [cast(AllReduceRecord, record) for record in raw]
    return latest_per_trial([cast(Record, record) for record in raw])


def check_same_run(run_id: str, record_run_ids: Iterable[Any], records_path: Path,
                   fix: str = "keep one run per directory") -> None:
    """A run directory holds one run: a record of another run (a file copied in, two runs
    appended to one file) would be counted as this run's, or replace one of its trials."""
    others = sorted({str(r) for r in record_run_ids if r != run_id})
    if others:
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        shown = ", ".join(brief(o, 40) for o in others[:3]) + more
        raise XbenchError(f"{records_path} holds records of run(s) {shown}, but {RUN_FILE} is run {run_id}: "
                          f"the directory mixes runs; {fix}")


def latest_per_trial(records: list[Record]) -> list[Record]:
    """One record per trial, the last written (a resumed run appends a retried trial's new
    record after its failed one), in the order the trials first ran."""
    latest = {record["trial_id"]: record for record in records}
    return list(latest.values())


# A resumed run retries trials whose last record has one of these statuses.
def finished_trials(run_dir: Path) -> set[str]:
    """Trial ids a resumed run skips: those whose last record is final."""
    path = Path(run_dir) / RECORDS_FILE
    if not path.exists():
        return set()
    return {r["trial_id"] for r in latest_per_trial(list(iter_records(path))) if r["status"] not in RETRIED_STATUSES}


def recorded_trials(run_dir: Path) -> set[str]:
    """Trial ids with any record: run to an end, whether a resumed run would retry them
    (failed, skipped) or not; those without one never ran, or were stopped before they ended."""
    path = Path(run_dir) / RECORDS_FILE
    return {r["trial_id"] for r in iter_records(path)} if path.exists() else set()


def last_line_torn(path: Path) -> int | None:
    """The number of the file's last line when a crash cut it off mid-write (no newline, not
    JSON): an interrupted append, which readers leave out and a resumed run reruns."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    if not data or data.endswith(b"\n"):
        return None
    tail = data[data.rfind(b"\n") + 1:]
    try:
        json.loads(tail)
    except ValueError:
        return data.count(b"\n") + 1
    return None


def iter_records(path: Path) -> Iterator[Record]:
    """Every record of a records file (RECORDS_FILE), validated and migrated to
    SCHEMA_VERSION; a one-line error names the file and line of anything else. A torn last
    line is skipped."""
    for record in _valid_records(path):
        yield cast(Record, record)


def _valid_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of a records or all-reduce file, validated and migrated: a `Record` or an
    `AllReduceRecord`, as the file's name says."""
    if not path.exists():
        raise XbenchError(f"no {path.name} in {path.parent}; is it an xbench run directory?")
    torn = last_line_torn(path)
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip() or number == torn:
                    continue
                yield migrate(checked_line(line, path, number))
    except UnicodeDecodeError:
        raise XbenchError(f"{path} is not UTF-8 text; the file was damaged or is not an xbench record file") from None
    except OSError as err:
        raise XbenchError(f"cannot read {path}: {err.strerror or err}") from None


def read_run(run_dir: Path) -> RunInfo:
    """run.json of a run directory, checked: UTF-8 JSON holding a run id, the command and the
    spec; a one-line error names the file and what is wrong."""
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        raise XbenchError(f"no {RUN_FILE} in {run_dir}; is it an xbench run directory?")
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise XbenchError(f"{path} is not UTF-8 text; the file was damaged") from None
    except json.JSONDecodeError as err:
        raise XbenchError(f"{path} is not JSON (line {err.lineno}: {err.msg}); "
                          "the file was edited or damaged") from None
    except OSError as err:
        raise XbenchError(f"cannot read {path}: {err.strerror or err}") from None
    problem = run_problem(run)
    if problem:
        raise XbenchError(f"{path} {problem}; the file was edited or damaged")
    return cast(RunInfo, run)
