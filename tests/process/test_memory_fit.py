"""A configuration that does not fit in device memory is a row that says so, never a crash of
the run: held back by the estimate before launching (XBENCH_DEVICE_MEMORY_GIB pretends the
simulated devices have that much), or turned from the framework's out-of-memory error."""

from __future__ import annotations

from tests.conftest import FAST
from tests.process.test_compare_cli import records_of
from xbench.run.memory_check import MEMORY_VARIABLE


def test_a_configuration_the_estimate_says_cannot_fit_is_skipped_and_the_rest_measured(
        fake_backends, run_cli, tmp_path, monkeypatch):
    # medium at global batch 1024: ~4.5 MB per device on 1 device, ~2.6 MB on 2; 3.2 MB here.
    monkeypatch.setenv(MEMORY_VARIABLE, "0.003")
    code, out, err = run_cli("compare", "--backends", "numpy", *FAST, "--batch-sizes", "16,1024",
                             "--devices", "1,2", "--out", str(tmp_path / "run"))
    assert code == 0, err
    records = records_of(tmp_path / "run")
    held = [records[f"numpy/medium/d1/b1024/r{r}"] for r in (0, 1)]
    assert all(r["status"] == "skipped" and r["devices"] is None for r in held)  # no worker started
    assert held[0]["reason"].startswith("does not fit: needs ~0.00423 GiB per device, has 0.003 GiB (estimated")
    assert held[0]["memory"] == {"estimate_bytes": 4539940, "capacity_bytes": 3221225, "sharded": False}
    others = [r for trial_id, r in records.items() if "/d1/b1024/" not in trial_id]
    assert len(others) == 6 and all(r["status"] == "ok" for r in others)
    assert records["numpy/medium/d2/b1024/r0"]["memory"]["estimate_bytes"] == 2596388
    text = " ".join(out.split())
    assert "does not fit" in text and "numpy/medium/d1/b1024: does not fit: needs ~0.00423 GiB per device" in text
    assert "Did not fit in device memory: numpy on 1 device at batch 1,024 (needs ~0.00423 GiB per device, " \
           "has 0.003 GiB). Fit: numpy (3 of 4 configurations); the fastest of them is numpy on" in text


def test_a_framework_out_of_memory_error_is_a_does_not_fit_row_and_the_run_exits_0(
        fake_backends, run_cli, tmp_path, monkeypatch):
    monkeypatch.delenv(MEMORY_VARIABLE, raising=False)
    code, out, err = run_cli("compare", "--backends", "numpy", *FAST, "--batch-sizes", "16,32", "--devices", "1",
                             "--option", "numpy.oom_batch=32", "--out", str(tmp_path / "run"))
    assert code == 0, err
    records = records_of(tmp_path / "run")
    oom = records["numpy/medium/d1/b32/r0"]
    assert oom["status"] == "skipped"
    assert oom["reason"] == ("does not fit: out of memory at batch 32 per device on 1 device(s) (measured): "
                             "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (planned)")
    assert oom["memory"]["capacity_bytes"] is None  # simulated devices: not checked before launching
    assert records["numpy/medium/d1/b16/r0"]["status"] == "ok"
    assert "Did not fit in device memory: numpy on 1 device at batch 32 (out of memory at batch 32 per device " \
           "on 1 device(s)). Fit: numpy (1 of 2 configurations)" in " ".join(out.split())


def test_out_of_memory_after_other_trials_in_a_process_is_run_again_in_a_fresh_one(
        fake_backends, run_cli, tmp_path, monkeypatch):
    """A framework's allocator may keep what earlier trials of its process freed, in pieces
    (XLA's does): an out-of-memory error there says nothing of the trial, which runs again
    first in a fresh process and is measured there."""
    monkeypatch.delenv(MEMORY_VARIABLE, raising=False)
    code, out, err = run_cli("compare", "--backends", "numpy", *FAST, "--batch-sizes", "16,32,64", "--devices", "1",
                             "--option", "numpy.oom_batch_after_others=32", "--order-seed", "1",
                             "--out", str(tmp_path / "run"))
    assert code == 0, err
    records = records_of(tmp_path / "run")
    assert len(records) == 6 and all(r["status"] == "ok" for r in records.values())
    log = (tmp_path / "run" / "workers.log").read_text()
    assert "numpy/medium/d1/b32/r" in log and "out of memory after" in log and "run again in a fresh one" in log
    retried = [r for trial_id, r in records.items() if "/b32/" in trial_id]
    others = {r["process"]["pid"] for trial_id, r in records.items() if "/b32/" not in trial_id}
    assert any(r["process"]["pid"] not in others for r in retried)
