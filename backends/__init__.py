"""xbench's built-in backend plugins, installed as the package `xbench_backends`.

Each module registers through the `xbench.backends` entry-point group in pyproject.toml,
exactly as a third-party plugin would, and imports its framework only inside methods.
"""
