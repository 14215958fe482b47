"""The fast tier (`make check`): a unit test starts no process and imports no framework, so
that the tier stays seconds long on any machine. A test that needs either belongs in
tests/process or tests/backends."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

FRAMEWORKS = frozenset({"jax", "tensorflow", "torch", "flax", "optax", "keras"})


def _refuse(*args, **kwargs):
    raise AssertionError("a unit test starts no process: move it to tests/process")


@pytest.fixture(autouse=True)
def no_process_and_no_framework(monkeypatch):
    before = FRAMEWORKS & sys.modules.keys()
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
    monkeypatch.setattr(os, "fork", _refuse)
    monkeypatch.setattr(os, "posix_spawn", _refuse, raising=False)
    yield
    imported = (FRAMEWORKS & sys.modules.keys()) - before
    assert not imported, f"a unit test imports no framework ({', '.join(sorted(imported))}): move it to tests/backends"
