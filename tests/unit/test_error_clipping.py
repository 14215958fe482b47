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


HUGE = "9" * 50_000 + "x"  # a pasted file, say: invalid for every parser below


def _option_parsers():
    from xbench.cli.diff_cmd import parse_threshold
    from xbench.cli.options import backend_options, integers, p2p_list
    from xbench.cli.recommend_cmd import _batches, _question
    from xbench.results.allreduce import parse_size
    from xbench.run.cluster import expand_nodelist, parse_address

    return {
        "--devices": lambda: integers([HUGE], "--devices"),
        "--option": lambda: backend_options([HUGE]),
        "--p2p": lambda: p2p_list([HUGE]),
        "--threshold": lambda: parse_threshold(HUGE),
        "recommend --global-batch": lambda: _batches(["64", HUGE]),
        "recommend --model": lambda: _question(HUGE, None, None, "mlp", ["64"], None),
        "--sizes": lambda: parse_size(HUGE),
        "--coordinator": lambda: parse_address(HUGE),
        "SLURM_NODELIST": lambda: expand_nodelist(f"node[{HUGE}]"),
    }


@pytest.mark.parametrize("option", list(_option_parsers()))
def test_every_parser_echoes_a_huge_value_clipped(option):
    with pytest.raises(Exception) as err:
        _option_parsers()[option]()
    message = str(err.value)
    assert len(message) < 500 and "\n" not in message and "..." in message, message[:600]


@pytest.mark.parametrize("family, hint", [("mlp", "`xbench sweep`"),
                                          ("cnn", "`xbench sweep --model <cnn presets>`")])
def test_the_no_fit_hint_is_a_command_that_measures_one(family, hint):
    from pathlib import Path

    from xbench.cli.recommend_cmd import Question, _no_fit_message

    message = _no_fit_message(Question(1e6, None, family, (64,), 0), [Path("results")])
    assert message == f"no stored fit for the {family} family (looked in results); measure one with {hint}"
