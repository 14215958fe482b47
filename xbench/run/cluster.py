"""Where worker processes run: the launcher choice and, for `spmd`, the nodes.

`--launcher subprocess` (one worker process drives all of a trial's devices) or `--launcher
spmd` (one process per device). An spmd job spans `nnodes` nodes; xbench runs once per node
and starts that node's share of the ranks itself. The node geometry comes from the command
line, or from the environment of a SLURM allocation or a torchrun-style launcher that started
one xbench per node.
"""

from __future__ import annotations

import os
import random
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from xbench.errors import XbenchError, brief

LAUNCHER_CHOICES = ("auto", "subprocess", "spmd")
DEFAULT_PORT = 29500  # torch.distributed's default; multi-node runs must agree on it
SLURM_FIRST_PORT = 20000
PORT_STRIDE = 16  # ports per job: the coordinator's, then one per rank (TF workers)


class MalformedEnvironment(XbenchError):
    """A SLURM, torchrun or XBENCH_HOSTS variable that is set but cannot be read; an error
    for every launcher, unlike a readable layout that only spmd could not use."""


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
        raise XbenchError(f"--launcher must be one of {', '.join(LAUNCHER_CHOICES)}, got {brief(launcher)}")
    spmd_flags = any(v is not None for v in (nproc_per_node, nnodes, node_rank, coordinator))
    if spmd_flags and launcher != "spmd":
        raise XbenchError("--nproc-per-node, --nnodes, --node-rank and --coordinator need --launcher spmd")
    if launcher != "spmd":
        try:
            found = _from_environment(env)
        except MalformedEnvironment:
            raise  # it might hide a multi-node job, which one process must not run in
        except SeveralTasksPerNode:
            # An allocation of several nodes would run on this one alone; one node's batch
            # script sees its allocation's task count but runs once, and may go on.
            found = {"nnodes": _env_int(env, "SLURM_NNODES", 1, minimum=1), "source": "SLURM"}
        except XbenchError:  # a layout spmd could not use says nothing against one process
            found = {}
        if found.get("nnodes", 1) > 1:
            raise XbenchError(f"this is a {found['nnodes']}-node {found['source']} job; use --launcher spmd "
                              "(or run xbench on one node)")
        return Launch(launcher=launcher)
    explicit = nnodes is not None or node_rank is not None or coordinator is not None
    # Geometry from the command line, when it gives any, else from the environment: never a mix.
    found = _from_environment(env) if not explicit else _hosts_only(env)
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
        # SLURM's hosts match its node count (see _from_slurm); these came from XBENCH_HOSTS.
        raise XbenchError(f"the environment names {len(launch.hosts)} hosts for {launch.nnodes} nodes; "
                          "set XBENCH_HOSTS to one host per node")


# Jobs take ports base + (job index * PORT_STRIDE) % JOB_PORTS, each up to PORT_STRIDE of them.
JOB_PORTS = 1024
HIGHEST_BASE_PORT = 65535 - JOB_PORTS - PORT_STRIDE


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    # ASCII digits only: str.isdigit() also passes '²', which int() refuses.
    if not sep or not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) <= HIGHEST_BASE_PORT:
        raise XbenchError(f"--coordinator must be HOST:PORT with a port up to {HIGHEST_BASE_PORT} "
                          f"(jobs use the {JOB_PORTS + PORT_STRIDE} ports after it), got {brief(address)}")
    return host, int(port)


def _from_environment(env: Mapping[str, str]) -> dict:
    """Node geometry from SLURM (one xbench task per node) or a torchrun-style launcher;
    XBENCH_HOSTS ("host0,host1,...") names each node where neither does (TF needs them)."""
    found: dict = {}
    if "SLURM_NNODES" in env and "SLURM_NODEID" in env and _slurm_nodelist(env)[1]:
        found = _from_slurm(env)
    elif "WORLD_SIZE" in env and "RANK" in env and "MASTER_ADDR" in env:
        found = _from_torchrun(env)
    return {**found, **_hosts_only(env)}


# Environment values are checked where they are read: a malformed one names the variable, its
# value and what it should be, instead of a traceback.
MAX_ENV_INT = 10**18  # node counts, ranks and job ids are far smaller; longer digit strings are noise


def _malformed(name: str, value: str, expected: str) -> MalformedEnvironment:
    """The error for variable `name` set to `value`; `expected` says what it should hold."""
    return MalformedEnvironment(f"environment variable {name}={brief(value)} {expected}; correct or unset it")


def _env_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0, maximum: int = MAX_ENV_INT) -> int:
    """The integer in variable `name`, or `default` where it is unset; an error naming the
    variable where it is set to anything but an integer in minimum..maximum."""
    if name not in env:
        return default
    text = env[name].strip()
    # ASCII digits only (str.isdigit() passes '²'); no sign, so "-1" is refused here too.
    if not re.fullmatch(r"[0-9]{1,19}", text) or not minimum <= int(text) <= maximum:
        accepted = f"{minimum}..{maximum}" if maximum < MAX_ENV_INT else f">= {minimum}"
        raise _malformed(name, env[name], f"must be an integer {accepted}")
    return int(text)


def _env_node_rank(env: Mapping[str, str], name: str, nnodes: int, count_name: str) -> int:
    """A node rank in 0..nnodes-1 from variable `name`; `count_name` gave the node count."""
    rank = _env_int(env, name, 0)
    if rank >= nnodes:
        raise _malformed(name, env[name], f"must be a node rank in 0..{nnodes - 1} ({count_name} says {nnodes} nodes)")
    return rank


def _hosts_only(env: Mapping[str, str]) -> dict:
    if not env.get("XBENCH_HOSTS"):
        return {}
    hosts = tuple(h.strip() for h in env["XBENCH_HOSTS"].split(","))
    if not all(hosts) or any(re.search(r"\s", h) for h in hosts):
        raise _malformed("XBENCH_HOSTS", env["XBENCH_HOSTS"],
                         "must name each node's host, comma-separated, none empty: host0,host1,...")
    return {"hosts": hosts}


class SeveralTasksPerNode(XbenchError):
    """SLURM started several xbench processes per node, whatever the launcher."""


def _from_slurm(env: Mapping[str, str]) -> dict:
    tasks_per_node = env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0].strip()
    if tasks_per_node not in ("", "1"):
        raise SeveralTasksPerNode(
            f"SLURM_NTASKS_PER_NODE is {brief(env['SLURM_NTASKS_PER_NODE'])}: under SLURM run one xbench "
            "per node (srun --ntasks-per-node=1); xbench starts its worker processes (--nproc-per-node ranks "
            "with --launcher spmd) itself, and several copies would time each other's work")
    # The step's nodes (an `srun -N1` inside a bigger allocation is a one-node job).
    variable, nodelist = _slurm_nodelist(env)
    hosts = expand_nodelist(nodelist, variable)
    count_name = "SLURM_STEP_NUM_NODES" if "SLURM_STEP_NUM_NODES" in env else "SLURM_NNODES"
    nnodes = _env_int(env, count_name, 1, minimum=1)
    if len(hosts) < nnodes:
        raise _malformed(variable, nodelist, f"names {len(hosts)} host(s), but {count_name} says {nnodes} nodes")
    node_rank = _env_node_rank(env, "SLURM_NODEID", nnodes, count_name) if nnodes > 1 else 0
    # One block of ports per job id, so jobs sharing a node do not collide (unless their ids
    # agree modulo the number of blocks).
    blocks = (HIGHEST_BASE_PORT - SLURM_FIRST_PORT) // (JOB_PORTS + PORT_STRIDE)
    port = SLURM_FIRST_PORT + _env_int(env, "SLURM_JOB_ID", 0) % blocks * (JOB_PORTS + PORT_STRIDE)
    return {"source": "SLURM", "nnodes": nnodes, "node_rank": node_rank, "hosts": hosts[:nnodes],
            "coordinator": f"{hosts[0]}:{port}"}


def _slurm_nodelist(env: Mapping[str, str]) -> tuple[str, str]:
    """(variable, value) of the first SLURM node list set: the step's, else the job's."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"):
        if env.get(name):
            return name, env[name]
    return "SLURM_NODELIST", ""


def _from_torchrun(env: Mapping[str, str]) -> dict:
    if _env_int(env, "LOCAL_WORLD_SIZE", 1, minimum=1) != 1:
        raise XbenchError("start one xbench per node (torchrun --nproc-per-node 1); "
                          "xbench starts --nproc-per-node ranks on each node itself")
    # One xbench per node: its RANK is the node rank; the ranks' ports follow MASTER_PORT's,
    # leaving room for the jobs' ports after them (see parse_address).
    nnodes = _env_int(env, "WORLD_SIZE", 1, minimum=1)
    rank_name = "GROUP_RANK" if "GROUP_RANK" in env else "RANK"
    node_rank = _env_node_rank(env, rank_name, nnodes, "WORLD_SIZE")
    port = _env_int(env, "MASTER_PORT", DEFAULT_PORT, minimum=1, maximum=HIGHEST_BASE_PORT - PORT_STRIDE)
    address = env["MASTER_ADDR"].strip()
    if not address or re.search(r"\s", address):
        raise _malformed("MASTER_ADDR", env["MASTER_ADDR"], "must be node 0's host name or address")
    return {"source": "torchrun environment", "nnodes": nnodes, "node_rank": node_rank,
            "coordinator": f"{address}:{port + PORT_STRIDE}"}


MAX_HOSTS = 65_536  # far more nodes than any job; a larger range is a typo that would fill memory


def expand_nodelist(nodelist: str, variable: str = "SLURM_NODELIST") -> tuple[str, ...]:
    """SLURM's compressed host list ("gpu[01-03,07],rack[1-2]-n[1-2]") as host names, in order
    (what `scontrol show hostnames` prints); an error naming `variable` where it is malformed."""
    hosts: list[str] = []
    try:
        for item in _split_top_level(nodelist):
            hosts.extend(_expand_item(item))
            if len(hosts) > MAX_HOSTS:  # each item is bounded, their sum too
                raise ValueError(f"more than {MAX_HOSTS} hosts")
    except ValueError as err:
        raise _malformed(variable, nodelist, f"is not a SLURM host list such as gpu[01-04],login1 ({err})") from None
    if not hosts:
        raise _malformed(variable, nodelist, "names no host")
    return tuple(hosts)


def _split_top_level(text: str) -> list[str]:
    """Split on the commas outside brackets; ValueError where brackets do not pair up."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError("brackets nest or close before they open")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("a bracket is not closed")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_item(item: str) -> list[str]:
    """One host expression: each bracket group multiplies the names, left to right."""
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    names: list[str] = []
    for part in match.group(1).split(","):
        bounds = re.fullmatch(r"\s*([0-9]{1,9})\s*(?:-\s*([0-9]{1,9})\s*)?", part)
        if bounds is None:
            raise ValueError(f"a [...] range holds {brief(part)}, "
                             "not a number or a range such as 01-04")
        first, last = bounds.group(1), bounds.group(2) or bounds.group(1)
        if int(last) < int(first):
            raise ValueError(f"range {brief(part)} runs downwards")
        if len(names) + int(last) - int(first) >= MAX_HOSTS:
            raise ValueError(f"more than {MAX_HOSTS} hosts")
        names += [f"{head}{number:0{len(first)}d}" for number in range(int(first), int(last) + 1)]
    rests = _expand_item(tail)
    if len(names) * len(rests) > MAX_HOSTS:
        raise ValueError(f"more than {MAX_HOSTS} hosts")
    return [name + rest for name in names for rest in rests]


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
    port = base + (job_index * PORT_STRIDE) % JOB_PORTS
    if port + ranks + 1 > 65535:
        raise XbenchError(f"{ranks} ranks need ports up to {port + ranks + 1}; use a lower --coordinator port")
    # Nodes' own addresses are known from SLURM or XBENCH_HOSTS; else only on one host.
    local = host in ("127.0.0.1", "localhost", "::1")
    hosts = launch.hosts or ((host,) * launch.nnodes if local or launch.nnodes == 1 else ())
    return f"{host}:{port}", tuple(hosts)


# Ports given to jobs of this process, and when: the workers bind them only later, so a block
# is held back from other jobs for HOLD_PORTS_S (by then its workers have bound it or are gone).
_HANDED_OUT: dict[int, float] = {}
_PORT_DRAWS = random.SystemRandom()  # not the global generator, which a seed would make repeat
_PORTS_LOCK = threading.Lock()
HOLD_PORTS_S = 300.0
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_PORT = 10000  # above the well-known ports and the common services' (8080, 9090)
FEWEST_PORTS = 1000  # below that many to draw from, a lower start


def free_port_block(count: int, attempts: int = 200) -> int:
    """A port p such that p .. p+count-1 can be bound on this host now and were not handed
    to another job of this process (jobs may start side by side).

    Drawn below the kernel's ephemeral range (`_choosable_ports`): a port from there (what
    binding port 0 gives) can be taken by any process's outgoing connection or bind(0)
    between this choice and the workers' bind (EADDRINUSE, seen in CI with multi-process
    tests side by side); one below it only by an explicit bind."""
    low, high = _choosable_ports(count)
    with _PORTS_LOCK:
        now = time.monotonic()
        for port in [p for p, at in _HANDED_OUT.items() if now - at > HOLD_PORTS_S]:
            del _HANDED_OUT[port]
        for _ in range(attempts):
            start = _PORT_DRAWS.randrange(low, high)
            block = range(start, start + count)
            if not any(p in _HANDED_OUT for p in block) and all(map(_bindable, block)):
                _HANDED_OUT.update(dict.fromkeys(block, now))
                return start
    raise XbenchError(f"found no {count} free consecutive local ports in {low}..{high + count - 2} for the spmd job")


def _choosable_ports(count: int) -> tuple[int, int]:
    """[low, high) for a block's first port, its block ending under the ephemeral range
    (Linux's setting; elsewhere 32768, where Linux's default starts, below macOS's 49152):
    from LOWEST_PORT up, else from 1024 up where the range starts that low, else anywhere."""
    try:
        with open(EPHEMERAL_RANGE) as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    high = ephemeral_low - count + 1
    for low in (LOWEST_PORT, 1024):
        if high - low >= FEWEST_PORTS:
            return low, high
    return 1024, 65536 - count + 1


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
