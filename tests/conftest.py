from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from xbench import registry

ROOT = Path(__file__).resolve().parent.parent


def entry_point(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=registry.GROUP)


FAKES = [
    entry_point("numpy", "tests.fakes:NumpyBackend"),
    entry_point("numpy-spmd", "tests.fakes:SpmdNumpyBackend"),
    entry_point("missing", "tests.fakes:MissingFrameworkBackend"),
    entry_point("jax-noreduce", "tests.broken_backends:NoAllReduceJax"),
    entry_point("jax-sum", "tests.broken_backends:SummedJax"),
]


@pytest.fixture
def fake_backends(monkeypatch):
    """The installed backends plus test fakes; workers can import `tests.fakes`."""
    installed = registry.list_entry_points()
    monkeypatch.setattr(registry, "list_entry_points", lambda: installed + FAKES)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    registry.refresh()
    yield
    registry.refresh()


@pytest.fixture
def run_cli(capsys):
    """Run `xbench ARGS...` in-process; returns (exit code, stdout, stderr)."""
    from xbench.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


TINY = ("--batch-sizes", "16", "--repeats", "3", "--steps", "2", "--warmup-steps", "0")


@pytest.fixture(scope="session")
def real_run(tmp_path_factory):
    """One small real comparison of tf and jax on 1 and 2 simulated CPU devices, both seed
    models, verification included; (exit code, run directory). Tests must not modify it."""
    from xbench.cli.main import main

    out = tmp_path_factory.mktemp("real") / "run"
    code = main(["compare", "--backends", "tf", "jax", "--model", "medium", "large",
                 "--devices", "1,2", *TINY, "--out", str(out)])
    return code, out
