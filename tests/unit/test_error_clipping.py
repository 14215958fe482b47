"""Errors that echo a value clip it: a damaged spec file may hold anything."""

from __future__ import annotations

import pytest

from xbench.errors import SpecError
from xbench.experiment import build_spec


@pytest.mark.parametrize("raw", [
    {"devices": list(range(1, 100_001))},  # 689,030 characters echoed whole before
    {"devices": [1, "x" * 100_000]},
    {"models": [{"preset": "m" * 100_000}]},
])
def test_a_huge_value_is_echoed_in_a_line_a_reader_can_read(raw):
    with pytest.raises(SpecError) as err:
        build_spec(raw)
    message = str(err.value)
    assert len(message) < 400 and "\n" not in message, message[:500]
