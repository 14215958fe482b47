"""Where worker processes run: the launcher choice and, for `spmd`, the nodes.

`--launcher subprocess` (one worker process drives all of a trial's devices) or `--launcher
spmd` (one process per device). An spmd job spans `nnodes` nodes; xbench runs once per node
and starts that node's share of the ranks itself. The node geometry comes from the command
line, or from the environment of a SLURM allocation or a torchrun-style launcher that started
one xbench per node.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from xbench.errors import XbenchError

LAUNCHER_CHOICES = ("auto", "subprocess", "spmd")
DEFAULT_PORT = 29500  # torch.distributed's default; multi-node runs must agree on it
PORT_STRIDE = 16  # ports per job: the coordinator's, then one per rank (TF workers)


@dataclass(frozen=True)
class Launch:
    """The launcher choice and the spmd node geometry of one run."""

    launcher: str = "auto"  # auto: each backend's preferred launcher
    nproc_per_node: int | None = None  # spmd: most ranks on this node (default: a trial's devices)
    nnodes: int = 1
    node_rank: int = 0
    coordinator: str | None = None  # "host:port" of node 0; None: this host, free ports per job
    hosts: tuple[str, ...] = ()  # each node's address, by node rank, where known
    source: str = "command line"  # or "SLURM", "torchrun environment"
    notes: tuple[str, ...] = field(default=())

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    def local_ranks(self, devices: int) -> int:
        """How many of a `devices`-rank job's processes run on this node."""
        return devices // self.nnodes

    def to_dict(self) -> dict:
        return {"launcher": self.launcher, "nproc_per_node": self.nproc_per_node, "nnodes": self.nnodes,
                "node_rank": self.node_rank, "coordinator": self.coordinator, "hosts": list(self.hosts),
                "source": self.source}


def resolve_launch(launcher: str = "auto", nproc_per_node: int | None = None, nnodes: int | None = None,
                   node_rank: int | None = None, coordinator: str | None = None,
                   env: Mapping[str, str] | None = None) -> Launch:
    """The run's Launch from command-line values, falling back on a SLURM or torchrun
    environment; one-line errors for inconsistent values."""
    env = os.environ if env is None else env
    if launcher not in LAUNCHER_CHOICES:
        raise XbenchError(f"--launcher must be one of {', '.join(LAUNCHER_CHOICES)}, got {launcher!r}")
    spmd_flags = any(v is not None for v in (nproc_per_node, nnodes, node_rank, coordinator))
    if spmd_flags and launcher != "spmd":
        raise XbenchError("--nproc-per-node, --nnodes, --node-rank and --coordinator need --launcher spmd")
    if launcher != "spmd":
        return Launch(launcher=launcher)
    explicit = nnodes is not None or node_rank is not None or coordinator is not None
    # Geometry from the command line, when it gives any, else from the environment: never a mix.
    found = _from_environment(env)
    if explicit:
        found = {k: v for k, v in found.items() if k == "hosts"}
    launch = Launch("spmd", nproc_per_node, nnodes if nnodes is not None else found.get("nnodes", 1),
                    node_rank if node_rank is not None else found.get("node_rank", 0),
                    coordinator or found.get("coordinator"), tuple(found.get("hosts", ())),
                    found.get("source", "command line"))
    _check(launch)
    return launch


def _check(launch: Launch) -> None:
    if launch.nproc_per_node is not None and launch.nproc_per_node < 1:
        raise XbenchError(f"--nproc-per-node must be at least 1, got {launch.nproc_per_node}")
    if launch.nnodes < 1:
        raise XbenchError(f"--nnodes must be at least 1, got {launch.nnodes}")
    if not 0 <= launch.node_rank < launch.nnodes:
        raise XbenchError(f"--node-rank must be in 0..{launch.nnodes - 1}, got {launch.node_rank}")
    if launch.coordinator is not None:
        parse_address(launch.coordinator)
    if launch.multi_node and launch.coordinator is None:
        raise XbenchError("a multi-node run needs --coordinator HOST:PORT (node 0's address, the same on every node)")
    if launch.hosts and len(launch.hosts) != launch.nnodes:
        raise XbenchError(f"the environment names {len(launch.hosts)} hosts for {launch.nnodes} nodes")


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 - 1024:
        raise XbenchError(f"--coordinator must be HOST:PORT with a port below 64512, got {address!r}")
    return host, int(port)


def _from_environment(env: Mapping[str, str]) -> dict:
    """Node geometry from SLURM (one xbench task per node) or a torchrun-style launcher;
    XBENCH_HOSTS ("host0,host1,...") names each node where neither does (TF needs them)."""
    found: dict = {}
    if "SLURM_NNODES" in env and "SLURM_NODEID" in env and "SLURM_JOB_NODELIST" in env:
        found = _from_slurm(env)
    elif "WORLD_SIZE" in env and "RANK" in env and "MASTER_ADDR" in env:
        found = _from_torchrun(env)
    if env.get("XBENCH_HOSTS"):
        found["hosts"] = tuple(h.strip() for h in env["XBENCH_HOSTS"].split(",") if h.strip())
    return found


def _from_slurm(env: Mapping[str, str]) -> dict:
    tasks_per_node = env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]
    if tasks_per_node not in ("", "1"):
        raise XbenchError("under SLURM run one xbench per node (srun --ntasks-per-node=1); "
                          "xbench starts --nproc-per-node ranks on each node itself")
    hosts = expand_nodelist(env["SLURM_JOB_NODELIST"])
    port = DEFAULT_PORT + int(env.get("SLURM_JOB_ID", "0")) % 1000 * PORT_STRIDE % 20000
    return {"source": "SLURM", "nnodes": int(env["SLURM_NNODES"]), "node_rank": int(env["SLURM_NODEID"]),
            "hosts": hosts, "coordinator": f"{hosts[0]}:{port}"}


def _from_torchrun(env: Mapping[str, str]) -> dict:
    if int(env.get("LOCAL_WORLD_SIZE", "1")) != 1:
        raise XbenchError("start one xbench per node (torchrun --nproc-per-node 1); "
                          "xbench starts --nproc-per-node ranks on each node itself")
    # One xbench per node: its RANK is the node rank; the ranks' ports follow MASTER_PORT's.
    port = int(env.get("MASTER_PORT", DEFAULT_PORT)) + PORT_STRIDE
    return {"source": "torchrun environment", "nnodes": int(env["WORLD_SIZE"]),
            "node_rank": int(env.get("GROUP_RANK", env["RANK"])), "coordinator": f"{env['MASTER_ADDR']}:{port}"}


def expand_nodelist(nodelist: str) -> tuple[str, ...]:
    """SLURM's compressed host list ("gpu[01-03,07],login1") as host names, in order."""
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            for number in range(int(first), int(last or first) + 1):
                hosts.append(f"{prefix}{number:0{len(first)}d}")
    return tuple(hosts)


def job_ports(launch: Launch, job_index: int, ranks: int) -> tuple[str, tuple[str, ...]]:
    """The coordinator address and per-node hosts for one spmd job (a gang of trials).

    One node: free local ports, found now. Several nodes: every node derives the same
    ports from the coordinator's and the job's index in the plan, so they agree without
    talking to each other.
    """
    if launch.coordinator is None:
        port = free_port_block(ranks + 2)
        return f"127.0.0.1:{port}", ("127.0.0.1",)
    host, base = parse_address(launch.coordinator)
    port = base + (job_index * PORT_STRIDE) % 1000
    hosts = launch.hosts or (host,) * launch.nnodes
    return f"{host}:{port}", tuple(hosts)


def free_port_block(count: int, attempts: int = 50) -> int:
    """A port p such that p .. p+count-1 can be bound on this host now."""
    for _ in range(attempts):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            start = probe.getsockname()[1]
        if start + count < 65536 and all(_bindable(start + i) for i in range(count)):
            return start
    raise XbenchError(f"found no {count} free consecutive local ports for the spmd job")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
