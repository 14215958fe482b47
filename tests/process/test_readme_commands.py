"""The README's commands run as written on a fresh clone, and the docs' links lead somewhere.

Every line of a ```sh block in README.md that starts with `xbench ` or `python ` is a command:
each runs here, in the README's order, as its own process, in a scratch directory that holds
what a fresh clone holds besides the code (the git-tracked files of configs/, results/ and
benchmarks/, as symlinks), so that a command reading a committed run finds it and the runs the
README writes (`--out results/first`) land in the scratch directory, never in the repository.
The code is the installed xbench, as after `make`. `make` lines are not run here: CI runs
`make test` itself, and `make compare` is that set-up plus `xbench compare --backends tf
jax`; the test only checks that no other `make` line hides in the README.

A command must exit 0, or with a status its own `# ... exit N ...` comment documents
(`xbench diff` exits 1 on a significant slowdown, which two runs of one spec may show).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import TAG, new_tag, tagged_processes

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAKE_LINES = ["make compare", "make test"]
COMMAND_TIMEOUT_S = 240
# What a fresh clone holds besides the code, staged for the commands (tracked files only).
STAGED = ("configs/", "results/", "benchmarks/")


@dataclass(frozen=True)
class Command:
    line: str  # as the README shows it, comment included
    argv: tuple[str, ...]  # the words before the comment
    allowed: frozenset[int]  # exit statuses: 0 and any the comment documents


def numbered_fenced_blocks(text: str, where: str = "") -> list[tuple[str, list[tuple[int, str]]]]:
    """(info string, [(line number, line)]) of every fenced code block."""
    blocks: list[tuple[str, list[tuple[int, str]]]] = []
    fence: str | None = None
    info, lines = "", []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if fence is None:
            opened = re.match(r"(`{3,}|~{3,})\s*([^`\s]*)", stripped)
            if opened:
                fence, info, lines = opened.group(1), opened.group(2), []
        elif stripped.startswith(fence) and not stripped.strip(fence[0]):
            blocks.append((info, lines))
            fence = None
        else:
            lines.append((number, line))
    assert fence is None, f"an unclosed code fence{' in ' + where if where else ''}"
    return blocks


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(info string, lines) of every fenced code block."""
    return [(info, [line for _, line in lines]) for info, lines in numbered_fenced_blocks(text)]


def sh_lines(text: str) -> list[str]:
    """The non-blank, non-comment lines of the ```sh blocks."""
    return [line.strip() for info, lines in fenced_blocks(text) if info == "sh"
            for line in lines if line.strip() and not line.strip().startswith("#")]


def parse(line: str) -> Command:
    words, _, comment = line.partition(" #")
    documented = {int(code) for code in re.findall(r"\bexit (\d+)\b", comment)}
    return Command(line, tuple(shlex.split(words)), frozenset({0, *documented}))


def readme_commands() -> list[Command]:
    return [parse(line) for line in sh_lines(README.read_text(encoding="utf-8"))
            if line.startswith(("xbench ", "python "))]


def test_the_readme_shows_only_commands_this_test_runs():
    text = README.read_text(encoding="utf-8")
    lines = sh_lines(text)
    strays = [line for line in lines if not line.startswith(("xbench ", "python ", "make "))]
    assert strays == [], "README ```sh lines this test would neither run nor check"
    make = [line.partition(" #")[0].strip() for line in lines if line.startswith("make ")]
    assert make == MAKE_LINES  # CI runs `make test`; no other make line hides here
    hidden = [line for info, block in fenced_blocks(text) if info != "sh" for line in block
              if line.strip().startswith(("xbench ", "python ", "make "))]
    assert hidden == [], "commands in a README code block not tagged ```sh (so never run)"
    commands = readme_commands()
    assert len(commands) >= 5 and {c.argv[0] for c in commands} <= {"xbench", "python"}


# -- links -----------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def outside_code(path: Path) -> list[str]:
    """A Markdown file's lines outside fenced code blocks."""
    out, fence = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        opened = re.match(r"(`{3,}|~{3,})", stripped)
        if fence is None and opened:
            fence = opened.group(1)
        elif fence is not None:
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                fence = None
        else:
            out.append(line)
    return out


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings (inline code keeps its text)."""
    found: set[str] = set()
    for line in outside_code(path):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))  # a link: its text
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_existing_files_and_headings(page):
    broken = []
    for line in outside_code(page):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):  # inline code holds no links
            if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            linked = (page.parent / path_part).resolve() if path_part else page
            if not linked.exists():
                broken.append(f"{target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert broken == [], f"broken links in {page.relative_to(ROOT)}"


# -- the commands ----------------------------------------------------------------------------

def tracked_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True,
                                timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("needs a git checkout: the test stages the files a fresh clone has")
    return [name for name in listed.split("\0") if name]


def stage_fresh_clone(scratch: Path) -> None:
    """Symlink every tracked file of STAGED into `scratch`, directories made real, so that
    writes (a new run directory) stay in `scratch` and untracked files are absent."""
    for name in tracked_files():
        if name.startswith(STAGED) and (ROOT / name).exists():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            (scratch / name).symlink_to(ROOT / name)


def tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="the README's commands use the jax backend")
def test_every_readme_command_runs_as_written_on_a_fresh_clone(tmp_path):
    commands = readme_commands()
    stage_fresh_clone(tmp_path)
    tag = new_tag()
    env = {**os.environ, TAG: tag}
    env.pop("XBENCH_TIME_BUDGET_S", None)  # a user's shell has no test default: the README's own options decide
    timings = []
    for command in commands:
        program = [sys.executable, "-m", "xbench"] if command.argv[0] == "xbench" else [sys.executable]
        started = time.monotonic()
        try:
            done = subprocess.run([*program, *command.argv[1:]], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired as err:
            stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else err.stderr or ""
            pytest.fail(f"{command.line}\ntook over {COMMAND_TIMEOUT_S} s; last lines of stderr:\n{tail(stderr)}")
        timings.append(f"{time.monotonic() - started:6.1f} s  {shlex.join(command.argv)}")
        assert done.returncode in command.allowed, (
            f"{command.line}\nexited {done.returncode} (README allows {sorted(command.allowed)}); "
            f"last lines of stderr:\n{tail(done.stderr)}\nlast lines of stdout:\n{tail(done.stdout)}")
        if command.argv[:2] == ("xbench", "compare") and "--out" in command.argv:
            out = command.argv[command.argv.index("--out") + 1]
            assert (tmp_path / out / "records.jsonl").is_file(), f"{command.line}\nwrote no {out}/records.jsonl"
    print("\n".join(timings))
    deadline = time.monotonic() + 10
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tagged_processes(tag) == []
