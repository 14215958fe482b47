"""The plan's estimate holds on a real run: a families-style comparison (a transformer and an
LSTM, verification included, no adaptive rounds) ends within a factor of 2 of the wall time
its plan line announced, on an idle machine or on one with a core taken by another program.
The same run's verify.json says which kernel settings its verification runs compiled with."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                                   reason="needs jax (pip install 'xbench[jax]')")]

COMMAND = ["compare", "--backends", "jax", "--model", "transformer-tiny", "lstm-small", "--devices", "1",
           "--global-batch", "16", "--single-device", "data-parallel", "--time-budget", "0"]


def seconds(text: str) -> float:
    """A duration as `estimate.duration` writes it ("40 s", "3 min", "1 h 03 min")."""
    hours = re.search(r"(\d+) h", text)
    minutes = re.search(r"(\d+) min", text)
    secs = re.fullmatch(r"(\d+) s", text)
    return (int(hours[1]) * 3600 if hours else 0) + (int(minutes[1]) * 60 if minutes else 0) + \
        (int(secs[1]) if secs else 0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(exit code, stderr, wall seconds, run directory) of the comparison, from start to exit."""
    out = tmp_path_factory.mktemp("families") / "run"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "xbench", *COMMAND, "--out", str(out)], capture_output=True,
                          text=True, timeout=600)
    return done.returncode, done.stderr, time.monotonic() - started, out


def test_the_plan_estimate_is_within_a_factor_of_2_of_the_wall_time(run):
    code, err, wall, _ = run
    assert code == 0, err
    found = re.search(r"^plan: .*; estimated ([^:]+?):", err, re.MULTILINE)
    assert found and " to " not in found[1], err  # no adaptive rounds: one figure
    estimated = seconds(found[1])
    assert estimated / 2 <= wall <= estimated * 2, f"estimated {found[1]}, took {wall:.0f} s"


def test_verify_json_keeps_each_verification_runs_kernel_settings(run):
    code, err, _, out = run
    settings = json.loads((out / "verify.json").read_text())["kernel_settings"]
    assert len(settings) == 4, settings  # each model in fp32 and in float64
    for flags in (s["XLA_FLAGS"] for s in settings.values()):
        assert "--xla_gpu_autotune_level" not in flags  # a CPU compiles as timing does
