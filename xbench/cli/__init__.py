"""The `xbench` command line: one module per command, thin over library calls."""
