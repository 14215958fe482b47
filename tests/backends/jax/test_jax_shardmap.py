"""The `jax-shardmap` and `jax-auto` backends: plugin hygiene, verification through the CLI
(and a variant with shard_map's N x gradient that must fail it), and a small compare with --breakdown."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TINY, entry_point
from xbench.results.records import read_records
from xbench.run import registry

OURS = [
    entry_point("jax-shardmap", "xbench_backends.jax.shardmap:JaxShardMapBackend"),
    entry_point("jax-auto", "xbench_backends.jax.shardmap:JaxAutoBackend"),
    entry_point("jax-shardmap-nocast", "tests.support.broken_shardmap:UncastShardMap"),
]


@pytest.fixture
def shardmap_backends(monkeypatch):
    """The installed backends plus the broken variant, as conftest's `fake_backends` does.
    Ours are added only where discovery misses them (a stale xbench.egg-info in the checkout
    shadows the installed entry points when Python runs from the repo root); a name listed
    twice would warn, and warnings are errors here."""
    installed = registry.list_entry_points()
    known = {point.name for point in installed}
    extra = [point for point in OURS if point.name not in known]
    monkeypatch.setattr(registry, "list_entry_points", lambda: installed + extra)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    registry.refresh()
    yield
    registry.refresh()


def test_module_imports_without_its_framework():
    code = ("import sys, xbench_backends.jax.shardmap, tests.support.broken_shardmap\n"
            "print(sorted(m for m in ('jax', 'jaxlib', 'flax', 'optax') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_plugin_attributes():
    from xbench_backends.jax.shardmap import JaxAutoBackend, JaxShardMapBackend

    for cls, name in ((JaxShardMapBackend, "jax-shardmap"), (JaxAutoBackend, "jax-auto")):
        backend = cls()
        assert backend.name == name and cls.launchers == ("subprocess",)
        assert backend.install_hint == "pip install 'xbench[jax]'"
        assert backend.probe().installed  # jax, flax and optax are in the test environment
        for capability in ("gradients", "train", "replica_weights", "allreduce_prepare", "allreduce_run",
                           "memory_peak_bytes"):
            assert callable(getattr(backend, capability))


def _failed_checks(out: str) -> set[str]:
    return {line.split("│")[1].strip() for line in out.splitlines() if "FAIL" in line}


@pytest.mark.slow
def test_verify_passes_against_pmap(shardmap_backends, run_cli):
    code, out, err = run_cli("verify", "--backends", "jax", "jax-shardmap", "jax-auto", "--devices", "2",
                             "--model", "medium")
    assert code == 0, out + err
    flat = " ".join(out.split())
    for subject in ("medium: jax-shardmap d2 vs jax-shardmap d1", "medium: jax-auto d2 vs jax-auto d1",
                    "medium: jax-shardmap d1 vs jax d1", "medium: jax-auto d2 vs jax d1",
                    "medium: jax-shardmap d2: replicas 1.. vs 0", "medium: jax-auto d2: replicas 1.. vs 0"):
        assert subject in flat
    assert not _failed_checks(out) and "checks passed" in err


@pytest.mark.slow
def test_grad_without_pcast_fails_verification(shardmap_backends, run_cli):
    # Without the pcast, shard_map sums the gradient of replicated params: a 2x gradient.
    # Adam's steps are nearly scale-free, so only the gradient check sees it; the replicas
    # still agree (every device applies the same wrong gradient).
    code, out, err = run_cli("verify", "--backends", "jax-shardmap-nocast", "--devices", "2", "--model", "medium")
    assert code == 1
    assert _failed_checks(out) == {"gradients: N devices = 1 device"}, out


@pytest.mark.slow
def test_compare_with_breakdown(shardmap_backends, run_cli, tmp_path):
    # Unverified: test_verify_passes_against_pmap verifies both programs (against jax's too),
    # which the compare would repeat.
    args = ("compare", "--backends", "jax-shardmap", "jax-auto", "--devices", "1,2", "--model", "medium", *TINY,
            "--out", str(tmp_path / "run"), "--breakdown", "--no-verify")
    code, _, err = run_cli(*args)
    assert code == 0, err  # an unsupported compute-only twin is not a failure
    records = {r["trial_id"]: r for r in read_records(tmp_path / "run")}
    twins = [f"jax-auto/medium/d2/b16/compute-only/r{k}" for k in (0, 1)]
    assert sorted(records) == sorted(
        [f"{b}/medium/d{d}/b16/r{k}" for b in ("jax-shardmap", "jax-auto") for d in (1, 2) for k in (0, 1)]
        + [f"jax-shardmap/medium/d2/b16/compute-only/r{k}" for k in (0, 1)] + twins)
    assert all(r["status"] == "ok" for tid, r in records.items() if tid not in twins), records
    for twin in twins:
        assert records[twin]["status"] == "unsupported" and "inserts the gradient all-reduce" in records[twin]["reason"]
    assert {r["verification"]["status"] for r in records.values()} == {"skipped"}
    for record in records.values():
        if record["status"] == "ok":
            assert record["backend"]["weights_hash"] == record["work"]["weights_hash"]
            assert record["backend"]["params"] == record["work"]["params"] == 54_403
            assert record["backend"]["precision"]["jax_default_matmul_precision"] == "float32"
    allreduce = [json.loads(line) for line in (tmp_path / "run" / "allreduce.jsonl").read_text().splitlines()]
    assert {(r["backend"], r["status"]) for r in allreduce} == {("jax-shardmap", "ok"), ("jax-auto", "ok")}
