"""A fork server's preload that notes each process importing it, a line per pid, in the file
that XBENCH_TEST_PRELOADS names: how many fork servers a run started for its backend."""

import os

PRELOADS = "XBENCH_TEST_PRELOADS"

if os.environ.get(PRELOADS):
    with open(os.environ[PRELOADS], "a", encoding="utf-8") as noted:
        noted.write(f"{os.getpid()}\n")
