"""One vocabulary for batches: --global-batch is split across the devices (strong scaling),
--per-device-batch is what each device gets (weak scaling); the old --batch-sizes keeps its
meaning, and a contradiction is one line that says what to give instead."""

from __future__ import annotations

import pytest

from xbench.cli.compare_cmd import batch_overrides
from xbench.errors import XbenchError


def test_the_name_says_the_scaling():
    assert batch_overrides(["64", "256"], None, None, None) == {"batch_sizes": [64, 256], "scaling": "strong"}
    assert batch_overrides(None, ["64"], None, None) == {"batch_sizes": [64], "scaling": "weak"}


def test_the_old_name_keeps_its_meaning_and_the_spec_keeps_its_batches():
    assert batch_overrides(None, None, ["32,128"], "weak") == {"batch_sizes": [32, 128], "scaling": "weak"}
    assert batch_overrides(None, None, None, None) == {"batch_sizes": None, "scaling": None}


@pytest.mark.parametrize("given, match", [
    ((["64"], ["64"], None, None), "give one of --global-batch and --per-device-batch"),
    ((["64"], None, None, "weak"), "--global-batch means strong scaling"),
    ((None, ["64"], None, "strong"), "--per-device-batch means weak scaling"),
])
def test_a_contradiction_says_what_to_give(given, match):
    with pytest.raises(XbenchError, match=match):
        batch_overrides(*given)
