"""`python -m xbench` is the `xbench` command."""

from xbench.cli.entry import run

run()
