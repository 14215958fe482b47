from __future__ import annotations

import contextlib
import io
import os

import pytest


def captured_main(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run `xbench ARGS...` in-process as the `run_cli` fixture does, for fixtures wider than
    one test (capsys is a test's own): (exit code, stdout, stderr), with `env` set meanwhile."""
    from xbench.cli.main import main

    saved = {name: os.environ.get(name) for name in env or {}}
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.update(env or {})
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="session")
def transformer_variants_verified(tmp_path_factory):
    """One `xbench verify` of jax and torch with their remat, fsdp and fsdp-remat variants, transformer-tiny
    on 1 and 2 devices: (exit code, stdout, stderr), made once for every module and worker that
    asks. The variants share the programs they are checked against (each backend's own on 1 and
    2 devices and its float64 referee), which separate verifies would run once each."""
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    from tests.support.shared import once_per_session

    def make(_directory) -> list:
        return list(captured_main(
            "verify", "--backends", "jax", "torch",
            "--variants", "jax:remat", "torch:remat", "jax:fsdp", "torch:fsdp", "jax:fsdp-remat", "torch:fsdp-remat",
            "--single-device", "data-parallel", "--model", "transformer-tiny", "--devices", "2",
            env={"COLUMNS": "240"}))  # one line per check: no subject wrapped inside its cell

    return tuple(once_per_session(tmp_path_factory, "transformer_variants_verified", make))
