"""Work made once per test session (tests/support/shared.py): made once, read back by later
askers, a failed attempt leaves nothing that trips the next, and the wait for another worker
is bounded."""

import fcntl

import pytest

from tests.support.shared import once_per_session, shared_directory


def test_made_once_then_read_back_and_a_failed_attempt_is_made_again(tmp_path_factory):
    made = []

    def fails(directory):
        (directory / "half").write_text("left by an attempt that raised")
        raise RuntimeError("no")

    def works(directory):
        assert not (directory / "half").exists()  # the failed attempt's files are gone
        made.append(directory)
        return {"code": 0}

    with pytest.raises(RuntimeError):
        once_per_session(tmp_path_factory, "unit-once", fails)
    assert once_per_session(tmp_path_factory, "unit-once", works) == {"code": 0}
    assert once_per_session(tmp_path_factory, "unit-once", works) == {"code": 0}
    assert made == [shared_directory(tmp_path_factory, "unit-once")]


def test_a_worker_waits_for_another_holding_the_work_only_so_long(tmp_path_factory):
    directory = shared_directory(tmp_path_factory, "unit-held")
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / "unit-held.lock", "w") as held:  # another worker, stuck in its make
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(TimeoutError, match="held 'unit-held' for over 0.5 s"):
            once_per_session(tmp_path_factory, "unit-held", lambda _: 0, wait_s=0.5)
