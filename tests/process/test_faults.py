"""Fault injection: write failures, run-directory identity, damaged files, start-up timeouts and
interrupts. Each case asserts the exit status, a one-line message without a traceback, that
no empty or temporary file is left behind, and that every finished record stays readable and
resumable. (Spec values and environment variables: test_faults_input.py; plugins:
test_faults_plugins.py.)

A full disk is injected as an OSError(ENOSPC) at the write: mounting a small tmpfs needs
privileges CI does not have."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import use_fake_backends
from tests.process.test_compare_cli import FAST
from xbench.results import records as records_module
from xbench.results.records import RECORDS_FILE, RUN_FILE, read_records
from xbench.run import registry
from xbench.run.rundir import LOCK_FILE, RunDirLock

RUN = ("compare", "--backends", "numpy", *FAST, "--batch-sizes", "16,32", "--devices", "1")
TRIALS = {f"numpy/medium/d1/b{b}/r{r}" for b in (16, 32) for r in (0, 1)}


def one_line_error(err: str, *words: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert any(line.startswith("error:") for line in lines), err
    for word in words:
        assert word in " ".join(err.split()), (word, err)


def leftovers(path: Path) -> list[str]:
    """Temporary, lock or empty files under `path`."""
    if not path.exists():
        return []
    return sorted(p.name for p in path.rglob("*") if p.is_file() and (
        p.name.endswith(".tmp") or p.name == LOCK_FILE or p.stat().st_size == 0))


def lines_are_whole(path: Path) -> None:
    data = path.read_bytes()
    assert data.endswith(b"\n"), "a torn last line"
    for line in data.splitlines():
        json.loads(line)


@pytest.fixture(scope="module")
def made_run(tmp_path_factory):
    """One finished run for the module (its processes take seconds; 19 tests read or damage a copy)."""
    from tests.process.conftest import captured_main

    out = tmp_path_factory.mktemp("faults") / "run"
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:
            use_fake_backends(monkeypatch)
            code, _, err = captured_main(*RUN, "--out", str(out))
    finally:
        registry.refresh()  # the fakes stay out of later modules' registry, whatever happened
    assert code == 0, err
    return out


@pytest.fixture
def finished_run(fake_backends, made_run, tmp_path):
    """A copy of the module's finished run, the test's own to damage."""
    return Path(shutil.copytree(made_run, tmp_path / "run"))


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# -- 1. write failures -----------------------------------------------------------------------

def test_a_full_disk_mid_run_loses_one_named_record_and_resume_finishes(fake_backends, run_cli, tmp_path,
                                                                       monkeypatch):
    out = tmp_path / "run"
    real, written = records_module._write_line, []

    def fills_up(handle, line):
        if len(written) == 2:  # the disk fills during the third record: half of it reaches the file
            handle.write(line[: len(line) // 2])
            handle.flush()
            no_space()
        real(handle, line)
        written.append(line)

    monkeypatch.setattr(records_module, "_write_line", fills_up)
    code, _, err = run_cli(*RUN, "--out", str(out))
    assert code == 3, err
    one_line_error(err, "could not write the record of trial numpy/medium/d1/", "No space left on device",
                   "is lost", "--resume")
    lines_are_whole(out / RECORDS_FILE)
    assert len(read_records(out)) == 2 and leftovers(out) == []
    monkeypatch.setattr(records_module, "_write_line", real)  # space is freed
    code, _, err = run_cli("compare", "--resume", str(out))
    assert code == 0, err
    assert {r["trial_id"] for r in read_records(out)} == TRIALS and leftovers(out) == []


def test_a_full_disk_at_the_start_leaves_nothing_behind(fake_backends, run_cli, tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(records_module.os, "replace", no_space)  # run.json cannot be written
    code, _, err = run_cli(*RUN, "--out", str(out))
    assert code == 3, err
    one_line_error(err, f"could not write {out / RUN_FILE}", "No space left on device")
    assert not out.exists()


def test_a_failed_start_in_an_existing_empty_directory_leaves_it_empty(fake_backends, run_cli, tmp_path,
                                                                      monkeypatch):
    out, real_replace = tmp_path / "run", os.replace
    out.mkdir()
    monkeypatch.setattr(records_module.os, "replace", no_space)
    code, _, err = run_cli(*RUN, "--out", str(out))
    assert code == 3, err
    assert list(out.iterdir()) == []  # reusable as it was, not "holds a run" nor resumable
    monkeypatch.setattr(records_module.os, "replace", real_replace)
    assert run_cli(*RUN, "--out", str(out))[0] == 0


def test_a_full_disk_while_writing_the_report_leaves_no_partial_file(fake_backends, run_cli, tmp_path,
                                                                     monkeypatch):
    out = tmp_path / "run"
    real_replace = os.replace

    def report_fails(src, dst):
        if str(dst).endswith((".png", ".md", ".html")):
            no_space()
        real_replace(src, dst)

    monkeypatch.setattr(records_module.os, "replace", report_fails)
    code, _, err = run_cli(*RUN, "--out", str(out))
    assert code == 3, err
    one_line_error(err, "could not write", "No space left on device")
    assert not list(out.glob("*.png")) and not (out / "report.md").exists() and leftovers(out) == []
    assert {r["trial_id"] for r in read_records(out)} == TRIALS  # every measurement kept
    monkeypatch.setattr(records_module.os, "replace", real_replace)
    assert run_cli("report", str(out))[0] == 0 and (out / "report.md").stat().st_size > 0


def test_a_record_torn_by_a_crash_is_dropped_said_and_rerun(finished_run, run_cli):
    path = finished_run / RECORDS_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    torn_trial = json.loads(lines[-1])["trial_id"]
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:40])  # a crash in mid-append
    code, out, err = run_cli("report", str(finished_run))
    assert code == 0, err
    assert f"{path}:{len(lines)} was cut off mid-write" in " ".join(err.split())
    assert torn_trial not in {r["trial_id"] for r in read_records(finished_run)}
    code, _, err = run_cli("compare", "--resume", str(finished_run))
    assert code == 0, err
    assert "cut off mid-write" in err and "1 to run" in err
    lines_are_whole(path)
    assert {r["trial_id"] for r in read_records(finished_run)} == TRIALS


def test_a_whole_record_that_lost_only_its_newline_is_kept(finished_run, run_cli):
    path = finished_run / RECORDS_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-2]) + lines[-2].rstrip(b"\n"))  # the last trial lost, the one before whole
    kept = json.loads(lines[-2])["trial_id"]
    code, _, err = run_cli("compare", "--resume", str(finished_run))
    assert code == 0, err
    assert "cut off" not in err and "1 to run" in err
    lines_are_whole(path)
    assert kept in {r["trial_id"] for r in read_records(finished_run)}
    assert {r["trial_id"] for r in read_records(finished_run)} == TRIALS


# -- 2. run-directory identity ---------------------------------------------------------------

def test_a_second_run_on_a_directory_in_use_is_refused_naming_the_holder(fake_backends, run_cli, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with RunDirLock(out).acquire("xbench compare --out elsewhere"):
        code, _, err = run_cli(*RUN, "--out", str(out))
        assert code == 2, err
        one_line_error(err, "is in use by another xbench run", f"pid {os.getpid()}", "xbench compare --out elsewhere")
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing of the refused run
    assert not out.joinpath(LOCK_FILE).exists()


def test_a_resume_of_a_run_in_progress_is_refused(finished_run, run_cli):
    (finished_run / RECORDS_FILE).write_bytes(b"".join((finished_run / RECORDS_FILE).read_bytes()
                                                       .splitlines(keepends=True)[:2]))
    before = (finished_run / RECORDS_FILE).read_bytes()
    with RunDirLock(finished_run).acquire("xbench compare --out run"):
        code, _, err = run_cli("compare", "--resume", str(finished_run))
    assert code == 2
    one_line_error(err, "is in use by another xbench run")
    assert (finished_run / RECORDS_FILE).read_bytes() == before and leftovers(finished_run) == []


def test_a_lock_left_by_a_dead_process_is_stale_and_taken(fake_backends, run_cli, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text(json.dumps({"pid": 999999, "host": "gone", "command": "xbench", "since": "then"}))
    code, _, err = run_cli(*RUN, "--out", str(out))
    assert code == 0, err
    assert {r["trial_id"] for r in read_records(out)} == TRIALS and leftovers(out) == []


def test_a_directory_holding_a_run_is_refused_unless_resumed(finished_run, run_cli):
    # What a run killed during verification leaves: run.json alone.
    (finished_run / RECORDS_FILE).unlink()
    code, _, err = run_cli(*RUN, "--seed", "7", "--out", str(finished_run))
    assert code == 2
    one_line_error(err, "already holds a run (run.json", f"--resume {finished_run}")
    spec = json.loads((finished_run / RUN_FILE).read_text())["spec"]
    assert spec["seed"] == 0  # the old run's spec is still the one recorded
    code, _, err = run_cli("compare", "--resume", str(finished_run))
    assert code == 0, err
    assert {r["trial_id"] for r in read_records(finished_run)} == TRIALS


def test_an_empty_out_is_refused(fake_backends, run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(*RUN, "--out", "")
    assert code == 2
    one_line_error(err, "--out is empty")
    assert list(tmp_path.iterdir()) == []


def test_records_of_another_run_are_not_resumed_into(finished_run, run_cli, tmp_path):
    other = tmp_path / "other"
    assert run_cli(*RUN, "--out", str(other))[0] == 0
    with open(finished_run / RECORDS_FILE, "ab") as handle:
        handle.write((other / RECORDS_FILE).read_bytes().splitlines(keepends=True)[0])
    code, _, err = run_cli("compare", "--resume", str(finished_run))
    assert code == 2
    one_line_error(err, "mixes runs")
    assert leftovers(finished_run) == []


# -- 3. damaged or unexpected files ----------------------------------------------------------

DAMAGED_RECORDS = {
    "null": (lambda r: None, "is NoneType, not a record"),
    "a list": (lambda r: [r], "is list, not a record"),
    "no timing": (lambda r: {k: v for k, v in r.items() if k != "timing"}, "is ok but lacks its timing"),
    "schema 0": (lambda r: {**r, "schema": 0}, "has record schema 0"),
    "schema true": (lambda r: {**r, "schema": True}, "has record schema True"),
    "no trial_id": (lambda r: {k: v for k, v in r.items() if k != "trial_id"}, "lacks a trial_id"),
    "unknown status": (lambda r: {**r, "status": "great"}, "has status 'great'"),
    "windows not numbers": (lambda r: {**r, "timing": {**r["timing"], "window_s": ["fast"]}}, "timing.window_s"),
    "trial not a table": (lambda r: {**r, "trial": "numpy"}, "has a trial that is not a table"),
}


@pytest.mark.parametrize("shape", sorted(DAMAGED_RECORDS))
def test_damaged_records_are_one_line_errors_in_every_reader(finished_run, run_cli, tmp_path, shape):
    damage, message = DAMAGED_RECORDS[shape]
    path = finished_run / RECORDS_FILE
    lines = path.read_text().splitlines()
    lines[1] = json.dumps(damage(json.loads(lines[1])))
    path.write_text("\n".join(lines) + "\n")
    before = sorted(p.name for p in finished_run.iterdir())
    for args in (("report", str(finished_run)), ("export", str(finished_run), "--csv"),
                 ("diff", str(finished_run), str(finished_run)), ("compare", "--resume", str(finished_run))):
        code, _, err = run_cli(*args)
        assert code == 2, (args, err)
        one_line_error(err, f"{path}:2", message)
    assert sorted(p.name for p in finished_run.iterdir()) == before  # nothing written, nothing left


@pytest.mark.parametrize("content, message", [
    (b"{not json", "is not JSON"),
    (b"\xff\xfe\x00run", "is not UTF-8"),
    (b"[]", "holds list, not a run"),
    (b'{"run_id": "x", "command": "xbench", "spec": []}', "has spec []"),
    (b'{"command": "xbench", "spec": {}}', "lacks run_id"),
])
def test_a_damaged_run_json_is_a_one_line_error(finished_run, run_cli, content, message):
    (finished_run / RUN_FILE).write_bytes(content)
    for args in (("report", str(finished_run)), ("compare", "--resume", str(finished_run))):
        code, _, err = run_cli(*args)
        assert code == 2, (args, err)
        one_line_error(err, str(finished_run / RUN_FILE), message)
    assert leftovers(finished_run) == []


# -- start-up and interrupts -----------------------------------------------------------------

def test_a_multi_node_run_whose_peers_never_come_stops_within_the_startup_timeout(fake_backends, run_cli, tmp_path):
    import time

    out = tmp_path / "run"
    started = time.monotonic()
    # Above Linux's default ephemeral range (to 60999): no other test's one-node job, whose
    # ports are drawn below that range, listens where this node looks for its peers.
    code, _, err = run_cli("compare", "--backends", "numpy-peers", *FAST, "--batch-sizes", "16,32", "--devices",
                           "2", "--launcher", "spmd", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1",
                           "--coordinator", "127.0.0.1:62000", "--startup-timeout", "3", "--out", str(out))
    assert time.monotonic() - started < 60
    assert code == 2, err
    one_line_error(err, "started within 3 s (--startup-timeout)", "another node is missing")
    assert {r["status"] for r in read_records(out)} == {"failed"}  # recorded, so --resume reruns them


def test_a_bad_startup_timeout_is_refused(fake_backends, run_cli, tmp_path):
    for value in ("0", "-5", "inf", "1e30"):  # past a week, waiting on it overflows the clock
        code, _, err = run_cli(*RUN, "--startup-timeout", value, "--out", str(tmp_path / "run"))
        assert code == 2
        one_line_error(err, "--startup-timeout must be a positive number of seconds")
    assert not (tmp_path / "run").exists()


def test_an_interrupt_before_any_trial_says_so_and_names_no_missing_file(fake_backends, run_cli, tmp_path,
                                                                          monkeypatch):
    from xbench.run import compare

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "run"
    monkeypatch.setattr(compare, "verification_outcome", interrupted)
    code, _, err = run_cli(*RUN, "--out", str(out))
    assert code == 130
    assert "interrupted before any trial finished" in err and RECORDS_FILE not in err
    assert f"--resume {out}" in " ".join(err.split()) and leftovers(out) == []


def test_an_interrupt_while_loading_the_spec_is_said(fake_backends, run_cli, tmp_path, monkeypatch):
    from xbench.cli import compare_cmd

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # typer would turn it into a silent exit status 130

    monkeypatch.setattr(compare_cmd, "load_spec", interrupted)
    code, _, err = run_cli(*RUN, "--out", str(tmp_path / "run"))
    assert code == 130 and err.strip() == "interrupted"


def test_a_killed_run_resumes_and_leaves_no_stray_file(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT, order_seed_starting_with
    from tests.support.processes import TAG, new_tag, tagged_processes

    tag, out = new_tag(), tmp_path / "run"
    script = ("import sys\n"
              "from importlib.metadata import EntryPoint\n"
              "from xbench.run import registry\n"
              "numpy = EntryPoint('numpy', 'tests.support.fakes:NumpyBackend', registry.GROUP)\n"
              "registry.list_entry_points = lambda: [numpy]\n"
              "from xbench.cli.main import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    seed = order_seed_starting_with("numpy/medium/d1/b16/r0", "numpy", [16, 32], [1])

    def xbench(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", script, *args], cwd=ROOT, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT), TAG: tag, "TMPDIR": str(tmp_path)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    first = xbench(*RUN, "--option", "numpy.hang_batch=32", "--trial-timeout", "3", "--order-seed", seed,
                   "--out", str(out))
    deadline = time.monotonic() + 60
    while not ((out / RECORDS_FILE).exists() and (out / RECORDS_FILE).read_text().count("\n") >= 1):
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)  # no clean-up at all: the lock file and a worker's log stay
    first.communicate(timeout=30)
    second = xbench("compare", "--resume", str(out))
    _, err = second.communicate(timeout=120)
    assert second.returncode == 1 and "Traceback" not in err, err  # the hanging batch times out again
    assert {r["trial_id"]: r["status"] for r in read_records(out)} == {
        **{f"numpy/medium/d1/b16/r{r}": "ok" for r in (0, 1)},
        **{f"numpy/medium/d1/b32/r{r}": "timeout" for r in (0, 1)}}
    assert leftovers(out) == [] and not list(out.glob("workers.log.*"))
    deadline = time.monotonic() + 10
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tagged_processes(tag) == []


@pytest.mark.parametrize("old_run_json", [False, True], ids=["run-json-says", "records-say"])
def test_a_resumed_no_verify_run_is_not_verified(fake_backends, run_cli, tmp_path, old_run_json):
    """`--resume` of a `--no-verify` run verified anyway (on a GPU, a full-size
    verification of GPT-2 small ran out of memory before the two trials left). A run.json from
    before it recorded the choice is judged by its records."""

    out = tmp_path / "run"
    code, _, err = run_cli(*RUN, "--no-verify", "--out", str(out))
    assert code == 0, err
    lines = (out / RECORDS_FILE).read_text().splitlines()
    (out / RECORDS_FILE).write_text("\n".join(lines[:-1]) + "\n")  # the run was cut short
    if old_run_json:
        saved = json.loads((out / RUN_FILE).read_text())
        del saved["no_verify"]
        (out / RUN_FILE).write_text(json.dumps(saved))
    code, _, err = run_cli("compare", "--resume", str(out))
    assert code == 0, err
    assert "started with --no-verify" in err and "verifying identical work" not in err
    assert all(r["verification"] == {"status": "skipped", "reason": "--no-verify"} for r in read_records(out))


@pytest.mark.parametrize("held", [("records.jsonl", "workers.log"), ("workers.log",), ("report.md",),
                                  ("workers.log", "workers.log.1-0-0")])
def test_refusing_a_directory_that_holds_part_of_a_run_deletes_nothing(fake_backends, run_cli, tmp_path, held):
    """A directory with a run's files but no run.json was refused, and then the
    refusing run took those files back as if it had written them."""
    out = tmp_path / "run"
    out.mkdir()
    for name in held:
        (out / name).write_text(f"finished data: {name}\n")
    code, _, err = run_cli(*RUN, "--out", str(out))
    assert code == 2 and "already holds a run" in err, err
    assert sorted(p.name for p in out.iterdir()) == sorted(held)
    assert all((out / name).read_text() == f"finished data: {name}\n" for name in held)
