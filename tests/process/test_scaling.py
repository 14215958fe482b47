"""Beyond two devices: 4 and 8 simulated CPU devices, 4 processes through the spmd launcher,
and the scaling-curve plot, so that a 4- or 8-GPU run is one command the day it is lent."""

import json

import pytest

from xbench.results.records import read_records
from xbench.results.summary import rows_from_records

FAST = ("--model", "medium", "--repeats", "3", "--steps", "4", "--warmup-steps", "0", "--no-verify")


def test_scaling_curve_over_1_2_4_devices(run_cli, fake_backends, tmp_path):
    from xbench.report.plots import scaling_figure

    code, _, err = run_cli("compare", "--backends", "numpy", *FAST, "--devices", "1,2,4", "--batch-sizes", "16,32",
                           "--out", str(tmp_path / "run"))
    assert code == 0, err
    rows = [r for r in rows_from_records(read_records(tmp_path / "run")) if r.all_reduce]
    lines = {line.get_label(): line for line in scaling_figure(rows, "medium").axes[0].get_lines()}
    assert list(lines["ideal (speedup = devices)"].get_ydata()) == [1, 2, 4]
    for batch in (16, 32):
        mine = {r.devices: r for r in rows if r.global_batch == batch}
        assert list(lines[f"numpy, batch {batch}"].get_xdata()) == [1, 2, 4]
        assert list(lines[f"numpy, batch {batch}"].get_ydata()) == [1.0, mine[2].scaling.speedup,
                                                                    mine[4].scaling.speedup]
    assert (tmp_path / "run" / "scaling-medium.png").read_bytes()[:4] == b"\x89PNG"
    assert "scaling-medium.png" in (tmp_path / "run" / "report.md").read_text()


def test_no_scaling_curve_with_one_multi_device_count(run_cli, fake_backends, tmp_path):
    code, _, _ = run_cli("compare", "--backends", "numpy", *FAST, "--devices", "1,2", "--batch-sizes", "16",
                         "--out", str(tmp_path / "run"))
    assert code == 0 and not (tmp_path / "run" / "scaling-medium.png").exists()


@pytest.mark.slow
def test_verify_on_4_and_8_simulated_devices(run_cli):
    code, out, err = run_cli("verify", "--backends", "jax", "jax-shardmap", "tf", "--devices", "4,8",
                             "--model", "medium")
    assert code == 0, out + err
    assert "d8 vs jax d1" in out and "all" in err and "checks passed" in err


@pytest.mark.slow
def test_verify_with_4_processes(run_cli):
    """jax through jax.distributed and torch DDP, one process per simulated device."""
    code, out, err = run_cli("verify", "--backends", "jax", "torch", "--launcher", "spmd", "--devices", "4",
                             "--model", "medium")
    assert code == 0, out + err
    assert "torch d4 vs torch d1" in " ".join(out.split())


@pytest.mark.slow
def test_allreduce_on_4_and_8_devices(run_cli, tmp_path):
    out = tmp_path / "allreduce.json"
    code, _, err = run_cli("allreduce", "--backends", "jax", "--devices", "4,8", "--sizes", "4KiB",
                           "--json", str(out))
    assert code == 0, err
    results = json.loads(out.read_text())
    assert [(r["devices"], r["status"]) for r in results] == [(4, "ok"), (8, "ok")]
