"""When a gang's workers are let exit on their own (`Gang.let_exit`): only after every member
ran all its trials well. A failed trial may leave ranks in a collective, and a member that
exited or a gang that was ended has nothing to wait for: those are ended at once."""

from __future__ import annotations

import queue
from pathlib import Path

from xbench.run.launcher import Gang


def _gang() -> Gang:
    return Gang([], queue.Queue(), Path("workers.log"), [], [None], 0.0)


def test_a_gang_that_ran_every_trial_well_is_done():
    assert _gang().done_with(["a", "b"], [{"status": "ok"}, {"status": "ok"}])  # type: ignore[list-item]


def test_a_failed_trial_a_missing_one_an_exited_member_or_a_stopped_gang_is_not_done():
    ok = {"status": "ok"}
    assert not _gang().done_with(["a", "b"], [ok, {"status": "failed"}])  # type: ignore[list-item]
    assert not _gang().done_with(["a", "b"], [ok])  # type: ignore[list-item]
    exited, stopped = _gang(), _gang()
    exited.exited.add(0)
    stopped.stopped = True
    assert not exited.done_with(["a"], [ok]) and not stopped.done_with(["a"], [ok])  # type: ignore[list-item]
