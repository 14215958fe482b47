"""A plugin that exits, raises or hangs while it is loaded or probed is
listed as unavailable with the reason, and never stops, stalls or breaks the others."""

from __future__ import annotations

import json
import time
from contextlib import nullcontext

import pytest

from tests.conftest import ROOT, entry_point
from xbench.results.records import read_records
from xbench.run import registry

TIMEOUT_S = 2  # XBENCH_PROBE_TIMEOUT_S in these tests; the hangs last an hour
QUICK = ("--model", "medium", "--batch-sizes", "16", "--repeats", "3", "--steps", "2", "--warmup-steps", "0",
         "--devices", "1", "--no-verify")

# name: (entry-point value, the reason `xbench backends` gives, whether loading it warns)
BROKEN = {
    "exits-at-import": ("tests.support.plugin_exits_at_import:Backend", "plugin failed to load: SystemExit: 4", True),
    "hangs-at-import": ("tests.support.plugin_hangs_at_import:Backend",
                        f"plugin did not answer within {TIMEOUT_S} s (import)", True),
    "exits-in-init": ("tests.support.broken_plugins:ExitsInConstructor",
                      "plugin failed to load: SystemExit: constructor said goodbye", True),
    "hangs-in-init": ("tests.support.broken_plugins:HangsInConstructor",
                      f"plugin did not answer within {TIMEOUT_S} s (instantiation)", True),
    "exits-in-probe": ("tests.support.broken_plugins:ExitsInProbe", "probe failed: SystemExit: 3", False),
    "raises-in-probe": ("tests.support.broken_plugins:RaisesInProbe",
                        "probe failed: RuntimeError: probe exploded over two lines", False),
    "hangs-in-probe": ("tests.support.broken_plugins:HangsInProbe",
                       f"plugin did not answer within {TIMEOUT_S} s (probe)", False),
    "junk-probe": ("tests.support.broken_plugins:ProbeReturnsJunk",
                   "probe returned NoneType, not an Availability", False),
}
HEALTHY = entry_point("numpy", "tests.support.fakes:NumpyBackend")


@pytest.fixture
def register(monkeypatch):
    """register(*names): the installed backends, the numpy fake and the named broken plugins,
    loaded with a short timeout."""
    installed = registry.list_entry_points()
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv(registry.TIMEOUT_VARIABLE, str(TIMEOUT_S))

    def register(*names: str) -> None:
        broken = [entry_point(name, BROKEN[name][0]) for name in names]
        monkeypatch.setattr(registry, "list_entry_points", lambda: installed + [HEALTHY] + broken)
        registry.refresh()

    yield register
    registry.refresh()


def warns_if(warns: bool, name: str):
    return pytest.warns(RuntimeWarning, match=f"'{name}'") if warns else nullcontext()


def table_rows(out: str) -> dict[str, list[str]]:
    """The rows of a rich table by their first cell, wrapped cells joined into one line."""
    rows: dict[str, list[str]] = {}
    last = None
    for line in out.splitlines():
        if not line.startswith("│"):
            continue
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if cells[0]:
            last = rows[cells[0]] = cells
        elif last is not None:  # a wrapped row goes on in the next line
            last[:] = [" ".join(filter(None, pair)) for pair in zip(last, cells)]
    return rows


def listed_backends(out: str) -> dict[str, tuple[str, str]]:
    """`xbench backends` by name: (status, everything said of it), from its table, or from its
    blocks where the table would not fit the terminal (name, status and version on one line,
    the rest indented under it)."""
    rows = table_rows(out)
    if rows:
        return {name: (cells[1], " | ".join(cells)) for name, cells in rows.items()}
    found: dict[str, tuple[str, str]] = {}
    name = None
    for line in out.splitlines()[1:]:
        if line and not line.startswith(" "):
            name, status = line.split()[:2]
            found[name] = (status, line)
        elif name is not None:
            found[name] = (found[name][0], found[name][1] + " " + line.strip())
    return found


@pytest.mark.parametrize("name", BROKEN)
def test_backends_lists_a_broken_plugin_as_unavailable_and_the_others_as_usual(register, run_cli, name):
    register(name)
    started = time.monotonic()
    with warns_if(BROKEN[name][2], name):
        code, out, err = run_cli("backends", "--no-devices")
    assert time.monotonic() - started < TIMEOUT_S + 10
    listed = listed_backends(out)
    assert code == 0 and "Traceback" not in out + err
    assert listed[name][0] == "unavailable" and BROKEN[name][1] in listed[name][1]
    assert listed["numpy"][0] == "available" and listed["jax"][0] == "available"


@pytest.mark.parametrize("name", BROKEN)
def test_selecting_a_broken_plugin_is_a_one_line_error(register, run_cli, tmp_path, name):
    register(name)
    with warns_if(BROKEN[name][2], name):
        code, out, err = run_cli("compare", "--backends", name, *QUICK, "--out", str(tmp_path / "run"))
    assert code == 2 and "Traceback" not in out + err
    assert err.strip() == f"error: backend {name!r} cannot run here: {BROKEN[name][1]}"
    assert not (tmp_path / "run").exists()


def test_compare_of_a_healthy_backend_runs_no_other_plugin(register, run_cli, tmp_path, monkeypatch):
    """Every broken plugin registered at once and a long timeout: only a run that never
    loads them finishes this fast (a warning from loading one would fail the test too)."""
    monkeypatch.setenv(registry.TIMEOUT_VARIABLE, "120")
    register(*BROKEN)
    started = time.monotonic()
    code, out, err = run_cli("compare", "--backends", "numpy", *QUICK, "--out", str(tmp_path / "run"))
    assert time.monotonic() - started < 60
    assert code == 0 and "Traceback" not in out + err
    records = read_records(tmp_path / "run")
    assert {r["trial_id"] for r in records} == {"numpy/medium/d1/b16/r0", "numpy/medium/d1/b16/r1"}
    assert all(r["status"] == "ok" for r in records), json.dumps(records)[:500]


def test_all_usable_backends_skip_the_broken_ones_within_one_timeout(register):
    """With no --backends every plugin is loaded, all at once: three hangs cost one timeout."""
    register(*BROKEN)
    started = time.monotonic()
    with pytest.warns(RuntimeWarning) as caught:
        names = [entry.name for entry in registry.resolve([])]
    elapsed = time.monotonic() - started
    assert TIMEOUT_S <= elapsed < 2.5 * TIMEOUT_S
    assert "numpy" in names and "jax" in names and not set(names) & set(BROKEN)
    warned = " ".join(str(w.message) for w in caught)
    assert all(f"'{name}'" in warned for name, (_, _, warns) in BROKEN.items() if warns)


def test_a_plugin_is_loaded_once_and_only_when_asked_for(register):
    register("hangs-in-probe")
    found = registry.discover()
    started = time.monotonic()
    assert "hangs-in-probe" in found and "hangs-in-probe" in list(found)  # names need no loading
    assert registry.resolve(["numpy"])[0].usable
    assert time.monotonic() - started < TIMEOUT_S
    assert not found["hangs-in-probe"].usable  # waits one timeout...
    started = time.monotonic()
    assert not registry.discover()["hangs-in-probe"].usable  # ...once: the entry is cached
    assert time.monotonic() - started < 0.5
    registry.refresh()
    assert registry.discover() is not found


def test_ctrl_c_in_a_plugin_is_not_swallowed(register):
    point = entry_point("interrupts", "tests.support.broken_plugins:InterruptsInProbe")
    with pytest.raises(KeyboardInterrupt):
        registry.load_points([point])


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", "1e30"])
def test_a_bad_timeout_variable_is_a_one_line_error(register, run_cli, monkeypatch, value):
    register()
    monkeypatch.setenv(registry.TIMEOUT_VARIABLE, value)
    code, out, err = run_cli("backends", "--no-devices")
    assert code == 2 and "Traceback" not in out + err
    assert err.strip() == ("error: XBENCH_PROBE_TIMEOUT_S must be a positive number of seconds up to 604800, "
                           f"got {value!r}")
