"""A directory that already holds a run names the command that finishes it."""

from __future__ import annotations

import json

import pytest

from xbench.errors import XbenchError
from xbench.run.rundir import check_new_run_dir


@pytest.mark.parametrize(("started", "finishes"), [
    ("xbench sweep --backends jax --out d", "xbench sweep --resume"),
    ("xbench compare --backends jax", "xbench compare --resume"),
    (None, "xbench compare --resume"),  # a run.json that does not say
])
def test_the_error_names_the_command_that_started_the_run(tmp_path, started, finishes):
    (tmp_path / "run.json").write_text(json.dumps({} if started is None else {"command": started}))
    with pytest.raises(XbenchError, match="already holds a run") as raised:
        check_new_run_dir(tmp_path)
    assert f"`{finishes} {tmp_path}`" in str(raised.value)


def test_an_empty_directory_is_new(tmp_path):
    check_new_run_dir(tmp_path)
