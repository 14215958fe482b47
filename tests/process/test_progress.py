"""What a run shows while it works: plain lines as things happen when stderr
is not a terminal, and a --resume of a complete run that says so at once and runs nothing."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

from tests.conftest import ROOT, order_seed_starting_with
from tests.support.processes import TAG, new_tag, tagged_processes
from xbench.results.records import RECORDS_FILE, RUN_FILE

SMALL = ("compare", "--backends", "numpy", "--model", "medium", "--batch-sizes", "16", "--devices", "1",
         "--replicates", "2", "--repeats", "2", "--steps", "2", "--warmup-steps", "0")


def test_piped_output_has_a_line_per_verification_run_and_per_replicate(fake_backends, run_cli, tmp_path):
    code, _, err = run_cli(*SMALL, "--out", str(tmp_path / "run"))
    assert code == 0, err
    lines = err.splitlines()
    assert "verifying identical work and all-reduce (skip with --no-verify): 2 reference run(s)" in lines
    # The reference runs go at once, so either may finish first.
    finished = [re.fullmatch(r"verifying ([12])/2: numpy medium d1 (fp32|fp64): unsupported: .* \(\d+ s elapsed\)",
                             line) for line in lines]
    assert sorted(m.groups() for m in finished if m) in ([("1", "fp32"), ("2", "fp64")],
                                                          [("1", "fp64"), ("2", "fp32")]), err
    first = next(i for i, line in enumerate(lines) if line.startswith("[1/2] numpy medium d1 b16 r"))
    assert re.fullmatch(r"\[1/2\] numpy medium d1 b16 r[01]: [\d,]+ samples/s \(\d+ s elapsed, ~\d+ s left\)",
                        lines[first]), lines[first]
    assert re.fullmatch(r"\[2/2\] numpy medium d1 b16 r[01]: [\d,]+ samples/s \(\d+ s elapsed\)", lines[first + 1])
    assert "\x1b[" not in err  # no live display's escapes


def test_a_resume_of_a_complete_run_says_so_at_once_and_runs_nothing(fake_backends, run_cli, tmp_path):
    out = tmp_path / "run"
    assert run_cli(*SMALL, "--out", str(out))[0] == 0
    before = {name: (out / name).read_bytes() for name in (RUN_FILE, RECORDS_FILE, "workers.log", "verify.json")}
    code, tables, err = run_cli("compare", "--resume", str(out))
    assert code == 0, err
    assert err.splitlines()[0] == f"{out} is already complete (2 replicate(s) recorded); nothing to run"
    assert "verifying" not in err and "[1/" not in err and "to run" not in err.split("nothing to run", 1)[1]
    assert "model medium" in tables and f"report: {out / 'report.md'}" in err
    # No worker started (not even to find the devices), nothing verified, no resumption recorded.
    assert {name: (out / name).read_bytes() for name in before} == before
    assert "resumed" not in json.loads((out / RUN_FILE).read_text())


def test_a_resume_of_a_run_missing_a_replicate_runs_it(fake_backends, run_cli, tmp_path):
    out = tmp_path / "run"
    assert run_cli(*SMALL, "--no-verify", "--out", str(out))[0] == 0
    lines = (out / RECORDS_FILE).read_text().splitlines()
    (out / RECORDS_FILE).write_text(lines[0] + "\n")
    code, _, err = run_cli("compare", "--resume", str(out))
    assert code == 0, err
    assert "already complete" not in err and "1 trial(s) already recorded, 1 to run" in err
    assert re.search(r"^\[1/1\] numpy medium d1 b16 r[01]: ", err, re.MULTILINE), err


def _lines(stream, found: queue.Queue) -> None:
    for line in stream:
        found.put((line.rstrip("\n"), time.monotonic()))
    found.put((None, time.monotonic()))


def test_piped_lines_arrive_as_things_happen(tmp_path):
    """`xbench compare ... 2>&1 | cat`: a replicate's line is out while the run still works
    (here on a replicate that hangs), not at the end."""
    tag, out = new_tag(), tmp_path / "run"
    script = ("import sys\n"
              "from importlib.metadata import EntryPoint\n"
              "from xbench.run import registry\n"
              "registry.list_entry_points = lambda: [EntryPoint('numpy', 'tests.support.fakes:NumpyBackend', "
              "registry.GROUP)]\n"
              "from xbench.cli.main import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    seed = order_seed_starting_with("numpy/medium/d1/b16/r0", "numpy", [16, 32], [1])
    process = subprocess.Popen(
        [sys.executable, "-c", script, "compare", "--backends", "numpy", "--model", "medium", "--batch-sizes", "16,32",
         "--devices", "1", "--replicates", "2", "--repeats", "2", "--steps", "2", "--warmup-steps", "0",
         "--no-verify", "--option", "numpy.hang_batch=32", "--order-seed", seed, "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), TAG: tag},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_lines, args=(process.stdout, found), daemon=True)
    reader.start()
    deadline, seen = time.monotonic() + 60, []
    while not seen or not seen[-1].startswith("[1/4] numpy medium d1 b16 r0: "):
        line, _ = found.get(timeout=max(0.1, deadline - time.monotonic()))
        assert line is not None, "\n".join(seen)
        seen.append(line)
    assert process.poll() is None  # the next replicate hangs: the line came while the run works
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)
    reader.join(timeout=10)
    process.stdout.close()
    assert process.returncode == 130
    deadline = time.monotonic() + 10
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tagged_processes(tag) == []


def test_a_run_with_an_adaptive_round_still_due_is_not_complete(fake_backends, run_cli, tmp_path):
    """Complete means that a resume would run nothing: adaptive rounds included."""
    out = tmp_path / "run"
    adaptive = ("--no-verify", "--interval-target", "0.0001", "--time-budget", "300", "--max-replicates", "3",
                "--run-variation", "0")
    code, _, err = run_cli(*SMALL, *adaptive, "--out", str(out))
    assert code == 0 and "round 3:" in err, err
    code, _, err = run_cli("compare", "--resume", str(out))
    assert code == 0 and "is already complete (3 replicate(s) recorded)" in err, err  # at the cap
    lines = (out / RECORDS_FILE).read_text().splitlines()
    (out / RECORDS_FILE).write_text("\n".join(lines[:2]) + "\n")  # interrupted before round 3 ended
    code, _, err = run_cli("compare", "--resume", str(out))
    assert code == 0 and "already complete" not in err and "round 3:" in err, err
    assert re.search(r"^\[1/1\] numpy medium d1 b16 r2: ", err, re.MULTILINE), err
