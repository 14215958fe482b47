"""benchmarks/fsdp_loops.py: its verdicts on synthetic figures (the target applies at gpt2-xl on
GPUs, where a mistake costs device time), and a CPU run end to end at transformer-tiny on 2
simulated devices / 2 gloo ranks, minimal loops and xbench compare in one call."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.process.test_benchmark_expert_loops import BENCHMARKS, benchmark_module


@pytest.fixture(scope="module")
def fl():
    return benchmark_module("fsdp_loops")


def figures(program: str, tokens: float, variant: str = "fsdp") -> dict:
    return {"framework": program.split()[1].split("+")[0], "program": program, "variant": variant,
            "tokens_per_s": tokens}


def test_ratio_is_xbench_best_sharded_over_the_minimal_loop(fl):
    minimal = figures("minimal torch fsdp+compile", 50_000.0)
    rows = [figures("xbench torch", 60_000.0, "as-written"), figures("xbench torch+fsdp", 46_000.0)]
    line, passes = fl.ratio_line("torch", minimal, rows, gpu_target=True)
    assert "xbench torch+fsdp / minimal torch fsdp+compile = 0.920" in line and "misses" in line and not passes
    line, passes = fl.ratio_line("torch", minimal, rows, gpu_target=False)  # on a CPU: reported, not judged
    assert "0.920" in line and passes
    line, passes = fl.ratio_line("torch", minimal, [*rows, figures("xbench torch+fsdp", 48_000.0)], True)
    assert "= 0.960 (meets" in line and passes
    line, passes = fl.ratio_line("jax", None, rows, gpu_target=False)
    assert "not measured" in line and not passes


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_cpu_run_prints_the_ratio(framework, tmp_path):
    """One framework a call (about 30 s each on an idle 2-core host): its minimal loop and
    xbench compare's rows, then the ratio line."""
    command = [sys.executable, str(BENCHMARKS / "fsdp_loops.py"), "--platform", "cpu", "--quick", "--no-compile",
               "--frameworks", framework, "--out", str(tmp_path)]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    out = finished.stdout
    ratio = re.search(rf"^ratio {framework}: xbench {framework}\+fsdp / minimal {framework} fsdp = ([0-9.]+) ",
                      out, re.M)
    assert ratio and float(ratio.group(1)) > 0, out[-2000:]
    for program in (f"minimal {framework} fsdp", f"xbench {framework}+fsdp"):
        line = re.search(rf"^{re.escape(program)} +([0-9,]+) tokens/s  MFU +unknown  memory/device +n/a", out,
                         re.M)
        assert line and float(line.group(1).replace(",", "")) > 0, out[-2000:]
    document = json.loads((tmp_path / "fsdp-loops.json").read_text())
    assert not document["failures"]
    minimal = document["minimal"][framework]
    assert minimal["params"] == minimal["params_core"] == 536_064 and minimal["last_loss"] > 0
    assert {r["variant"] for r in document["xbench"]} == {"as-written", "fsdp"}
