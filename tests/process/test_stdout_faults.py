"""A closed, full or non-UTF-8 standard output costs one line of error and a
non-zero exit, never a traceback, and never the run's records or report."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.process.test_compare_cli import FAST

# xbench with the numpy fake backend registered, as a user would start it.
SCRIPT = (
    "import sys\n"
    "from importlib.metadata import EntryPoint\n"
    "from xbench.run import registry\n"
    "registry.list_entry_points = lambda: [\n"
    "    EntryPoint('numpy', 'tests.support.fakes:NumpyBackend', registry.GROUP)]\n"
    "from xbench.cli.main import run\n"
    "run()\n"
)


def xbench(*args: str, stdout, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def assert_one_line(result: subprocess.CompletedProcess, needle: str) -> None:
    """Exit 3 and one error line, last (a run's progress lines on stderr come before it)."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
    assert len(errors) == 1 and needle in errors[0] and "standard output" in errors[0], result.stderr
    assert result.stderr.strip().splitlines()[-1] == errors[0]


def test_a_closed_stdout_is_one_line():
    # The shell closes fd 1 before Python starts (`xbench models >&-`); a preexec_fn would
    # fork this process, in which jax may already run threads.
    result = subprocess.run(["sh", "-c", 'exec "$0" -m xbench models >&-', sys.executable],
                            stderr=subprocess.PIPE, text=True, timeout=60)
    assert_one_line(result, "closed")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_stdout_is_one_line_and_the_run_keeps_its_report(tmp_path):
    with open("/dev/full", "w") as full:
        result = xbench("compare", "--backends", "numpy", *FAST, "--batch-sizes", "16", "--devices", "1",
                        "--out", str(tmp_path / "run"), stdout=full)
    assert_one_line(result, "No space left on device")
    assert (tmp_path / "run" / "records.jsonl").exists() and (tmp_path / "run" / "report.md").exists()


def test_an_ascii_stdout_gets_the_tables_and_the_report(tmp_path):
    result = xbench("compare", "--backends", "numpy", *FAST, "--batch-sizes", "16", "--devices", "1",
                    "--out", str(tmp_path / "run"), stdout=subprocess.PIPE, env={"PYTHONIOENCODING": "ascii"})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "samples/s" in result.stdout and (tmp_path / "run" / "report.md").exists()
