"""The out-of-tree example plugin (tests/support/plugin_example, docs/writing-a-backend.md), installed
the way a third party's would be: pip installs it into a directory of its own, found through
PYTHONPATH, and xbench discovers it by its entry point, in the CLI process and in workers.
It must be listed as available, pass verify against jax, and time with status ok."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY
from xbench.report.bottom_line import contests
from xbench.results.records import read_records
from xbench.results.summary import full_rows, rows_from_records

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="verify compares against jax"),
]

PLUGIN = ROOT / "tests" / "support" / "plugin_example"
NAME = "numpy-example"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> tuple[dict[str, str], Path]:
    """The environment of an xbench with the plugin installed, and a scratch directory."""
    tmp = tmp_path_factory.mktemp("plugin")
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = shutil.copytree(PLUGIN, tmp / "src", ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                    "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target", str(site), str(source)],
                   check=True, capture_output=True, text=True, timeout=300)
    assert (site / "xbench_numpy_example.py").exists()
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}, tmp


def xbench(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xbench", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_build_leaves_the_sources_clean(plugin_env):
    assert not (PLUGIN / "build").exists()
    assert not list(PLUGIN.glob("*.egg-info"))


def test_listed_as_available(plugin_env):
    env, tmp = plugin_env
    done = xbench(env, tmp, "backends")
    assert done.returncode == 0, done.stderr
    entry = _entry(done.stdout, NAME)
    assert entry, done.stdout
    assert "available" in entry[0].replace("│", " ").split(), entry  # not "unavailable"
    assert "simulated devices" in " ".join(entry)  # a worker process imported it and ran setup


def _entry(listing: str, name: str) -> list[str]:
    """The lines `xbench backends` gives one backend: its table row, or, where the table would
    not fit the terminal, its block (the name's line and the indented lines under it)."""
    lines = listing.splitlines()
    for i, line in enumerate(lines):
        if f" {name} " in line and "│" in line:
            return [line]
        if line.split()[:1] == [name]:
            block = [line]
            for rest in lines[i + 1:]:
                if not rest.startswith(" "):
                    break
                block.append(rest)
            return block
    return []


def test_verify_passes_against_jax(plugin_env):
    env, tmp = plugin_env
    done = xbench(env, tmp, "verify", "--backends", "jax", NAME, "--devices", "2", "--model", "medium")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checks passed" in done.stderr
    rows = [line for line in done.stdout.splitlines() if f"{NAME} d" in line]
    # across backends (gradients, training) on d1, and d2 vs d1, training and replicas on d2
    assert len(rows) == 5, done.stdout
    assert all(line.rstrip(" │").endswith("pass") for line in rows), done.stdout


def test_compare_times_it(plugin_env):
    env, tmp = plugin_env
    out = tmp / "run"
    # Unverified: its verification against jax is test_verify_passes_against_jax's, which the
    # compare would repeat (the same plan and checks).
    done = xbench(env, tmp, "compare", "--backends", NAME, "jax", "--devices", "1,2", "--model", "medium",
                  *TINY, "--no-verify", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    mine = [r for r in read_records(out) if r["trial"]["backend"] == NAME]
    assert sorted(r["trial_id"] for r in mine) == [f"{NAME}/medium/d{d}/b16/r{k}" for d in (1, 2) for k in (0, 1)]
    for record in mine:
        assert record["status"] == "ok", record["reason"]
        assert record["verification"]["status"] == "skipped"
        assert len(record["timing"]["window_s"]) == 3
        assert record["backend"]["weights_hash"] == record["work"]["weights_hash"]
        assert record["backend"]["params"] == record["work"]["params"] == 54_403
        assert record["backend"]["precision"] == {"param_dtype": "float32", "compute_dtype": "float32"}
    # It has no plain program: on 1 device it is ranked against jax's data-parallel program,
    # never against jax's plain one, which is ranked among plain programs.
    rows = rows_from_records(read_records(out))
    for contest in contests(full_rows(rows)):
        assert contest.best.program == contest.rival.program == "data-parallel", contest
    assert {(r.backend, r.program) for r in rows if r.devices == 1} == {(NAME, "data-parallel"), ("jax", "plain"),
                                                                        ("jax", "data-parallel")}
