"""Option types and parsers shared by the commands."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from xbench.errors import SpecError, XbenchError
from xbench.experiment import COMPILE_CACHES, MAX_SECONDS, PLATFORMS, PRECISIONS, SCALINGS, SINGLE_DEVICE
from xbench.run.cluster import LAUNCHER_CHOICES
from xbench.run.launcher import STARTUP_TIMEOUT_S

# Choices come from the spec, so the CLI and the TOML accept the same words. mypy cannot list
# members built at run time (hence the ignores); typer reads them, and commands take `.value`.
Scaling = Enum("Scaling", {name: name for name in SCALINGS}, type=str)  # type: ignore[misc]
Precision = Enum("Precision", {name: name for name in PRECISIONS}, type=str)  # type: ignore[misc]
Platform = Enum("Platform", {name: name for name in PLATFORMS}, type=str)  # type: ignore[misc]
Launcher = Enum("Launcher", {name: name for name in LAUNCHER_CHOICES}, type=str)  # type: ignore[misc]
CompileCache = Enum("CompileCache", {name: name for name in COMPILE_CACHES}, type=str)  # type: ignore[misc]

# The launcher options, shared by compare, verify and allreduce.
LauncherOption = Annotated[Optional[Launcher], typer.Option(
    help="subprocess: one process drives all devices; spmd: one process per device; auto: each backend's own "
         "choice (default auto).")]
NprocOption = Annotated[Optional[int], typer.Option(
    metavar="INT", help="spmd: processes (devices) per node (default: from SLURM or torchrun, else a trial's "
                        "devices).")]
NnodesOption = Annotated[Optional[int], typer.Option(
    metavar="INT", help="spmd: nodes in the job, running xbench once on each (default 1).")]
NodeRankOption = Annotated[Optional[int], typer.Option(metavar="INT", help="spmd: this node's rank, 0..nnodes-1.")]
# Variants and plain programs, shared by compare and verify.
VariantsOption = Annotated[Optional[list[str]], typer.Option(
    metavar="BACKEND:VARIANT...", help="Variants to run besides each backend as written, e.g. jax:fused, or all "
                                       "(default: none; `xbench backends` lists each backend's variants).")]
SingleDevice = Enum("SingleDevice", {name: name for name in SINGLE_DEVICE}, type=str)  # type: ignore[misc]
SingleDeviceOption = Annotated[Optional[SingleDevice], typer.Option(
    help="The 1-device programs: both (default: the data-parallel program with one replica, the baseline of its "
         "own speedup, and the plain program without distribution, compared separately), data-parallel, or plain "
         "(the speedup is then over another program, and the output says so).")]
CoordinatorOption = Annotated[Optional[str], typer.Option(
    metavar="HOST:PORT", help="spmd: node 0's address, the same on every node.")]
StartupTimeoutOption = Annotated[Optional[float], typer.Option(
    metavar="SECONDS", help="Seconds a worker (every rank, every node under spmd) may take to start and find its "
                            f"devices (default {STARTUP_TIMEOUT_S:g}), and a fork server to import its framework; a "
                            "multi-node run stops when another node never comes.")]


def startup_timeout_s(value: float | None) -> float:
    """--startup-timeout, checked: positive and finite."""
    if value is None:
        return STARTUP_TIMEOUT_S
    if not 0 < value <= MAX_SECONDS:
        raise XbenchError(f"--startup-timeout must be a positive number of seconds up to {MAX_SECONDS:g} (a "
                          f"week), got {value:g}")
    return value


def value(choice: Enum | None) -> str | None:
    return None if choice is None else choice.value


def names(values: list[str] | None) -> list[str] | None:
    """`--backends tf jax` and `--backends tf,jax` alike; None when not given."""
    if not values:
        return None
    return [name for v in values for name in v.split(",") if name]


def integers(values: list[str] | None, flag: str) -> list[int] | None:
    words = names(values)
    if words is None:
        return None
    try:
        return [int(w) for w in words]
    except ValueError:
        raise SpecError(f"{flag} takes integers such as 1,2; got {' '.join(values or [])}") from None


def backend_options(values: list[str] | None) -> dict[str, dict[str, str]] | None:
    """`--option tf.cross_device_ops=nccl` as {"tf": {"cross_device_ops": "nccl"}}."""
    if not values:
        return None
    options: dict[str, dict[str, str]] = {}
    for v in values:
        target, sep, setting = v.partition("=")
        backend, dot, key = target.partition(".")
        if not (sep and dot and backend and key):
            raise SpecError(f"--option takes BACKEND.KEY=VALUE, e.g. tf.cross_device_ops=nccl; got {v!r}")
        options.setdefault(backend, {})[key] = setting
    return options
