"""Backends found through the entry-point group `xbench.backends`.

Built-in backends are registered exactly like third-party ones. Loading a plugin only imports
its module (which must not import its framework at module level); a plugin that fails to
load, or lacks part of the contract, shows as unavailable with the reason, never as a crash.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from xbench.contract import Availability, Backend
from xbench.errors import BackendError

GROUP = "xbench.backends"
_REQUIRED = ("probe", "setup", "prepare", "run")


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


@functools.lru_cache(maxsize=1)
def discover() -> dict[str, BackendEntry]:
    """All registered backends by name, loaded and probed once per process."""
    return load_entries(list_entry_points())


def refresh() -> None:
    """Forget the cached discovery (after installing a plugin, or in tests)."""
    discover.cache_clear()


def load_entries(points: list[EntryPoint]) -> dict[str, BackendEntry]:
    entries: dict[str, BackendEntry] = {}
    for point in points:
        if point.name in entries:
            warnings.warn(
                f"xbench backend {point.name!r} is registered twice ({entries[point.name].target} "
                f"and {point.value}); using the first", RuntimeWarning, stacklevel=2)
            continue
        entries[point.name] = load_entry(point)
    return dict(sorted(entries.items()))


def load_entry(point: EntryPoint) -> BackendEntry:
    """Load and validate one plugin; failures become an unavailable entry with the reason."""
    try:
        backend = instantiate(point.load(), point.name)
    except Exception as err:  # a broken plugin must not break the tool
        reason = f"plugin failed to load: {type(err).__name__}: {err}"
        warnings.warn(f"xbench backend {point.name!r}: {reason}", RuntimeWarning, stacklevel=2)
        return BackendEntry(point.name, point.value, None, Availability(False, reason=reason))
    try:
        availability = backend.probe()
    except Exception as err:
        availability = Availability(False, reason=f"probe failed: {type(err).__name__}: {err}")
    return BackendEntry(point.name, point.value, backend, availability)


def instantiate(cls: type, name: str) -> Backend:
    """Check a plugin class against the contract, naming the plugin in any error."""
    missing = [attr for attr in _REQUIRED if not callable(getattr(cls, attr, None))]
    if missing:
        raise TypeError(f"{cls!r} lacks {', '.join(missing)} (see xbench.contract.Backend)")
    if getattr(cls, "name", None) != name:
        raise TypeError(f"{cls!r} has name {getattr(cls, 'name', None)!r}, registered as {name!r}")
    return cls()


def resolve(names: list[str] | tuple[str, ...]) -> list[BackendEntry]:
    """The entries for `names` (all usable ones when empty), or a one-line error for an
    unknown or unusable one."""
    entries = discover()
    if not names:
        usable = [entry for entry in entries.values() if entry.usable]
        if not usable:
            raise BackendError("no backend can run here; `xbench backends` shows why")
        return usable
    chosen = []
    for name in names:
        entry = entries.get(name)
        if entry is None:
            known = ", ".join(entries) or "none registered"
            raise BackendError(f"unknown backend {name!r}; available: {known}")
        if not entry.usable:
            raise BackendError(f"backend {name!r} cannot run here: {entry.availability.reason}")
        chosen.append(entry)
    return chosen


def load_target(target: str) -> Backend:
    """Import a backend from its entry-point value (used inside worker processes)."""
    point = EntryPoint(name="", value=target, group=GROUP)
    return point.load()()
