"""Work made once per test session (tests/support/shared.py): made once, read back by later
askers, and a failed attempt leaves nothing that trips the next."""

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
