"""All-gather and reduce-scatter beside all-reduce (`xbench allreduce --collectives`): nccl-tests'
size, count and busbw arithmetic, the records that name their collective, and the lines and
tables that say which collective each block is."""

from __future__ import annotations

import pytest

from xbench import stats
from xbench.cli.allreduce_cmd import _nccl_line, allreduce_table, collective_names, nccl_tests_text
from xbench.contract import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from xbench.errors import XbenchError
from xbench.results.allreduce import AllReduceResult, bus_factor, collective_size, element_count, result_from_record
from xbench.results.records import AllReduceRecord
from xbench.results.validation import _allreduce_problem
from xbench.wire import AllReduce, Job, WireError, decode_event


def _record(collective: str, nbytes: int = 2**20, devices: int = 4, window_s: float = 0.001) -> AllReduceRecord:
    timing = {"first_call_s": 0.1, "window_s": [window_s] * 8, "steps_per_window": 10, "stopped": "repeats"}
    return {"kind": "allreduce", "backend": "jax", "devices": devices, "platform": "simulated CPU", "nbytes": nbytes,
            "status": "ok", "reason": None, "timing": timing, "environment": {}, "collective": collective}


@pytest.mark.parametrize(("devices", "all_reduce", "half"), [(1, 0.0, 0.0), (2, 1.0, 0.5), (4, 1.5, 0.75),
                                                             (8, 1.75, 0.875)])
def test_busbw_factors_are_nccl_tests(devices, all_reduce, half):
    assert bus_factor(devices) == bus_factor(devices, ALL_REDUCE) == all_reduce
    assert bus_factor(devices, ALL_GATHER) == bus_factor(devices, REDUCE_SCATTER) == half


def test_busbw_of_a_result_divides_the_whole_buffer_by_the_time():
    time = stats.describe([1e-3] * 4)
    for collective, factor in ((ALL_REDUCE, 1.5), (ALL_GATHER, 0.75), (REDUCE_SCATTER, 0.75)):
        result = AllReduceResult("jax", 4, 2**30, time, collective=collective)
        assert result.algbw == pytest.approx(2**30 / 1e-3)
        assert result.busbw == pytest.approx(2**30 / 1e-3 * factor)


def test_a_record_keeps_its_collective_and_an_old_one_is_an_all_reduce():
    assert result_from_record(_record(REDUCE_SCATTER)).collective == REDUCE_SCATTER
    old = _record(ALL_REDUCE)
    del old["collective"]
    assert result_from_record(old).collective == ALL_REDUCE
    # one op per 1e-4 s: 1 MiB / 1e-4 s = 10.49 GB/s algbw; × 3/4 on 4 devices
    assert result_from_record(_record(ALL_GATHER)).busbw == pytest.approx(2**20 / 1e-4 * 0.75)


def test_sizes_fall_to_whole_elements_per_device():
    assert collective_size(ALL_REDUCE, 217_612, 4) == 217_612  # all-reduce: as asked
    assert collective_size(ALL_GATHER, 217_612, 4) == 217_600  # 13,600 float32 per device
    assert collective_size(REDUCE_SCATTER, 4096, 3) == 4092
    assert collective_size(ALL_GATHER, 4, 8) == 32  # at least one element each


def test_count_is_the_buffer_for_all_reduce_and_the_share_for_the_others():
    assert element_count(ALL_REDUCE, 2**20, 4) == 2**18
    assert element_count(ALL_GATHER, 2**20, 4) == element_count(REDUCE_SCATTER, 2**20, 4) == 2**16


def test_nccl_lines_carry_each_collective_s_count_and_redop():
    fields = {c: _nccl_line(_record(c)).splitlines()[0].split() for c in (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER)}
    assert fields[ALL_REDUCE][:5] == ["1048576", "262144", "float", "sum", "-1"]
    assert fields[ALL_GATHER][:5] == ["1048576", "65536", "float", "none", "-1"]
    assert fields[REDUCE_SCATTER][:5] == ["1048576", "65536", "float", "sum", "-1"]
    # awk '{print $7, $8}': algbw, busbw
    assert fields[ALL_REDUCE][6:8] == ["10.49", "15.73"] and fields[ALL_GATHER][6:8] == ["10.49", "7.86"]


def test_the_text_names_the_collective_of_each_block_and_only_all_reduce_stays_as_it_was():
    only = nccl_tests_text([_record(ALL_REDUCE)], {}, {}, {})
    assert "all_reduce_perf columns" in only and "all-gather" not in only and "# all-reduce:" not in only
    mixed = nccl_tests_text([_record(ALL_REDUCE), _record(ALL_GATHER), _record(REDUCE_SCATTER)], {}, {}, {})
    heads = [line for line in mixed.splitlines() if line.endswith(("= algbw * 1.5", "= algbw * 0.75"))]
    assert heads == ["# all-reduce: all_reduce_perf's columns, busbw = algbw * 2(n-1)/n = algbw * 1.5",
                     "# all-gather: all_gather_perf's columns, busbw = algbw * (n-1)/n = algbw * 0.75",
                     "# reduce-scatter: reduce_scatter_perf's columns, busbw = algbw * (n-1)/n = algbw * 0.75"]
    assert mixed.count("# Avg bus bandwidth") == 3


def test_a_table_is_titled_by_its_collective():
    assert str(allreduce_table([_record(REDUCE_SCATTER)]).title).startswith("reduce-scatter (float32 SUM")
    table = allreduce_table([_record(ALL_GATHER)])
    assert str(table.title).startswith("all-gather (float32,") and "(n−1)/n" in str(table.caption)


def test_collective_names_are_checked_once_each_in_order():
    assert collective_names(None) == [ALL_REDUCE]
    assert collective_names(["reducescatter,allreduce", "reducescatter"]) == [REDUCE_SCATTER, ALL_REDUCE]
    with pytest.raises(XbenchError, match="unknown collective 'alltoall'; known: allreduce, allgather, reducescatter"):
        collective_names(["allgather", "alltoall"])


def test_an_unknown_collective_is_one_line_and_exit_2(run_cli):
    code, out, err = run_cli("allreduce", "--backends", "numpy", "--collectives", "allgather", "broadcast")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and out == "" and len(errors) == 1 and "'broadcast'" in errors[0], err


def test_the_wire_carries_each_size_s_collective():
    job = Job("m:B", 2, "cpu", mode="allreduce", sizes=(4096, 4096), collectives=(ALL_REDUCE, ALL_GATHER))
    assert Job.from_json(job.to_json()).collective_sizes() == [(ALL_REDUCE, 4096), (ALL_GATHER, 4096)]
    assert Job("m:B", 2, "cpu", mode="allreduce", sizes=(8,)).collective_sizes() == [(ALL_REDUCE, 8)]
    with pytest.raises(WireError, match="1 collectives for 2 sizes"):
        Job("m:B", 2, "cpu", mode="allreduce", sizes=(4, 8), collectives=(ALL_GATHER,))
    event = decode_event(AllReduce(4096, "ok", timing={}, collective=REDUCE_SCATTER).to_json())
    assert isinstance(event, AllReduce) and event.collective == REDUCE_SCATTER


def test_a_stored_record_with_an_unknown_collective_is_named():
    assert _allreduce_problem(_record(ALL_GATHER)) is None
    assert _allreduce_problem({**_record(ALL_GATHER), "collective": "gossip"}) == "has collective 'gossip'"
