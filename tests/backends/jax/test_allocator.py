"""How the jax backends set XLA's GPU allocator before its client starts: as needed, up to
95 % of a GPU, a user's own settings kept; a verification worker's share of a shared GPU caps
it, under the variable's name the user chose (jax refuses both names at once)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("jax")

from xbench.contract import MEMORY_SHARE_VARIABLE  # noqa: E402
from xbench_backends.jax.pmap import allocate_as_needed, allocator_settings  # noqa: E402

NEW, OLD = "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"


@pytest.mark.parametrize("given, expected", [
    ({}, {OLD: "0.95"}),
    ({OLD: "0.5"}, {OLD: "0.5"}),
    ({NEW: "0.6"}, {NEW: "0.6"}),
    ({MEMORY_SHARE_VARIABLE: "0.3"}, {OLD: "0.3000"}),
    ({MEMORY_SHARE_VARIABLE: "0.3", OLD: "0.9"}, {OLD: "0.3000"}),
    ({MEMORY_SHARE_VARIABLE: "0.3", NEW: "0.9"}, {NEW: "0.3000"}),
])
def test_the_allocator_is_capped_by_a_share_or_the_users_setting(monkeypatch, given, expected):
    monkeypatch.setattr(os, "environ", dict(given))  # allocate_as_needed writes to it
    allocate_as_needed()
    settings = allocator_settings()
    assert settings == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", **expected}
