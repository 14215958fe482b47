"""`python -m xbench` is the `xbench` command."""

from xbench.cli.main import run

run()
