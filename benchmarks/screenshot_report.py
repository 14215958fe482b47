"""Screenshots of a run's HTML report as a browser shows it: headless Chromium, no network.

    python benchmarks/screenshot_report.py RUN_DIR [--out DIR] [--width 1280] [--part-height 1600]

Writes the run's report (plots included) into a temporary copy of RUN_DIR, so the run itself
is left alone, opens its report.html in headless Chromium and screenshots it at successive
scroll offsets. Saves into DIR (default ./screenshots):
  report-full.png        the whole page, the screens stitched together
  report-part-NN.png     the page cut into screens of --part-height pixels, for reading one by one
PNGs are written with a 256-colour palette (a report has flat colours), which keeps them small.
Exits 2 when Chromium is missing (`apt-get install chromium`), 1 when it fails.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
# No network here: everything that would reach out is off, so a run neither waits nor fails on it.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1")
SCREEN_HEIGHT = 2000  # pixels per screenshot
MAX_SCREENS = 40
TIMEOUT_S = 60  # per screenshot


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=Path("screenshots"))
    parser.add_argument("--width", type=int, default=1280, help="window width in pixels")
    parser.add_argument("--part-height", type=int, default=1600, help="height of each report-part-NN.png")
    parser.add_argument("--chromium", default=CHROMIUM, help="the Chromium binary")
    return parser.parse_args(argv)


def write_report_copy(run_dir: Path, work: Path) -> Path:
    """The run's report.html, written afresh into a copy of the run under `work`."""
    from xbench.report.pages import REPORT_HTML, write_report

    copy = work / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("*.png", "report.*", "screenshots"))
    write_report(copy, html=True)
    return copy / REPORT_HTML


def scrolled(page: Path, offset: int) -> Path:
    """A copy of the page shown from `offset` pixels down (a page scrolled that far)."""
    text = page.read_text(encoding="utf-8")
    style = f"<style>body {{ transform: translateY(-{offset}px); }}</style></head>"
    target = page.with_name(f"screen-{offset}.html")
    target.write_text(text.replace("</head>", style, 1), encoding="utf-8")
    return target


def screenshot(chromium: str, page: Path, png: Path, width: int, height: int, work: Path) -> None:
    """One screenshot of `page` in a fresh profile; RuntimeError with Chromium's words when none came."""
    profile = Path(tempfile.mkdtemp(prefix="profile-", dir=work))
    command = [chromium, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
               f"--window-size={width},{height}", page.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0 or not png.exists() or png.stat().st_size == 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"chromium exited {done.returncode} without {png.name}: " + " | ".join(tail))


def screens(chromium: str, page: Path, width: int, work: Path) -> list:
    """Screenshots at successive offsets until one shows nothing but the background."""
    from PIL import Image

    shots = []
    for k in range(MAX_SCREENS):
        png = work / f"screen-{k:02d}.png"
        screenshot(chromium, scrolled(page, k * SCREEN_HEIGHT), png, width, SCREEN_HEIGHT, work)
        with Image.open(png) as image:
            shot = image.convert("RGB")
        if k and _content_bottom(shot) == 0:
            break
        shots.append(shot)
    return shots


def _content_bottom(image) -> int:
    """The row below the last one that differs from the bottom-left pixel (the page's background)."""
    from PIL import Image, ImageChops

    background = Image.new("RGB", image.size, image.getpixel((0, image.height - 1)))
    box = ImageChops.difference(image, background).getbbox()
    return box[3] if box else 0


def stitch(shots: list) -> object:
    """The screens one under the other, cut below the page's last content (plus a margin)."""
    from PIL import Image

    full = Image.new("RGB", (shots[0].width, sum(s.height for s in shots)), "white")
    for k, shot in enumerate(shots):
        full.paste(shot, (0, k * SCREEN_HEIGHT))
    return full.crop((0, 0, full.width, min(full.height, _content_bottom(full) + 32)))


def save_png(image, path: Path) -> Path:
    from PIL import Image

    image.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(path, optimize=True)
    return path


def save_all(full, out: Path, part_height: int) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("report-part-*.png"):
        old.unlink()
    written = [save_png(full, out / "report-full.png")]
    for k, top in enumerate(range(0, full.height, part_height), start=1):
        part = full.crop((0, top, full.width, min(full.height, top + part_height)))
        written.append(save_png(part, out / f"report-part-{k:02d}.png"))
    return written


def main(argv: list[str] | None = None) -> int:
    options = arguments(argv)
    if not Path(options.chromium).exists() and shutil.which(options.chromium) is None:
        print(f"screenshot_report: no Chromium at {options.chromium}; apt-get install chromium", file=sys.stderr)
        return 2
    if not (options.run_dir / "records.jsonl").exists():
        print(f"screenshot_report: {options.run_dir} holds no records.jsonl", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="xbench-screenshot-") as tmp:
        work = Path(tmp)
        try:
            page = write_report_copy(options.run_dir, work)
            full = stitch(screens(options.chromium, page, options.width, work))
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            print(f"screenshot_report: {error}", file=sys.stderr)
            return 1
        for path in save_all(full, options.out, options.part_height):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
