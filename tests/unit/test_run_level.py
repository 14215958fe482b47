"""The run-level term of a row's interval: a host-bound row (or any on simulated CPU devices)
carries the spec's run_variation, a row whose step is the device's its device_run_variation,
and a run recorded before that setting existed none (its report does not change)."""

from __future__ import annotations

import pytest

from tests.unit.test_bottom_line import record
from xbench.results.summary import rows_from_records

PROTOCOL = {"run_variation": 0.10, "device_run_variation": 0.002, "interval_target": 0.05}


def _row(protocol=None, simulated=False):
    records = [record("a", 1, 64, r, 1e-3, spread=0.0003) for r in range(3)]
    for rec in records:
        rec["devices"]["simulated"] = simulated
        if protocol is not None:
            rec["trial"]["protocol"] = protocol
    [row] = rows_from_records(records)
    return row


def _half(row) -> float:
    return row.measured.ci_half_width / row.measured.mean


def test_a_device_bound_row_carries_the_device_run_variation():
    older, row = _row(), _row(PROTOCOL)
    assert row.host_bound is None and not row.simulated
    assert older.run_var == 0 and row.run_var == pytest.approx(0.002 ** 2)
    assert _half(older) < 1.96 * 0.002 < _half(row) < 0.01


def test_a_row_on_simulated_devices_carries_the_run_variation():
    assert _row(PROTOCOL, simulated=True).run_var == pytest.approx(0.10 ** 2)
