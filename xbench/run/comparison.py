"""A comparison: everything decided before the first trial runs (the spec resolved for this
machine, the backends ready, their launchers and lineups, the run directory claimed and
locked), the trials it plans, and what a run tells whoever watches it (`Observer`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from xbench.contract import Trial, implementation
from xbench.errors import XbenchError
from xbench.experiment import Spec
from xbench.results.records import RUN_FILE, prepare_run_dir
from xbench.run import launcher
from xbench.run.cluster import Launch
from xbench.run.environment import command_line
from xbench.run.plan import Lineup, plan_trials
from xbench.run.registry import BackendEntry
from xbench.run.rundir import RunDirLock, check_new_run_dir, discard_run_files, present_run_files
from xbench.run.verification import Progress as VerificationProgress
from xbench.run.zygote import ForkServers


@dataclass(frozen=True)
class Comparison:
    """Everything decided before the first trial runs."""

    spec: Spec
    entries: tuple[BackendEntry, ...]
    devices: dict[str, dict[str, Any]]  # backend name -> DeviceInfo as a dict
    run_dir: Path
    run_id: str
    breakdown: bool = False  # time compute-only twins and the all-reduce too
    launch: Launch = field(default_factory=Launch)
    launchers: dict[str, str] = field(default_factory=dict)  # backend name -> the launcher that starts it
    lineups: dict[str, Lineup] = field(default_factory=dict)  # backend name -> its variants and programs
    startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S  # for a worker (gang) to start and find its devices
    lock: RunDirLock | None = None  # held from prepare/resume until `release`
    created: bool = False  # this run made run_dir (so it may remove it while it holds nothing of a run)
    found: frozenset[str] = frozenset()  # run files run_dir held when this run claimed it: never its to delete
    left_out: tuple[int, ...] = ()  # device counts asked by default or by a spec file that no backend here has
    # Started to find the devices, then forked from for the run's workers: one import per backend.
    fork_servers: ForkServers | None = None

    def release(self) -> None:
        """Give up the run directory and end the fork servers. A run that never started (no
        run.json: nothing to resume) takes back what it wrote, and the directory too when it
        made it; never without holding the lock, so that a run that lost the race for a
        directory leaves the winner's alone."""
        try:
            if self.fork_servers is not None:
                self.fork_servers.close()
        finally:
            self._release_run_dir()

    def _release_run_dir(self) -> None:
        held = self.lock is not None and self.lock.held
        unstarted = held and not (self.run_dir / RUN_FILE).exists()
        if unstarted:
            discard_run_files(self.run_dir, keep=self.found)  # only what this invocation wrote
        if self.lock is not None:
            self.lock.release()
        if unstarted and self.created:
            with contextlib.suppress(OSError):  # not empty: another run's files arrived meanwhile
                self.run_dir.rmdir()

    @property
    def implementations(self) -> list[str]:
        """Every backend x variant x program the run times, as verify and the tables name them."""
        return [implementation(name, variant.name, program)
                for name in (e.name for e in self.entries)
                for variant in self.lineups.get(name, Lineup()).variants
                for program in self.lineups.get(name, Lineup()).verified_programs(1, variant)]


def new_run_id() -> str:
    return datetime.now().strftime("%Y-%m-%dT%H-%M-%S")


def default_run_dir(run_id: str, root: Path = Path("results")) -> Path:
    """results/<run id>, made here, with a suffix when a run started in the same second: mkdir
    is atomic, so runs started together never share one."""
    n, path = 1, root / run_id
    try:
        root.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                path.mkdir()
                return path
            except FileExistsError:
                n += 1
                path = root / f"{run_id}-{n}"
    except OSError as err:
        raise XbenchError(f"cannot write results to {path}: {err.strerror or err}; choose another --out") from None


def claim_new_run_dir(comparison: Comparison, run_dir: Path | None) -> Comparison:
    """Create (or take an empty) run directory, results/<run id> by default, and lock it; a
    one-line error when another run holds it or it already holds a run."""
    try:
        created = run_dir is None or not run_dir.exists()
    except OSError as err:  # a name too long, a path through a file: the system's own words
        raise XbenchError(f"cannot use {_shown_path(run_dir)} as a run directory: {err.strerror or err}; "
                          "choose another --out") from None
    run_dir = prepare_run_dir(run_dir or default_run_dir(comparison.run_id))
    lock = RunDirLock(run_dir)
    claimed = replace(comparison, run_dir=run_dir, lock=lock, created=created)
    try:
        lock.acquire(command_line())
        claimed = replace(claimed, found=present_run_files(run_dir))  # a refused directory keeps all of it
        check_new_run_dir(run_dir)
    except BaseException:
        claimed.release()
        raise
    return claimed


def _shown_path(path: Path | None, limit: int = 120) -> str:
    """A path for a one-line error, its middle cut out when it is long."""
    text = str(path)
    return text if len(text) <= limit else f"{text[:limit // 2]}…{text[-limit // 2:]} ({len(text)} characters)"


def planned_trials(comparison: Comparison) -> list[Trial]:
    """Every trial of the comparison, in order."""
    return plan_trials(comparison.spec, [e.name for e in comparison.entries], comparison.breakdown,
                       comparison.launchers, comparison.lineups)


def trial_count(comparison: Comparison, done: set[str] | frozenset[str] = frozenset()) -> int:
    return len([t for t in planned_trials(comparison) if t.id not in done])


class Observer(launcher.Listener, Protocol):
    """What a run tells whoever watches it (the CLI draws progress and messages from it)."""

    def phase(self, text: str) -> AbstractContextManager[Any]:
        """A stretch of work without per-trial progress (all-reduce timing)."""

    def verifying(self, text: str) -> AbstractContextManager[VerificationProgress]:
        """Verification, which `text` names, runs while this is entered; what it yields hears
        of each reference run."""

    def verified(self, outcome: Mapping[str, Mapping[str, Any]]) -> None:
        """Each backend's verification outcome, before timing starts."""

    def note(self, text: str) -> None:
        """A one-line message for the user."""

    def round_added(self, trials: int, text: str) -> None:
        """An adaptive round of `trials` more trials starts; `text` says why."""
