"""Plugins that misbehave while xbench loads or probes them: they exit, raise or hang.

tests/plugin_exits_at_import.py and plugin_hangs_at_import.py do the same at import time.
"""

from __future__ import annotations

import sys
import time
from typing import ClassVar

from xbench.contract import Availability

HANG_S = 3600  # far longer than any test waits


class _Contract:
    """The rest of the contract; never reached, since these plugins fail earlier."""

    def setup(self, devices, platform):
        raise NotImplementedError

    def prepare(self, trial, work):
        raise NotImplementedError

    def run(self, prepared, steps):
        raise NotImplementedError


class ExitsInConstructor(_Contract):
    name: ClassVar[str] = "exits-in-init"

    def __init__(self) -> None:
        sys.exit("constructor said goodbye")

    def probe(self) -> Availability:
        return Availability(True, version="1")


class HangsInConstructor(_Contract):
    name: ClassVar[str] = "hangs-in-init"

    def __init__(self) -> None:
        time.sleep(HANG_S)

    def probe(self) -> Availability:
        return Availability(True, version="1")


class ExitsInProbe(_Contract):
    name: ClassVar[str] = "exits-in-probe"

    def probe(self) -> Availability:
        sys.exit(3)


class RaisesInProbe(_Contract):
    name: ClassVar[str] = "raises-in-probe"

    def probe(self) -> Availability:
        raise RuntimeError("probe exploded\nover two lines")


class HangsInProbe(_Contract):
    name: ClassVar[str] = "hangs-in-probe"

    def probe(self) -> Availability:
        time.sleep(HANG_S)
        return Availability(True, version="1")


class ProbeReturnsJunk(_Contract):
    name: ClassVar[str] = "junk-probe"

    def probe(self):
        return None


class InterruptsInProbe(_Contract):
    """Ctrl-C is the user's, not the plugin's: it must reach xbench's handler."""

    name: ClassVar[str] = "interrupts"

    def probe(self) -> Availability:
        raise KeyboardInterrupt
