"""The machine-drift control of two runs compared: did the machine move between them?

Each run times two fixed workloads before and after its replicates (`xbench.run.drift`). Each
is summarised by its fastest repetition (the machine's speed; slower ones measure interference,
which the replicates' own spread already covers). A workload whose best time moved between the
runs by more than MOVED, and by more than twice what it moved within either run, says the
machine changed: a change in host-bound rows may be the machine's, not the code's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xbench.results.schema import CONTROL_FILE

WORKLOADS = {"host_loop_s": "host dispatch loop", "matmul_s": "host matmul"}
MOVED = 0.05  # a control that moved less than this between runs did not move


def read_controls(run_dir: Path) -> list[dict[str, Any]]:
    """The control measurements of a run, oldest first; [] for a run from before them, and
    lines that are cut off or not a control are skipped (a control is advice, never data)."""
    path = Path(run_dir) / CONTROL_FILE
    if not path.is_file():
        return []
    found = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and all(_seconds(entry.get(key)) for key in WORKLOADS):
            found.append(entry)
    return found


def _seconds(values: Any) -> bool:
    return (isinstance(values, list) and bool(values)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e4 for v in values))


@dataclass(frozen=True)
class Movement:
    workload: str  # its name for people
    ratio: float  # B's best time over A's
    within: float  # the largest relative change of the best time within either run (before -> after)

    @property
    def moved(self) -> bool:
        return abs(self.ratio - 1) > max(MOVED, 2 * self.within)


def movements(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> list[Movement]:
    """Per workload, how B's machine compares with A's; [] when a run has no control."""
    if not a or not b:
        return []
    found = []
    for key, name in WORKLOADS.items():
        within = max(_within(a, key), _within(b, key))
        found.append(Movement(name, _best(b, key) / _best(a, key), within))
    return found


def _best(entries: Sequence[Mapping[str, Any]], key: str) -> float:
    return min(v for entry in entries for v in entry[key])


def _within(entries: Sequence[Mapping[str, Any]], key: str) -> float:
    best = [min(entry[key]) for entry in entries]
    return max(best) / min(best) - 1 if len(best) > 1 else 0.0
