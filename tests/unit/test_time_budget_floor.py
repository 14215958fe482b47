"""The default time budget on a slower machine: where the planned replicates
use up most of it, the adaptive rounds still get as long as they took; a budget the user gave
is kept."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.unit.test_estimate import COSTS, spec
from xbench.contract.timing import DEFAULT_ADAPTIVE_FLOOR, TimingProtocol
from xbench.experiment.spec import TIME_BUDGET_VARIABLE, resolve_protocol
from xbench.run import estimate as est
from xbench.run.adaptive import Budget
from xbench.run.plan import Lineup


def test_the_rounds_get_as_long_as_the_planned_replicates_took():
    budget = Budget(120.0)
    budget.charge(100.0, 10)  # a slow machine: the planned replicates took 100 of the 120 s
    assert not budget.affords(3)
    budget.at_least(1.0)
    assert budget.seconds == 200.0 and budget.affords(10) and not budget.affords(11)


def test_a_quick_machine_keeps_its_budget():
    budget = Budget(120.0)
    budget.charge(40.0, 10)
    budget.at_least(1.0)
    assert budget.seconds == 120.0
    budget.at_least(0.0)
    assert budget.seconds == 120.0


@pytest.mark.parametrize("given, variable, floor", [
    (None, None, DEFAULT_ADAPTIVE_FLOOR),  # the platform's default budget: it follows the machine's speed
    (60.0, None, 0.0),                     # --time-budget or the spec: kept as given
    (None, "30", 0.0),                     # $XBENCH_TIME_BUDGET_S: kept as given
])
def test_only_the_default_budget_stretches(given, variable, floor, monkeypatch):
    monkeypatch.delenv(TIME_BUDGET_VARIABLE, raising=False)
    if variable is not None:
        monkeypatch.setenv(TIME_BUDGET_VARIABLE, variable)
    resolved = resolve_protocol(TimingProtocol(time_budget_s=given), gpu=False, order_seed=1)
    assert resolved.adaptive_floor == floor


def test_the_plan_says_when_the_rounds_outlast_the_budget():
    slow = spec(time_budget_s=1.0)
    slow = replace(slow, protocol=replace(slow.protocol, adaptive_floor=1.0))
    found = est.estimate(slow, ["jax"], {"jax": Lineup()}, {"jax": "subprocess"}, COSTS, "cpu")
    assert found.timing_max_s == pytest.approx(2 * found.timing_s)
    assert "adaptive rounds for up to as long again" in est.plan_lines(found, 2)[0]
