"""benchmarks/expert_loops.py (and the _expert_*.py modules it is cut into): its lineups and
acceptance checks on synthetic GPU results (the checks only apply on a GPU, where a mistake costs
device time), and a CPU smoke run."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest

from tests.conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"
H100 = "NVIDIA H100 80GB HBM3"


def benchmark_module(name: str):
    """A module of benchmarks/ (they import their neighbours: `_interleave`, `_expert_*`),
    leaving this process's environment as it was (the script sets XLA and NCCL defaults on
    import)."""
    saved = dict(os.environ)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def el():
    """The script as a module: the parent and the acceptance checks."""
    return benchmark_module("expert_loops")


@pytest.fixture(scope="module")
def expert_config(el):
    """Its configurations (MODEL_GROUPS)."""
    return benchmark_module("_expert_config")


@pytest.fixture(scope="module")
def lineups(el):
    """Its lineups of programs."""
    return benchmark_module("_expert_lineups")


def result(framework: str, config, programs: list[tuple[str, str, list[float]]], device: str = H100,
           platform: str = "gpu") -> dict:
    """A child's result record for `programs` (name, kind, per-step seconds of each round),
    the first of them the reference, as time_configuration builds it."""
    from _expert_child import figures
    from _interleave import Runner

    from xbench.results.peaks import peak_for

    model = config.model()
    peak = peak_for(device, config.precision)
    units = config.batch * model.units_per_sample
    runners = {name: Runner(name, lambda steps: None, per_step_s=list(times)) for name, _, times in programs}
    reference = runners[programs[0][0]]
    records = []
    for name, kind, _ in programs:
        record = {"name": name, "kind": kind, "status": "timed", "reason": None, "params": model.params,
                  "first_call_s": 30.0}
        record.update(figures(runners[name], reference, units, model.training_flops_per_sample * config.batch,
                              peak))
        records.append(record)
    return {"kind": "result", "framework": framework, "config": asdict(config), "label": config.label,
            "precision": config.precision, "family": model.family, "unit": model.unit, "units_per_step": units,
            "flops_per_sample": model.training_flops_per_sample, "params_core": model.params, "device": device,
            "platform": platform, "peak": None if peak is None else asdict(peak), "reference": programs[0][0],
            "rounds": 6, "window_s": 0.4, "programs": records}


def rounds(ms: float, spread: float = 0.002) -> list[float]:
    return [ms / 1e3 * (1 + spread * (i % 3 - 1)) for i in range(6)]


def test_gpt2_checks_on_gpu_results(el, expert_config, capsys):
    gpt2 = expert_config.MODEL_GROUPS["gpt2-small"][0]
    results = [
        result("jax", gpt2, [("minimal jax+cudnn", "minimal", rounds(38.0)),
                             ("minimal jax", "minimal", rounds(74.0)),
                             ("jax plain", "xbench", rounds(74.5)), ("jax plain+cudnn", "xbench", rounds(37.6))]),
        result("torch", gpt2, [("minimal torch+compile", "minimal", rounds(37.2)),
                               ("torch plain+compile", "xbench", rounds(46.5))]),
    ]
    requested = {(gpt2, "jax"), (gpt2, "torch")}
    jax_check, torch_check, mfu_check = el.CHECKS[:3]
    jax_outcome = el.evaluate(jax_check, results, requested, gpu=True)
    assert jax_outcome["verdict"] == "meets" and "best xbench (jax plain+cudnn)" in jax_outcome["text"]
    assert jax_outcome["value"]["median"] == pytest.approx(38.0 / 37.6, rel=1e-3)
    assert el.evaluate(torch_check, results, requested, gpu=True)["verdict"] == "misses"
    mfu = el.evaluate(mfu_check, results, requested, gpu=True)
    # 16,384 tokens in 37.6 ms at 875.5 GFLOP per sequence of 1,024, over 989.4 TFLOP/s
    assert mfu["value"]["median"] == pytest.approx(16 * 875_520_000_000 / 0.0376 / 989.4e12, rel=1e-2)
    assert mfu["verdict"] == "meets"
    document = {"results": results}
    assert el.print_checks(document, requested, gpu=True) is False  # torch misses
    out = capsys.readouterr().out
    assert "ResNet-50" not in out  # not asked for: no line
    el.print_configuration(results[0])
    table = capsys.readouterr().out
    assert "reference" in table and "tokens/s" in table and "%" in table


def test_checks_that_were_asked_for_but_not_measured_miss_on_a_gpu(el, expert_config):
    resnet = expert_config.MODEL_GROUPS["resnet50"][0]
    torch_check = next(c for c in el.CHECKS if c.title == "ResNet-50" and c.framework == "torch")
    assert el.evaluate(torch_check, [], {(resnet, "torch")}, gpu=True)["verdict"] == "misses"
    assert el.evaluate(torch_check, [], {(resnet, "jax")}, gpu=True) is None
    cpu = result("torch", resnet, [("minimal torch+channels-last", "minimal", rounds(900.0)),
                                   ("torch plain", "xbench", rounds(950.0))], device="cpu", platform="cpu")
    assert el.evaluate(torch_check, [cpu], {(resnet, "torch")}, gpu=False)["verdict"] == "n/a"


def test_resnet_checks_compare_with_the_fastest_minimal_loop(el, expert_config):
    resnet = expert_config.MODEL_GROUPS["resnet50"][0]
    results = [result("torch", resnet, [("minimal torch+compile+channels-last", "minimal", rounds(50.0)),
                                        ("minimal torch+channels-last", "minimal", rounds(46.0)),
                                        ("torch plain", "xbench", rounds(115.0)),
                                        ("torch plain+channels-last", "xbench", rounds(47.0))])]
    check = next(c for c in el.CHECKS if c.title == "ResNet-50" and c.framework == "torch")
    outcome = el.evaluate(check, results, {(resnet, "torch")}, gpu=True)
    assert "(minimal torch+channels-last)" in outcome["text"] and "(torch plain+channels-last)" in outcome["text"]
    assert outcome["value"]["median"] == pytest.approx(46.0 / 47.0, rel=1e-3) and outcome["verdict"] == "meets"


def test_lineups_keep_a_reference(lineups):
    cpu = lineups.lineup("torch", "transformer", "cpu", {})
    skipped = {e.name: e.skip for e in cpu}
    assert skipped["minimal torch+compile"] and skipped["torch plain+compile"] and not skipped["minimal torch"]
    chosen = lineups.lineup("jax", "transformer", "gpu", {"programs": ["jax plain*"]})
    runs = [e.name for e in chosen if not e.skip]
    assert runs[0] == "minimal jax+cudnn" and "minimal jax" not in runs  # the reference only, of the minimal loops
    assert {"jax plain", "jax plain+cudnn", "jax plain+fused"} <= set(runs)
    assert lineups.selected("jax plain+cudnn", ["cudnn"]) and not lineups.selected("jax plain", ["cudnn"])


@pytest.mark.slow
def test_quick_run_on_a_cpu(tmp_path):
    out = tmp_path / "expert.json"
    command = [sys.executable, str(BENCHMARKS / "expert_loops.py"), "--quick", "--platform", "cpu",
               "--frameworks", "torch", "--models", "transformer-tiny", "medium", "--out", str(out)]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    document = json.loads(out.read_text())
    assert [r["label"] for r in document["results"]] == ["transformer-tiny@8", "medium@128"]
    for r in document["results"]:
        timed = {p["name"]: p for p in r["programs"] if p["status"] == "timed"}
        assert {"minimal torch", "torch plain"} <= set(timed) and r["reference"] == "minimal torch"
        assert all(p["params"] == r["params_core"] for p in timed.values())
        assert timed["torch plain"]["ratio"]["rounds"] == 3
    assert "acceptance" in finished.stdout and document["children"][0]["header"]["platform"] == "cpu"
