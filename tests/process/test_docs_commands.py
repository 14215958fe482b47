"""The example commands of docs/*.md are accepted as written, and the cheap ones run.

Every `xbench ...` and `python ...` line of a shell code block (```sh, or an untagged block) in
docs/*.md is a command; a line ending in `\\` continues on the next. test_readme_commands.py
runs the README's commands in full; most of the docs' commands would take minutes to hours
(GPU-sized models, 4 and 8 devices, sweeps), so each is checked the cheapest way that still
proves its command line is accepted by the installed xbench, in a scratch directory staged as
a fresh clone (test_readme_commands.stage_fresh_clone):

- run: commands that are cheap in full (env, models, backends, report, export, diff,
  recommend, `--resume` of a finished run or sweep, benchmarks/predict_heldout.py) run as
  their own process and must exit 0 or a status their `# ... exit N ...` comment documents;
- dry-run: `xbench compare` runs with `--dry-run` added (the run's own spec checks and plan,
  then exit; nothing starts);
- parsed: `xbench verify`, `allreduce` and `sweep`, which have no dry run, run in this process
  up to where they would look for devices (every option parsed, the spec loaded and checked),
  where a stand-in stops them; benchmarks/repeatability.py's own options are parsed and the
  `xbench compare` arguments it passes on run with `--dry-run`.

Placeholders become real directories: `results/<run>`, `<A>`, `<B>` are copies of a committed
CPU run (repeat-1's A and B), `results/<sweep>` and `<same sweep again>` copies of a
committed CPU sweep (A and B of 2026-11-25-cpu-step-model). The backend `mine` of
writing-a-backend.md (the reader's own plugin) is played by a built-in one;
test_plugin_example.py runs those commands with the example plugin itself. SKIPPED lists the
rest, each with its reason.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.process.test_readme_commands import Command, numbered_fenced_blocks, parse, stage_fresh_clone, tail

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
SHELL_BLOCKS = {"", "sh", "bash", "shell", "console"}
COMMAND_TIMEOUT_S = 120

# Lines of a shell-like block that start with "xbench " but are not commands: (page, line).
NOT_COMMANDS = {
    ("architecture.md", "xbench sweep), slurm-spmd.sbatch"),  # a file tree's description column
}
# Commands not checked, each with its reason: (page, the line before its comment) -> reason.
SKIPPED = {
    ("usage.md", "python -m xbench ..."): "`...` stands for any command above: `python -m xbench` is `xbench`",
}
# Committed run directories that stand in for a placeholder (copied, since commands write into them).
PLACEHOLDERS = {
    "results/<run>": "results/2026-11-26-cpu-steady-scheduler/repeat-1/A",
    "results/<A>": "results/2026-11-26-cpu-steady-scheduler/repeat-1/A",
    "results/<B>": "results/2026-11-26-cpu-steady-scheduler/repeat-1/B",
    "results/<sweep>": "results/2026-11-25-cpu-step-model/A",
    "results/<same sweep again>": "results/2026-11-25-cpu-step-model/B",
}
PLUGIN_STAND_IN = {"mine": "torch"}  # writing-a-backend.md's plugin, played by a built-in backend
RUN_IN_FULL = {"env", "models", "backends", "report", "export", "diff", "recommend"}
PARSED_IN_PROCESS = {"verify", "allreduce", "sweep"}


@dataclass(frozen=True)
class DocCommand:
    page: str
    number: int  # the line in the page
    text: str  # as the page shows it, continuations joined

    @property
    def words(self) -> str:
        return self.text.partition(" #")[0].strip()

    def __str__(self) -> str:
        return f"docs/{self.page}:{self.number}: {self.text}"


def numbered_blocks(path: Path) -> list[tuple[str, list[tuple[int, str]]]]:
    """(info string, [(line number, line)]) of every fenced code block of a page."""
    return numbered_fenced_blocks(path.read_text(encoding="utf-8"), path.name)


def shell_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of the shell-like code blocks' lines, a `\\` continuation joined."""
    out: list[tuple[int, str]] = []
    for info, block in numbered_blocks(path):
        if info not in SHELL_BLOCKS:
            continue
        pending, first = "", 0
        for number, line in block:
            stripped = line.strip()
            if not pending:
                first = number
            if stripped.endswith("\\"):
                pending += stripped[:-1].rstrip() + " "
                continue
            joined, pending = (pending + stripped).strip(), ""
            if joined and not joined.startswith("#"):
                out.append((first, joined))
    return out


def doc_commands() -> list[DocCommand]:
    found = []
    for path in DOCS:
        for number, line in shell_lines(path):
            if line.startswith(("xbench ", "python ")) and (path.name, line) not in NOT_COMMANDS:
                found.append(DocCommand(path.name, number, line))
    return found


COMMANDS = doc_commands()


def test_the_docs_show_commands_and_every_exception_is_still_there():
    assert len(COMMANDS) >= 40, "fewer commands than the docs held when this test was written"
    shown = {(c.page, c.words) for c in COMMANDS}
    assert set(SKIPPED) <= shown, "a skipped command is no longer in the docs: drop it from SKIPPED"
    lines = {(path.name, line) for path in DOCS for _, line in shell_lines(path)}
    assert NOT_COMMANDS <= lines, "a NOT_COMMANDS line is no longer in the docs: drop it"
    for page in DOCS:  # a command in a block of another language would never be checked
        for info, block in numbered_blocks(page):
            if info not in SHELL_BLOCKS:
                hidden = [line for _, line in block if re.match(r"\s*(xbench|python) ", line)]
                assert hidden == [], f"commands in a ```{info} block of docs/{page.name}"


# -- the scratch clone -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("docs-clone")
    stage_fresh_clone(root)
    for n, committed in enumerate(sorted(set(PLACEHOLDERS.values()))):
        shutil.copytree(ROOT / committed, root / "results" / f"docs-example-{n}")
    return root


def placeholder_dirs() -> dict[str, str]:
    committed_dirs = sorted(set(PLACEHOLDERS.values()))
    numbered = {committed: f"results/docs-example-{n}" for n, committed in enumerate(committed_dirs)}
    return {placeholder: numbered[committed] for placeholder, committed in PLACEHOLDERS.items()}


def substituted(command: DocCommand) -> Command:
    """The command as it runs here: placeholders filled in, the plugin played by a built-in."""
    line = command.text
    for placeholder, real in placeholder_dirs().items():
        line = line.replace(placeholder, real)
    left = re.findall(r"<[^<>]*>", line.partition(" #")[0])
    assert not left, f"{command}\nplaceholders {left} this test cannot fill: add them to PLACEHOLDERS or SKIPPED"
    parsed = parse(line)
    argv = tuple(PLUGIN_STAND_IN.get(word, word) for word in parsed.argv)
    return Command(command.text, argv, parsed.allowed)


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("XBENCH_TIME_BUDGET_S", None)  # a user's shell has no test default
    return env


# Command lines already run and accepted in this process: a line that several pages show
# (`xbench backends` starts every backend: 10-17 s) runs once.
_ACCEPTED: set[tuple[tuple[str, ...], frozenset[int], Path]] = set()


def run_process(command: DocCommand, argv: list[str], cwd: Path, allowed: frozenset[int]) -> None:
    if (tuple(argv), allowed, cwd) in _ACCEPTED:
        return
    program = [sys.executable, "-m", "xbench"] if argv[0] == "xbench" else [sys.executable]
    try:
        done = subprocess.run([*program, *argv[1:]], cwd=cwd, env=environment(), capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command}\nran as: {shlex.join(argv)}\ntook over {COMMAND_TIMEOUT_S} s")
    assert done.returncode in allowed, (
        f"{command}\nran as: {shlex.join(argv)}\nexited {done.returncode} (the docs allow {sorted(allowed)}); "
        f"last lines of stderr:\n{tail(done.stderr)}\nlast lines of stdout:\n{tail(done.stdout)}")
    _ACCEPTED.add((tuple(argv), allowed, cwd))


class Accepted(Exception):
    """Raised where the command would start looking for devices: its line was accepted."""


def stop(*args, **kwargs):
    raise Accepted


def parse_in_process(command: DocCommand, argv: list[str], cwd: Path, monkeypatch, capsys) -> None:
    from xbench.cli import allreduce_cmd, sweep_cmd, verify_cmd
    from xbench.cli.main import main

    monkeypatch.setattr(verify_cmd, "ready_with_fork_servers", stop)
    monkeypatch.setattr(allreduce_cmd, "ready_with_fork_servers", stop)
    monkeypatch.setattr(sweep_cmd, "compare", types.SimpleNamespace(prepare=stop))
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("XBENCH_TIME_BUDGET_S", raising=False)
    try:
        code = main(argv[1:])
    except Accepted:
        return
    captured = capsys.readouterr()
    pytest.fail(f"{command}\nran as: {shlex.join(argv)} (parsed, stopped before any device)\nexited {code} "
                f"before it would start; stderr:\n{tail(captured.err)}")


def load_benchmark(path: Path, monkeypatch) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_example_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def check_repeatability(command: DocCommand, argv: list[str], cwd: Path, monkeypatch) -> None:
    """benchmarks/repeatability.py runs `xbench compare` several times: its options are parsed,
    and what it passes on to compare runs with --dry-run."""
    module = load_benchmark(ROOT / argv[1], monkeypatch)
    monkeypatch.setattr(sys, "argv", argv[1:])
    try:
        options = module.arguments()
    except SystemExit as exit_:
        pytest.fail(f"{command}\nits options were refused (exit {exit_.code})")
    passed_on = [a for a in options.compare_args if a != "--"]
    run_process(command, ["xbench", "compare", *passed_on, "--dry-run"], cwd, frozenset({0}))


def how(command: DocCommand) -> str:
    """run, dry-run, parsed or skip: how this test checks a command."""
    if (command.page, command.words) in SKIPPED:
        return "skip"
    argv = shlex.split(command.words)
    if argv[0] == "python":
        return "parsed" if argv[1:2] == ["benchmarks/repeatability.py"] else "run"
    sub = argv[1]
    if "--resume" in argv or sub in RUN_IN_FULL:
        return "run"
    if sub == "compare":
        return "dry-run"
    assert sub in PARSED_IN_PROCESS, f"{command}\nno way to check `xbench {sub}` here: add one"
    return "parsed"


@pytest.mark.skipif(any(importlib.util.find_spec(name) is None for name in ("jax", "torch", "tensorflow")),
                    reason="the docs' commands name the jax, torch and tf backends")
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.page}:{c.number}")
def test_every_docs_command_is_accepted(command, scratch, monkeypatch, capsys):
    way = how(command)
    if way == "skip":
        pytest.skip(SKIPPED[(command.page, command.words)])
    argv = list(substituted(command).argv)
    allowed = substituted(command).allowed
    if way == "run":
        run_process(command, argv, scratch, allowed)
    elif way == "dry-run":
        dry = argv if "--dry-run" in argv else [*argv, "--dry-run"]
        run_process(command, dry, scratch, frozenset({0}))
    elif argv[0] == "python":
        check_repeatability(command, argv, scratch, monkeypatch)
    else:
        parse_in_process(command, argv, scratch, monkeypatch, capsys)
