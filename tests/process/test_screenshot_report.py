"""benchmarks/screenshot_report.py: the report as headless Chromium shows it. Runs only where
Chromium is installed (not in CI); without it the script says what to install."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "screenshot_report.py"
CHROMIUM = Path("/usr/bin/chromium")
SMALL_RUN = ROOT / "results" / "2026-11-25-h100x1-intervals" / "repeat" / "A"  # 2 models' tables, one plot


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=ROOT)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)")
def test_the_report_screenshot_is_a_png_of_the_whole_page(tmp_path):
    from PIL import Image

    done = _run(str(SMALL_RUN), "--out", str(tmp_path / "shots"))
    assert done.returncode == 0, done.stderr
    full = tmp_path / "shots" / "report-full.png"
    assert full.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(full) as image:
        width, height = image.size
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert width == 1280 and height > 1000  # tables, plot and notes, not one blank screen
    assert colours is None or len(colours) > 16
    parts = sorted((tmp_path / "shots").glob("report-part-*.png"))
    assert parts and all(p.stat().st_size > 0 for p in parts)
    assert not list(SMALL_RUN.glob("screen*")) and (SMALL_RUN / "report.html").exists()  # the run is untouched


def test_without_chromium_the_script_says_what_to_install(tmp_path):
    done = _run(str(SMALL_RUN), "--out", str(tmp_path), "--chromium", str(tmp_path / "no-chromium"))
    assert done.returncode == 2 and "apt-get install chromium" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
