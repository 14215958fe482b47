"""`steady_cpu_scheduler`: jax's CPU workers turn XLA's concurrency-optimized scheduler off,
keeping any other flag, and a user's own setting of it wins."""

from __future__ import annotations

import os

import pytest

from xbench_backends.jax.steps import steady_cpu_scheduler

OFF = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


@pytest.mark.parametrize(("before", "after"), [
    (None, OFF),
    ("", OFF),
    ("--xla_dump_to=/tmp/x", f"--xla_dump_to=/tmp/x {OFF}"),
    ("--xla_cpu_enable_concurrency_optimized_scheduler=true", "--xla_cpu_enable_concurrency_optimized_scheduler=true"),
    (OFF, OFF),
    ("--xla_cpu_enable_concurrency_optimized_scheduler", "--xla_cpu_enable_concurrency_optimized_scheduler"),
    ("--xla_dump_to=/tmp/xla_cpu_enable_concurrency_optimized_scheduler",
     f"--xla_dump_to=/tmp/xla_cpu_enable_concurrency_optimized_scheduler {OFF}"),
])
def test_flag_added_unless_set(monkeypatch, before, after):
    if before is None:
        monkeypatch.delenv("XLA_FLAGS", raising=False)
    else:
        monkeypatch.setenv("XLA_FLAGS", before)
    steady_cpu_scheduler()
    assert os.environ["XLA_FLAGS"] == after
