"""Finding processes a test started, however deep: each test tags its environment."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

TAG = "XBENCH_TEST_TAG"


def new_tag() -> str:
    return uuid.uuid4().hex


def tagged_processes(tag: str) -> list[int]:
    """Live processes (not zombies) whose environment carries `tag`."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and not _zombie(entry):
                found.append(int(entry.name))
        except OSError:
            continue  # gone, or not ours to read
    return found


def _zombie(entry: Path) -> bool:
    return (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
