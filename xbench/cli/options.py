"""Option types and parsers shared by the commands."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from xbench.errors import SpecError, XbenchError, brief
from xbench.experiment import COMPILE_CACHES, MAX_SECONDS, PLATFORMS, PRECISIONS, SCALINGS, SINGLE_DEVICE
from xbench.results.links import P2P_CHOICES
from xbench.run.cluster import LAUNCHER_CHOICES
from xbench.run.launcher import STARTUP_TIMEOUT_S

# Choices come from the spec, so the CLI and the TOML accept the same words. mypy cannot list
# members built at run time (hence the ignores); typer reads them, and commands take `.value`.
Scaling = Enum("Scaling", {name: name for name in SCALINGS}, type=str)  # type: ignore[misc]
Precision = Enum("Precision", {name: name for name in PRECISIONS}, type=str)  # type: ignore[misc]
Platform = Enum("Platform", {name: name for name in PLATFORMS}, type=str)  # type: ignore[misc]
Launcher = Enum("Launcher", {name: name for name in LAUNCHER_CHOICES}, type=str)  # type: ignore[misc]
P2p = Enum("P2p", {name: name for name in P2P_CHOICES}, type=str)  # type: ignore[misc]
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
# The GPU-to-GPU links, shared by compare, verify and sweep (allreduce takes both at once).
P2P_HELP = ("GPU-to-GPU links: on, the machine's own (NVLink, PCIe peer-to-peer); off, NCCL's collectives stage "
            "the traffic through host memory (NCCL_P2P_DISABLE=1, NCCL_NVLS_ENABLE=0 in every worker), as on a "
            "PCIe machine without peer-to-peer (default on; the spec's p2p).")
P2pOption = Annotated[Optional[P2p], typer.Option(help=P2P_HELP)]


def p2p_value(choice: Enum | None) -> bool | None:
    """--p2p as the spec's `p2p` (None: not given, the spec's own)."""
    return None if choice is None else choice.value == "on"


def p2p_list(values: list[str] | None) -> list[bool]:
    """`--p2p on off` (xbench allreduce: one block per topology), each once and in order; on
    alone when not given."""
    words = names(values) or ["on"]
    bad = [w for w in words if w not in P2P_CHOICES]
    if bad:
        raise SpecError(f"--p2p takes on, off or both (on off); got {brief(' '.join(bad))}")
    return [w == "on" for w in dict.fromkeys(words)]


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
        bad = next(w for w in words if not is_integer(w))
        raise SpecError(f"{flag} takes integers such as 1 2; got {brief(bad)}") from None


def is_integer(word: str) -> bool:
    try:
        int(word)
    except ValueError:
        return False
    return True


def backend_options(values: list[str] | None) -> dict[str, dict[str, str]] | None:
    """`--option tf.cross_device_ops=nccl` as {"tf": {"cross_device_ops": "nccl"}}."""
    if not values:
        return None
    options: dict[str, dict[str, str]] = {}
    for v in values:
        target, sep, setting = v.partition("=")
        backend, dot, key = target.partition(".")
        if not (sep and dot and backend and key):
            raise SpecError(f"--option takes BACKEND.KEY=VALUE, e.g. tf.cross_device_ops=nccl; got {brief(v)}")
        options.setdefault(backend, {})[key] = setting
    return options
