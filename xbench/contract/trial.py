"""What a backend is asked to run: a `Trial` (one timed configuration), the `Process` it runs
in under the spmd launcher, and the ids and labels that name trials and implementations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from xbench.contract.timing import TimingProtocol
from xbench.models.model_spec import ModelSpec

LAUNCHERS = ("subprocess", "spmd")
AS_WRITTEN = "as-written"  # the variant every backend has: its program as the docs teach it
DATA_PARALLEL = "data-parallel"  # the program over 1..N devices
PLAIN = "plain"  # the single-device program with no distribution at all
PROGRAMS = (DATA_PARALLEL, PLAIN)


@dataclass(frozen=True)
class Trial:
    """One timed configuration: backend x model x devices x batch, plus how to time it."""

    backend: str
    model: ModelSpec
    devices: int
    global_batch: int
    scaling: str
    precision: str
    platform: str
    learning_rate: float
    seed: int
    samples: int
    protocol: TimingProtocol
    options: dict[str, Any] = field(default_factory=dict)
    all_reduce: bool = True  # False: the compute-only step, the same step without the gradient all-reduce
    launcher: str = "subprocess"  # how its processes start: "subprocess" or "spmd" (one per device)
    replicate: int = 0  # which fresh worker process of the configuration measures it (0, 1, ...)
    variant: str = AS_WRITTEN  # one of the backend's `variants`, or "as-written"
    program: str = DATA_PARALLEL  # "plain": the single-device program without distribution

    @property
    def implementation(self) -> str:
        """What runs, without the configuration: e.g. "jax", "jax plain", "torch+compile"."""
        return implementation(self.backend, self.variant, self.program)

    @property
    def per_device_batch(self) -> int:
        return self.global_batch // self.devices

    @property
    def config_id(self) -> str:
        """The configuration, the same for all its replicates, e.g. "jax/medium/d2/b32"."""
        return trial_id(self.backend, self.model.name, self.devices, self.global_batch, self.launcher,
                        self.all_reduce, self.variant, self.program)

    @property
    def id(self) -> str:
        """One replicate of the configuration, e.g. "jax/medium/d2/b32/r1"."""
        return replicate_id(self.config_id, self.replicate)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Trial:
        return cls(**{**raw, "model": ModelSpec.from_dict(raw["model"]), "protocol": TimingProtocol(**raw["protocol"])})


@dataclass(frozen=True)
class Process:
    """One process's place in an spmd job: one device per process, `world_size` processes on
    `nnodes` nodes, `local_world_size` of them on this node. The core sets RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node rank), MASTER_ADDR and MASTER_PORT in
    the process's environment too, and CUDA_VISIBLE_DEVICES is left alone: use device
    `local_rank`."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nnodes: int
    coordinator: str  # "host:port" where rank 0 listens (jax.distributed, torch's MASTER_ADDR:PORT)
    hosts: tuple[str, ...]  # one address per node, by node rank

    @property
    def coordinator_port(self) -> int:
        return int(self.coordinator.rsplit(":", 1)[1])

    def address(self, rank: int) -> str:
        """A "host:port" for `rank`'s own server, for frameworks that need one per process
        (TF_CONFIG's worker list): the ports after the coordinator's (found free on one node;
        on several, by convention). Raises ValueError when the nodes' addresses are unknown
        (several nodes without SLURM or XBENCH_HOSTS)."""
        if not self.hosts:
            raise ValueError("every node's address is needed: run under SLURM or set XBENCH_HOSTS=host0,host1,...")
        host = self.hosts[rank // self.local_world_size]
        return f"{host}:{self.coordinator_port + 1 + rank}"


def trial_id(backend: str, model: str, devices: int, global_batch: int, launcher: str = "subprocess",
             all_reduce: bool = True, variant: str = AS_WRITTEN, program: str = DATA_PARALLEL) -> str:
    """e.g. "jax/medium/d2/b32", "torch/large/d2/b256/spmd/compute-only",
    "jax/medium/d1/b32/plain", "torch/medium/d2/b32/spmd/compile"."""
    base = f"{backend}/{model}/d{devices}/b{global_batch}"
    if launcher != "subprocess":
        base += f"/{launcher}"
    if program != DATA_PARALLEL:
        base += f"/{program}"
    if variant != AS_WRITTEN:
        base += f"/{variant}"
    return base if all_reduce else f"{base}/compute-only"


def replicate_id(config_id: str, replicate: int) -> str:
    return f"{config_id}/r{replicate}"


def implementation(backend: str, variant: str = AS_WRITTEN, program: str = DATA_PARALLEL) -> str:
    """A backend with its variant and program, as verify keys and tables name it:
    "jax", "jax plain", "torch+compile", "torch plain+compile"."""
    name = backend if program == DATA_PARALLEL else f"{backend} {program}"
    return name if variant == AS_WRITTEN else f"{name}+{variant}"


def implementation_of(trial: Mapping[str, Any]) -> str:
    """`implementation` of a trial as stored in a record (older records lack variant and program)."""
    return implementation(trial["backend"], trial.get("variant", AS_WRITTEN), trial.get("program", DATA_PARALLEL))


def backend_of_implementation(name: str) -> str:
    """The backend of an `implementation` name: "torch plain+compile" -> "torch"."""
    return name.split(" ")[0].split("+")[0]


def backend_label(backend: str, launcher: str = "subprocess") -> str:
    """A backend as tables and plots show it, with its launcher when not the default."""
    return backend if launcher == "subprocess" else f"{backend} ({launcher})"
