"""Workers forked from a fork server (xbench.run.zygote): every worker a process of its own,
recorded as forked with its start-up seconds; crashes and hangs cost only their trials; a
server that cannot start leaves the run to workers started from scratch; nothing outlives
the run; XBENCH_WORKER_START=exec turns it off."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.process.test_compare_cli import FAST
from tests.support.preload_counter import PRELOADS, noted
from xbench.results.records import read_records
from xbench.run import worker_process
from xbench.run.worker_process import remove_workers_temporary, worker_environment
from xbench.run.zygote import START_VARIABLE, ForkServers
from xbench.worker.zygote import exit_status

RUN = ("compare", *FAST, "--batch-sizes", "16,32", "--devices", "1,2", "--replicates", "2")
ONE_PROCESS = ("compare", *FAST, "--batch-sizes", "16,32,64", "--devices", "1", "--replicates", "2")


def processes_below(pid: int) -> list[str]:
    """The command lines of `pid`'s living descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        try:
            found.append((Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
        todo += children.get(child, [])
    return found


def test_every_worker_is_forked_a_process_of_its_own_and_recorded_so(fake_backends, run_cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(*RUN, "--backends", "numpy", "numpy-spmd", "--out", str(out))
    assert code == 0, err
    records = read_records(out)
    assert len(records) == 2 * 2 * 2 * 2 and all(r["status"] == "ok" for r in records)
    assert all(r["process"]["forked"] for r in records)
    # one process per backend x device count x replicate, none of them this one
    pids = {r["process"]["pid"] for r in records}
    assert len(pids) == 2 * 2 * 2 and os.getpid() not in pids
    assert all(0 < r["process"]["start_s"] < 60 for r in records)
    log = (out / "workers.log").read_text()
    assert log.count("forked from a fork server") == 8 + 2  # and each backend's describe before the run
    assert not [c for c in processes_below(os.getpid()) if "xbench.worker" in c]  # servers end with the run


@pytest.mark.parametrize("p2p", ["on", "off"])  # off: NCCL's variables in force from the start
def test_one_fork_server_per_backend_finds_the_devices_verifies_and_times(fake_backends, run_cli, tmp_path,
                                                                          monkeypatch, p2p):
    """The framework is imported once per backend and run: the describe, verification and
    timed workers all fork from the server started to find the devices."""
    imports = tmp_path / "imports"
    monkeypatch.setenv(PRELOADS, str(imports))
    out = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy-counted", "--model", "medium", "--batch-sizes", "16",
                           "--devices", "1", "2", "--repeats", "2", "--steps", "2", "--warmup-steps", "0",
                           "--replicates", "2", "--p2p", p2p, "--out", str(out))
    assert code == 0, err
    assert len(noted(imports)["server"]) == 1
    log = (out / "workers.log").read_text()
    started = [line for line in log.splitlines() if line.startswith("=== ")]
    assert started and all("forked from a fork server" in line for line in started), started
    assert any("verification run" in line for line in started) and any("replicate" in line for line in started)
    assert any(line.startswith("=== describe") for line in started)


def test_the_all_reduce_ranks_fork_from_the_server_that_found_the_devices(fake_backends, run_cli, tmp_path,
                                                                            monkeypatch):
    imports = tmp_path / "imports"
    monkeypatch.setenv(PRELOADS, str(imports))
    out = tmp_path / "allreduce.json"
    code, _, err = run_cli("allreduce", "--backends", "numpy-spmd-counted", "--devices", "2", "--sizes", "4KiB",
                           "--json", str(out))
    assert code == 0, err
    found = noted(imports)
    assert len(found["server"]) == 1  # one import: the server that forked the describe worker
    assert len(found["worker"]) == 2 and set(found["worker"]) == set(found["server"]), found  # forked both ranks


def test_exec_starts_every_worker_from_scratch(fake_backends, run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv(START_VARIABLE, "exec")
    out = tmp_path / "run"
    code, _, err = run_cli(*RUN, "--backends", "numpy", "--out", str(out))
    assert code == 0, err
    records = read_records(out)
    assert records and not any(r["process"]["forked"] for r in records)
    assert "fork server" not in (out / "workers.log").read_text()


def test_a_forked_worker_that_crashes_or_hangs_costs_only_its_trial(fake_backends, run_cli, tmp_path, monkeypatch):
    """... and the temporary files the crashed and the killed worker could not remove at exit are
    removed with the workers' temporary directory when xbench exits (`remove_workers_temporary`)."""
    # 30 s: a healthy numpy trial starved by a busy machine must not pass for the hung one (one timed
    # out at 12 s in a full suite on an idle fresh clone, beside the other worker's framework fixtures).
    # Only the first replicate hangs: each hang costs the whole timeout.
    out, temporary = tmp_path / "run", tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(worker_process, "_WORKERS_TEMPORARY", {})  # so as to remove only this run's
    code, _, err = run_cli(*ONE_PROCESS, "--backends", "numpy", "--option", "numpy.crash_batch=16",
                           "--option", "numpy.hang_batch=32", "--option", "numpy.hang_replicate=0",
                           "--option", "numpy.temporary_file=1", "--trial-timeout", "30", "--out", str(out))
    assert code != 0 and "Traceback" not in err, err
    records = read_records(out)
    assert sorted((r["trial"]["global_batch"], r["trial"]["replicate"]) for r in records) == [
        (b, k) for b in (16, 32, 64) for k in (0, 1)]
    for record in records:
        batch, status = record["trial"]["global_batch"], record["status"]
        hung = "timeout" if record["trial"]["replicate"] == 0 else "ok"
        assert status == {16: "crashed", 32: hung, 64: "ok"}[batch], record
        assert batch != 16 or "exit code 3" in record["reason"], record
        assert batch != 64 or record["process"]["forked"]
    assert not [c for c in processes_below(os.getpid()) if "xbench.worker" in c]  # the hung one was killed
    left = [path.relative_to(temporary).parts for path in temporary.rglob("xbench-fake-*")]
    assert left and all(parts[0].startswith("xbench-workers-") for parts in left), left  # crashed and killed workers'
    remove_workers_temporary()
    assert not list(temporary.iterdir())


def test_a_server_that_cannot_start_leaves_the_run_to_workers_from_scratch(fake_backends, run_cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(*RUN, "--backends", "numpy-unforkable", "--out", str(out))
    assert code == 0, err
    records = read_records(out)
    assert len(records) == 8 and all(r["status"] == "ok" and not r["process"]["forked"] for r in records)
    log = (out / "workers.log").read_text()
    assert log.count("no fork server for tests.support.fakes:UnforkableBackend") == 1, log
    assert "xbench_test_no_such_module" in log


NUMPY = "tests.support.fakes:NumpyBackend"


def test_a_forked_worker_leads_its_process_group_as_soon_as_its_pid_is_known(fake_backends, tmp_path):
    """The launcher may kill a worker's group right after asking for it (an interrupt, a rank
    that failed to start): the group must exist by then, as with a Popen'd worker."""
    servers = ForkServers(tmp_path / "workers.log", ready_timeout_s=60)
    try:
        with open(tmp_path / "worker.log", "ab") as log:
            process = servers.fork(NUMPY, worker_environment(), frozenset(), log)
        assert process is not None and os.getpgid(process.pid) == process.pid
        os.killpg(process.pid, signal.SIGKILL)  # it waits for its job on stdin meanwhile
        assert process.wait(timeout=30) == -signal.SIGKILL
    finally:
        servers.close()
        for stream in (process.stdin, process.stdout):
            stream.close()


def test_a_server_slower_than_the_start_up_timeout_is_replaced_once_then_given_up(fake_backends, tmp_path):
    said: list[str] = []
    servers = ForkServers(tmp_path / "workers.log", ready_timeout_s=2, turned_off=said.append)
    start = time.monotonic()
    try:
        with open(tmp_path / "worker.log", "ab") as log:
            hanging = "tests.support.fakes:HangingPreloadBackend"
            assert servers.fork(hanging, worker_environment(), frozenset(), log) is None
            assert servers.fork(NUMPY, worker_environment(), frozenset(), log) is None  # off for the whole run
        assert time.monotonic() - start < 20
        text = (tmp_path / "workers.log").read_text()
        assert text.count("timed out after 2 s (--startup-timeout) in its import: ended, and replaced") == 1, text
        assert len(said) == 1 and said[0].endswith("in its import, its second miss"), said
    finally:
        servers.close()
    assert not [c for c in processes_below(os.getpid()) if "xbench.worker.zygote" in c]


def test_a_dead_server_takes_its_workers_with_it_and_later_workers_start_from_scratch(fake_backends, tmp_path):
    servers = ForkServers(tmp_path / "workers.log", ready_timeout_s=60)
    try:
        with open(tmp_path / "worker.log", "ab") as log:
            process = servers.fork(NUMPY, worker_environment(), frozenset(), log)
            (server,) = servers.servers.values()
            server.process.kill()
            assert process.wait(timeout=30) == -signal.SIGKILL
            assert servers.fork(NUMPY, worker_environment(), frozenset(), log) is None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{process.pid}").exists():
            time.sleep(0.05)
        assert not Path(f"/proc/{process.pid}").exists(), "the worker outlived its server"
        assert "no fork server for tests.support.fakes:NumpyBackend" in (tmp_path / "workers.log").read_text()
    finally:
        servers.close()
        for stream in (process.stdin, process.stdout):
            stream.close()


@pytest.mark.parametrize("code,status,printed", [(None, 0, ""), (0, 0, ""), (3, 3, ""), ("no job", 1, "no job\n")])
def test_a_forked_worker_ends_with_the_status_python_would_give(code, status, printed, capsys):
    assert exit_status(code) == status
    assert capsys.readouterr().err == printed
