"""Backends found through the entry-point group `xbench.backends`.

Built-in backends are registered exactly like third-party ones. Loading a plugin only imports
its module (which must not import its framework at module level); a plugin that fails to
load, or lacks part of the contract, shows as unavailable with the reason, never as a crash.

A plugin is loaded (imported, checked, instantiated) and probed only when it is needed: the
names alone come from the entry points, so `xbench compare --backends numpy` runs no other
plugin's code, while `xbench backends` and a run of every usable backend load them all. Each
plugin loads and probes in its own daemon thread, all at once, and xbench waits for them at
most `XBENCH_PROBE_TIMEOUT_S` seconds in all (default 20: a probe reads package metadata and
must not import its framework, so this is generous even on a cold network filesystem). A
plugin that raises, calls `sys.exit`, or does not answer in time is unavailable with the
reason, e.g. "plugin did not answer within 20 s (probe)"; a hung thread is left behind and
ends with the process. Only KeyboardInterrupt gets through.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView
from dataclasses import dataclass, field, replace
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from xbench.contract import Availability, Backend, missing_methods
from xbench.errors import BackendError, brief, one_line
from xbench.plugins import MAX_REASON, described, plugin_timeout
from xbench.plugins import TIMEOUT_VARIABLE as TIMEOUT_VARIABLE  # re-exported: tests and docs name it here

GROUP = "xbench.backends"


@dataclass(frozen=True)
class BackendEntry:
    """One registered backend: where it lives and, once loaded, whether it can run here."""

    name: str
    target: str  # "module:Class", what a worker process imports
    backend: Backend | None
    availability: Availability

    @property
    def usable(self) -> bool:
        return self.backend is not None and self.availability.installed


def list_entry_points() -> list[EntryPoint]:
    return list(entry_points(group=GROUP))


class Registry(Mapping[str, BackendEntry]):
    """Registered backends by name; each is loaded and probed on first access, so listing the
    names or choosing a few never runs the other plugins' code."""

    def __init__(self, points: list[EntryPoint]) -> None:
        self._points = unique_points(points)
        self._loaded: dict[str, BackendEntry] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> BackendEntry:
        return self.load([name])[name]

    def __contains__(self, name: object) -> bool:
        return name in self._points  # without loading it

    def __iter__(self) -> Iterator[str]:
        return iter(self._points)

    def __len__(self) -> int:
        return len(self._points)

    def values(self) -> ValuesView[BackendEntry]:
        self.load(self._points)  # all at once: hung plugins cost one timeout, not one each
        return super().values()

    def items(self) -> ItemsView[str, BackendEntry]:
        self.load(self._points)
        return super().items()

    def load(self, names: Iterable[str]) -> dict[str, BackendEntry]:
        """The entries for `names`, loading those not loaded yet together; KeyError for an
        unregistered name."""
        names = list(names)
        with self._lock:
            pending = [self._points[name] for name in dict.fromkeys(names) if name not in self._loaded]
            self._loaded.update(load_points(pending))
            return {name: self._loaded[name] for name in names}


@functools.lru_cache(maxsize=1)
def discover() -> Registry:
    """All registered backends by name, each loaded and probed at most once per process."""
    return Registry(list_entry_points())


def refresh() -> None:
    """Forget the cached discovery (after installing a plugin, or in tests)."""
    discover.cache_clear()


BUILT_IN_PACKAGE = "xbench_backends."  # where the built-in backends live (pyproject.toml)


def is_built_in(point: EntryPoint) -> bool:
    return point.value.startswith(BUILT_IN_PACKAGE)


def unique_points(points: list[EntryPoint]) -> dict[str, EntryPoint]:
    """Entry points by name, sorted. A built-in backend's name belongs to it whatever order the
    installed packages come in (a plugin cannot replace `jax`, as none can replace a built-in
    model family); otherwise a name registered twice keeps its first registration."""
    unique: dict[str, EntryPoint] = {}
    for point in sorted(points, key=lambda p: not is_built_in(p)):  # stable: built-ins first
        if point.name in unique and is_built_in(unique[point.name]):
            warnings.warn(
                f"xbench backend {point.name!r} from {point.value} is ignored: {point.name!r} is a built-in "
                "backend; register the plugin under another name", RuntimeWarning, stacklevel=3)
            continue
        if point.name in unique:
            warnings.warn(
                f"xbench backend {point.name!r} is registered twice ({unique[point.name].value} "
                f"and {point.value}); using the first", RuntimeWarning, stacklevel=3)
            continue
        unique[point.name] = point
    return dict(sorted(unique.items()))


def load_points(points: list[EntryPoint]) -> dict[str, BackendEntry]:
    """Load and probe each plugin in its own thread, all at once, waiting at most one timeout
    in all; failures and hangs become unavailable entries with the reason."""
    if not points:
        return {}
    timeout = plugin_timeout()  # to load and probe (see the module docstring)
    attempts = [_Attempt.start(point) for point in points]
    deadline = time.monotonic() + timeout
    for attempt in attempts:
        attempt.done.wait(max(0.0, deadline - time.monotonic()))
    return {attempt.point.name: _entry(attempt, timeout) for attempt in attempts}


@dataclass
class _Attempt:
    """One plugin loading and probing in a daemon thread; `stage` says how far it got."""

    point: EntryPoint
    stage: str = "import"
    backend: Backend | None = None
    availability: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, point: EntryPoint) -> _Attempt:
        attempt = cls(point)
        threading.Thread(target=attempt.run, name=f"xbench-plugin-{point.name}", daemon=True).start()
        return attempt

    def run(self) -> None:
        try:
            plugin_class = self.point.load()
            self.stage = "instantiation"
            self.backend = instantiate(plugin_class, self.point.name)
            self.stage = "probe"
            self.availability = self.backend.probe()
        except BaseException as err:  # SystemExit too: a broken plugin must not end xbench
            self.error = err
        finally:
            self.done.set()


def _entry(attempt: _Attempt, timeout: float) -> BackendEntry:
    """The entry for a finished or timed-out attempt; runs in the calling thread, so warnings
    reach the caller's filters."""
    point, error = attempt.point, attempt.error
    if not attempt.done.is_set():
        reason = f"plugin did not answer within {timeout:g} s ({attempt.stage})"
        return _unavailable(point, reason, warn=attempt.stage != "probe")
    if isinstance(error, KeyboardInterrupt):
        raise error  # the user's, even when it arrived in the plugin's thread
    if error is not None and attempt.stage != "probe":
        return _unavailable(point, f"plugin failed to load: {described(error)}", warn=True)
    if error is not None:
        return _unavailable(point, f"probe failed: {described(error)}")
    if not isinstance(attempt.availability, Availability):
        return _unavailable(point, f"probe returned {type(attempt.availability).__name__}, not an Availability")
    availability = attempt.availability
    if availability.reason:  # a plugin's words, shown in one-line errors: one line, of sane length
        availability = replace(availability, reason=one_line(availability.reason, MAX_REASON))
    return BackendEntry(point.name, point.value, attempt.backend, availability)


def _unavailable(point: EntryPoint, reason: str, warn: bool = False) -> BackendEntry:
    if warn:  # a plugin that cannot even load is worth a warning; a failed probe is routine
        warnings.warn(f"xbench backend {point.name!r}: {reason}", RuntimeWarning, stacklevel=4)
    return BackendEntry(point.name, point.value, None, Availability(False, reason=reason))


def instantiate(cls: type, name: str) -> Backend:
    """Check a plugin class against the contract (the methods of `Backend`; its optional
    abilities are asked for where they are used), naming the plugin in any error."""
    missing = missing_methods(cls, Backend)
    if missing:
        raise TypeError(f"{cls!r} lacks {', '.join(missing)} (see xbench.contract.Backend)")
    if getattr(cls, "name", None) != name:
        raise TypeError(f"{cls!r} has name {getattr(cls, 'name', None)!r}, registered as {name!r}")
    return cls()


def resolve(names: list[str] | tuple[str, ...]) -> list[BackendEntry]:
    """The entries for `names` (all usable ones when empty), or a one-line error for an
    unknown or unusable one. Only the named plugins are loaded."""
    registry = discover()
    if not names:
        usable = [entry for entry in registry.values() if entry.usable]
        if not usable:
            raise BackendError("no backend can run here; `xbench backends` shows why")
        return usable
    for name in names:
        if name not in registry:
            known = ", ".join(registry) or "none registered"
            raise BackendError(f"unknown backend {brief(name)}; available: {known}")
    loaded = registry.load(names)
    for name in names:
        if not loaded[name].usable:
            raise BackendError(f"backend {name!r} cannot run here: {loaded[name].availability.reason}")
    return [loaded[name] for name in names]


