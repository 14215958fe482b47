"""The bytes a step moves between devices (`xbench.models.traffic`): the replicated program's
gradient all-reduce, the sharded program's all-gathers and reduce-scatter, in nccl-tests' sizes."""

from __future__ import annotations

import pytest

from xbench.models.traffic import StepTraffic, step_traffic

GPT2_XL = 1_557_611_200


def test_one_device_moves_nothing():
    assert step_traffic(GPT2_XL, "bf16", sharded=True, devices=1) == StepTraffic()
    assert step_traffic(GPT2_XL, "fp32", sharded=False, devices=1) == StepTraffic()


def test_a_replicated_step_all_reduces_its_float32_gradients_whatever_the_compute_dtype():
    for precision in ("fp32", "tf32", "bf16"):
        assert step_traffic(1000, precision, sharded=False, devices=2) == StepTraffic(all_reduce=4000)
    assert step_traffic(1000, "fp64", sharded=False, devices=2) == StepTraffic(all_reduce=8000)


def test_a_sharded_step_gathers_twice_in_the_compute_dtype_and_reduce_scatters_float32_gradients():
    bf16 = step_traffic(GPT2_XL, "bf16", sharded=True, devices=2)
    assert bf16 == StepTraffic(all_gather=2 * 2 * GPT2_XL, reduce_scatter=4 * GPT2_XL, gathers=2)
    fp32 = step_traffic(1000, "fp32", sharded=True, devices=4, gathers=1)  # kept from forward to backward
    assert (fp32.all_gather, fp32.reduce_scatter, fp32.all_reduce) == (4000, 4000, 0)


def test_an_unknown_precision_is_named():
    with pytest.raises(ValueError, match="unknown precision 'int8'"):
        step_traffic(10, "int8", sharded=True, devices=2)


def test_the_breakdown_says_what_each_program_moves_a_step():
    from dataclasses import replace

    from tests.unit.test_bottom_line import record
    from xbench.report.terminal import traffic_cell
    from xbench.report.words import TRAFFIC_NOTE
    from xbench.results.summary import rows_from_records

    sharded = {"estimate_bytes": 2**30, "capacity_bytes": None, "sharded": True}
    records = [record("fast", 2, 64, r, 0.01) for r in range(2)]
    records += [{**record("slow", 2, 64, r, 0.01), "memory": sharded} for r in range(2)]
    by_backend = {row.backend: replace(row, params=2**20, precision="bf16") for row in rows_from_records(records)}
    assert not by_backend["fast"].sharded and by_backend["slow"].sharded
    assert traffic_cell(by_backend["fast"]) == "AR 4 MiB"  # float32 gradients
    assert traffic_cell(by_backend["slow"]) == "AG 2×2 MiB + RS 4 MiB"  # bf16 parameters, float32 gradients
    assert traffic_cell(replace(by_backend["slow"], devices=1)) == ""
    assert "AG, the parameters all-gathered" in TRAFFIC_NOTE
