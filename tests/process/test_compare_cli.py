"""`xbench compare` end to end with the numpy test backend: records, failures, bad input."""

import json
import os
from pathlib import Path

import pytest

from tests.conftest import FAST, order_seed_starting_with
from tests.support.processes import TAG, new_tag, tagged_processes
from xbench.results.records import SCHEMA_VERSION, read_records


def records_of(run_dir: Path) -> dict[str, dict]:
    return {r["trial_id"]: r for r in read_records(run_dir)}


def test_compare_writes_a_record_per_trial(fake_backends, run_cli, tmp_path):
    code, out, err = run_cli("compare", "--backends", "numpy", *FAST, "--batch-sizes", "16", "32",
                             "--devices", "1,2", "--out", str(tmp_path / "run"))
    assert code == 0, err
    records = records_of(tmp_path / "run")
    # Two replicates (the CPU default), each in its own worker process.
    assert set(records) == {f"numpy/medium/d{d}/b{b}/r{r}" for d in (1, 2) for b in (16, 32) for r in (0, 1)}
    assert all(r["status"] == "ok" and len(r["timing"]["window_s"]) == 3 for r in records.values())
    assert all(r["replicate"]["host_before"]["cpu_count"] == os.cpu_count() for r in records.values())
    assert "worker pid" in (tmp_path / "run" / "workers.log").read_text()
    starts = (tmp_path / "run" / "workers.log").read_text().count("=== numpy on")
    assert starts == 4  # one worker per backend x device count x replicate, not one per trial
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["spec"]["devices"] == [1, 2] and run["environment"]["cpu_count"] == os.cpu_count()
    assert run["spec"]["protocol"]["replicates"] == 2 and isinstance(run["spec"]["protocol"]["order_seed"], int)
    assert "model medium — 54,403 parameters" in out and "numpy" in out
    assert "simulated CPU devices" in err


def test_a_crashing_trial_loses_nothing_else(fake_backends, run_cli, tmp_path):
    config = tmp_path / "crash.toml"
    config.write_text('devices = [1]\n[options.numpy]\ncrash_batch = 32\n'
                      '[[models]]\npreset = "medium"\nbatch_sizes = [16, 32, 64]\n')
    code, out, err = run_cli("compare", "--backends", "numpy", "--config", str(config), *FAST[2:],
                             "--out", str(tmp_path / "run"))
    assert code == 1
    records = records_of(tmp_path / "run")
    assert records["numpy/medium/d1/b16/r0"]["status"] == "ok"
    assert records["numpy/medium/d1/b32/r0"]["status"] == "crashed"
    assert "exit code 3" in records["numpy/medium/d1/b32/r0"]["reason"]
    assert records["numpy/medium/d1/b64/r0"]["status"] == "ok"  # ran in a fresh worker


def test_a_hanging_trial_times_out_and_the_rest_run(fake_backends, run_cli, tmp_path):
    # 10 s: the trials that do not hang take well under a second idle, but one of them passed 3 s
    # in a full suite with one core kept busy. Only the first replicate hangs: each costs the timeout.
    code, out, err = run_cli("compare", "--backends", "numpy", *FAST, "--batch-sizes", "16,32,64",
                             "--devices", "1", "--option", "numpy.hang_batch=16", "--option", "numpy.hang_replicate=0",
                             "--trial-timeout", "10",
                             "--out", str(tmp_path / "run"))
    assert code == 1
    records = records_of(tmp_path / "run")
    assert records["numpy/medium/d1/b16/r0"]["status"] == "timeout"
    assert "timed out after 10 s" in records["numpy/medium/d1/b16/r0"]["reason"]
    assert [records[f"numpy/medium/d1/b{b}/r0"]["status"] for b in (32, 64)] == ["ok", "ok"]
    assert records["numpy/medium/d1/b16/r1"]["status"] == "ok"


def test_an_exception_in_a_trial_is_a_failed_record(fake_backends, run_cli, tmp_path):
    code, _, _ = run_cli("compare", "--backends", "numpy", *FAST, "--batch-sizes", "16,32",
                         "--devices", "1", "--option", "numpy.fail_batch=16", "--out", str(tmp_path / "run"))
    records = records_of(tmp_path / "run")
    assert code == 1
    assert records["numpy/medium/d1/b16/r0"]["reason"] == "RuntimeError: planned failure"
    assert records["numpy/medium/d1/b32/r0"]["status"] == "ok"


def test_devices_from_a_config_beyond_the_machine_are_left_out_and_said(fake_backends, run_cli, tmp_path):
    """A spec file's device count that no backend here has plans no trial (no worker starts only
    to skip it; the estimate counts what runs) and the run says so in one line."""
    config = tmp_path / "wide.toml"
    config.write_text('devices = [1, 8]\n[[models]]\npreset = "medium"\nbatch_sizes = [16]\n')
    code, _, err = run_cli("compare", "--backends", "numpy", "--config", str(config), *FAST[2:],
                           "--out", str(tmp_path / "run"))
    records = records_of(tmp_path / "run")
    assert code == 0, err
    assert "8 devices: left out, no backend here has that many" in " ".join(err.split())
    assert sorted({r["trial"]["devices"] for r in records.values()}) == [1]
    assert all(r["status"] == "ok" for r in records.values())
    # what the run was asked, on disk: run.json and the report say which counts it left out
    assert json.loads((tmp_path / "run" / "run.json").read_text())["devices_left_out"] == [8]
    assert "8 devices: left out, no backend here has that many" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.parametrize("args, message", [
    (("--backends", "nope"), "unknown backend 'nope'; available:"),
    (("--backends", "missing"), "backend 'missing' cannot run here: missingframework not installed"),
    (("--backends", "numpy", "--model", "xl"), "unknown model 'xl'"),
    (("--backends", "numpy", "--steps", "0"),
     "'steps' in [protocol] of the built-in defaults with the command line's options must be an integer >= 1, got 0"),
    (("--backends", "numpy", "--repeats", "-3"), "'repeats'"),
    (("--backends", "numpy", "--batch-sizes", "33", "--devices", "1,2"), "not divisible by 2 devices"),
    (("--backends", "numpy", "--devices", "1,16"), "16 devices asked, but backend 'numpy' has 4"),
    (("--backends", "numpy", "--devices", "one"), "--devices takes integers"),
    (("--backends", "numpy", "--option", "numpy.bogus=1"), "[options.numpy]: unknown option 'bogus'"),
    (("--backends", "numpy", "--precision", "fp8"), "fp8"),
])
def test_bad_input_is_one_line_and_exit_2(fake_backends, run_cli, tmp_path, args, message):
    out_dir = tmp_path / "run"
    code, out, err = run_cli("compare", *args, "--out", str(out_dir))
    assert code == 2
    assert message in " ".join(err.split()), err
    assert "Traceback" not in err and err.strip().count("\n") <= 2, err
    assert not (out_dir / "records.jsonl").exists()


def test_config_errors_are_one_line(fake_backends, run_cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("devices = [1,\n")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[protocol]\nwarmup = 3\n")
    for path, message in ((bad, "is not valid TOML"), (unknown, "unknown key 'warmup' in [protocol]")):
        code, _, err = run_cli("compare", "--backends", "numpy", "--config", str(path))
        assert code == 2 and message in err and "Traceback" not in err


def test_unwritable_output_directory(fake_backends, run_cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = run_cli("compare", "--backends", "numpy", *FAST, "--out", str(blocker / "run"))
    assert code == 2 and "cannot write results to" in err and "choose another --out" in err


def test_existing_records_are_never_overwritten(fake_backends, run_cli, tmp_path):
    args = ("compare", "--backends", "numpy", *FAST, "--batch-sizes", "16", "--devices", "1",
            "--out", str(tmp_path / "run"))
    assert run_cli(*args)[0] == 0
    before = (tmp_path / "run" / "records.jsonl").read_text()
    code, _, err = run_cli(*args)
    assert code == 2 and "already holds a run" in err
    assert (tmp_path / "run" / "records.jsonl").read_text() == before


def test_backends_command_lists_plugins_and_reasons(fake_backends, run_cli):
    code, out, _ = run_cli("backends", "--no-devices")
    assert code == 0
    assert "numpy" in out and "missing" in out and "missingframework not installed" in " ".join(out.split())


def test_backends_command_finds_each_backends_own_devices_at_once(monkeypatch, run_cli):
    """The backends start side by side, and each row gets its own answer: the subprocess
    launcher's simulated devices, the spmd-only backend's processes."""
    from tests.conftest import FAKES, ROOT
    from xbench.run import registry

    chosen = [e for e in FAKES if e.name in ("numpy", "numpy-spmd", "missing")]
    monkeypatch.setattr(registry, "list_entry_points", lambda: chosen)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    registry.refresh()
    try:
        code, out, _ = run_cli("backends")
    finally:
        monkeypatch.undo()
        registry.refresh()
    rows: dict[str, str] = {}  # a backend's table row, or its block of lines when stacked
    name = ""
    for line in out.splitlines()[1:]:
        if line.strip() and not line.startswith(" "):
            name = line.split()[0]
        if line.strip():
            rows[name] = rows.get(name, "") + " " + line.strip()
    assert code == 0, out
    assert "CPU, up to 4 simulated devices (no GPU found)" in rows["numpy"]
    assert "CPU, up to 4 processes (no GPU found)" in rows["numpy-spmd"]
    assert "unavailable" in rows["missing"]


def test_ctrl_c_keeps_finished_records_and_leaves_no_worker(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    tag = new_tag()
    out_dir = tmp_path / "run"
    script = (
        "import sys\n"
        "from importlib.metadata import EntryPoint\n"
        "from xbench.run import registry\n"
        "registry.list_entry_points = lambda: [\n"
        "    EntryPoint('numpy', 'tests.support.fakes:NumpyBackend', registry.GROUP)]\n"
        "from xbench.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    seed = order_seed_starting_with("numpy/medium/d1/b16/r0", "numpy", [16, 32], [1])
    process = subprocess.Popen(
        [sys.executable, "-c", script, "compare", "--backends", "numpy", *FAST, "--batch-sizes", "16,32",
         "--devices", "1", "--option", "numpy.hang_batch=32", "--order-seed", seed, "--out", str(out_dir)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), TAG: tag},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = out_dir / "records.jsonl"
    deadline = time.monotonic() + 60
    while not (records.exists() and records.read_text().count("\n") == 1):
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.2)
    time.sleep(1.0)  # the second trial is now hanging
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert "1 finished trial record(s) kept" in err and "Traceback" not in err
    assert [r["status"] for r in read_records(out_dir)] == ["ok"]
    assert "worker pid" in (out_dir / "workers.log").read_text()  # a worker did start
    assert tagged_processes(tag) == []


def test_schema_1_records_are_migrated_and_newer_ones_refused(tmp_path):
    from tests.conftest import ROOT
    from xbench.errors import XbenchError

    old = read_records(ROOT / "results" / "2026-11-22-h200x2-jax-quick")  # written with schema 1
    assert old and all(r["schema"] == SCHEMA_VERSION and r["trial"]["all_reduce"] is True for r in old)
    assert all(r["trial"]["replicate"] == 0 and r["trial_id"].endswith("/r0") for r in old)
    assert old[0]["verification"]["status"] == "skipped"
    newer = tmp_path / "records.jsonl"
    newer.write_text(json.dumps({"schema": 99}) + "\n")
    with pytest.raises(XbenchError, match="schema 99, newer than this xbench understands"):
        read_records(tmp_path)
    newer.write_text(json.dumps({"schema": 3, "status": "ok"}) + "\n")  # no trial: damaged
    with pytest.raises(XbenchError, match="lacks trial; not an xbench record"):
        read_records(tmp_path)
    newer.write_text(json.dumps({"schema": 99}) + "\n")
    with pytest.raises(XbenchError, match="schema 99, newer than this xbench understands"):
        read_records(tmp_path)


def test_a_run_directory_name_too_long_for_the_file_system_is_one_line(fake_backends, run_cli, tmp_path):
    code, _, err = run_cli("compare", "--backends", "numpy", *FAST, "--out", str(tmp_path / ("a" * 300)))
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and "File name too long" in line and "choose another --out" in line and len(line) < 300
