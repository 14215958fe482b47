"""The public contract between xbench and a backend plugin.

A plugin is any class, registered under the entry-point group `xbench.backends`, that has the
attributes and methods of `Backend` below; it needs no base class. It imports this module and
nothing else from xbench (`Work` and `hash_arrays` are re-exported here).

`work` is built once per worker process and shared, read-only, by its later trials: copy
arrays before changing them in place.

Life of a backend inside one worker process (one backend, one device count):

    backend = Backend()
    info = backend.setup(devices, platform)       # first: configure devices, import framework
    for trial in trials:
        prepared = backend.prepare(trial, work)   # model from work.arrays, data on devices
        backend.run(prepared, steps)              # timed by the core, many times

Replicates. The core measures each configuration in several fresh worker processes; a
backend sees nothing of it but `trial.replicate`. When the environment variable
`XBENCH_COMPILE_CACHE_DIR` (`COMPILE_CACHE_VARIABLE`) is set, a backend whose framework has a
persistent compilation cache may point it there in `setup`, so that the replicates of one run
share compiled programs; it says whether it did in `PreparedInfo.settings["compile_cache"]`.

Programs and variants. Besides its data-parallel program a backend may offer the plain
single-device program a user would write without xbench (`programs` includes "plain"): for a
trial with `trial.program == "plain"` (always one device) `prepare` builds the step with no
distribution at all (no pmap or sharding, no strategy, no process group in the step, no DDP).
It may also offer `variants`, named ways to run either program as a performance engineer
would tune it (XLA, torch.compile, CUDA graphs, fused steps); `trial.variant` is one of their
names or "as-written" (the program as the framework's docs teach it). A variant must do the
same work (xbench verify checks it like any other program); one that cannot run on this
platform raises `Unsupported` in `prepare`, with the reason. A variant that fuses steps into
one call says how many in `Variant.steps_per_call`, and one that needs more warm-up (CUDA
graphs are recorded on the first calls) says how much in `Variant.warmup_steps`; the core
then sets the trial's `protocol` accordingly. A variant that runs only in some precisions (a
fused attention kernel that takes bf16 alone) lists them in `Variant.precisions`: `prepare`
raises `Unsupported` for the others, and xbench verify checks it in the first of them,
against its backend's float64 run with a tolerance from its backend's own rounding there.

Launchers. With the `subprocess` launcher (the default for a backend that does not say
otherwise) one process drives all `devices` devices, as above. With the `spmd` launcher there
is one process per device: every process calls `setup_process(process, platform)` instead of
`setup`, joins the job described by `process` (a `Process`: rank, world size, coordinator),
and then runs the same `prepare`/`run` calls on its own device with `trial.devices ==
process.world_size`; its shard of the global batch is `work.shards(...)[process.rank]`.
A backend lists the launchers it supports in `launchers` (first = preferred).

The core does all timing, repetition and statistics, so every framework is timed by the same
code. `probe` runs in the xbench process itself (in a helper thread, within
`XBENCH_PROBE_TIMEOUT_S`; see xbench.registry) and must not import the framework.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any, ClassVar, Protocol

from xbench.spec import ModelSpec
from xbench.spec import Protocol as TimingProtocol
from xbench.work import Work, hash_arrays, hash_weights

__all__ = [
    "ADAM", "AS_WRITTEN", "COMPILE_CACHE_VARIABLE", "DATA_PARALLEL", "LAUNCHERS", "PLAIN", "Adam", "Availability",
    "Backend", "DeviceInfo", "DeviceUnavailable", "Prepared", "PreparedInfo", "Process", "Trial", "Unsupported",
    "Variant", "Work", "backend_of_implementation", "families_of", "hash_arrays", "hash_weights", "implementation",
    "implementation_of", "launchers_of", "probe_distributions", "programs_of", "replicate_id", "variants_of",
]

LAUNCHERS = ("subprocess", "spmd")
AS_WRITTEN = "as-written"  # the variant every backend has: its program as the docs teach it
DATA_PARALLEL = "data-parallel"  # the program over 1..N devices
PLAIN = "plain"  # the single-device program with no distribution at all
PROGRAMS = (DATA_PARALLEL, PLAIN)
COMPILE_CACHE_VARIABLE = "XBENCH_COMPILE_CACHE_DIR"  # see "Replicates" above


@dataclass(frozen=True)
class Adam:
    """The optimizer every backend implements, with these constants: Adam as in Kingma and
    Ba's Algorithm 1, update = lr * m_hat / (sqrt(v_hat) + eps) with bias-corrected m_hat and
    v_hat (optax's and torch's form). Keras computes eps outside the bias correction, which
    changes the steps (verify catches it), so the tf backend overrides its update."""

    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8


ADAM = Adam()


@dataclass(frozen=True)
class Variant:
    """A named way to run a backend's programs other than as written, e.g. "xla" or
    "compile"; see "Programs and variants" above."""

    name: str
    description: str  # one line: what is turned on
    steps_per_call: int | None = None  # steps fused into one call, when the variant fuses them
    warmup_steps: int | None = None  # at least this many untimed steps first (e.g. CUDA-graph capture)
    precisions: tuple[str, ...] | None = None  # the only precisions it runs in (None: every one)


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, without importing its framework."""

    installed: bool
    version: str | None = None
    reason: str | None = None  # why not, and what to install


@dataclass(frozen=True)
class DeviceInfo:
    """What `setup` found: the devices a worker will use, and the framework behind them."""

    framework: str
    framework_version: str
    platform: str  # "gpu", "cpu", ...
    device_names: tuple[str, ...]
    simulated: bool  # True when one CPU is split into logical devices
    available: int  # how many devices of this platform the framework can use
    details: dict[str, Any] = field(default_factory=dict)


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
    def coordinator_host(self) -> str:
        return self.coordinator.rsplit(":", 1)[0]

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


class Unsupported(Exception):
    """The backend lacks an optional capability an action needs (e.g. verification)."""


class DeviceUnavailable(Exception):
    """Raised by `setup` when the devices asked for do not exist; the message says why."""


@dataclass(frozen=True)
class PreparedInfo:
    """Facts a backend reports about a prepared trial; they go into the record."""

    params: int  # counted from the framework's own variables
    weights_hash: str  # hash_weights of the initial weights read back from the framework
    precision: dict[str, Any]  # the matmul-precision settings as read back from the framework
    sync_every_call: bool = False  # True when each compiled call is waited for (see pitfalls)
    notes: tuple[str, ...] = ()
    # Settings in force that change which kernels run (autotuning, cuDNN benchmark mode,
    # compiler flags, the compilation cache), read back from the framework; recorded with
    # every replicate.
    settings: dict[str, Any] = field(default_factory=dict)


class Prepared(Protocol):
    """Whatever `prepare` returns; the core only reads `info`."""

    info: PreparedInfo


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
    def from_dict(cls, raw: dict[str, Any]) -> Trial:
        return cls(**{**raw, "model": ModelSpec.from_dict(raw["model"]), "protocol": TimingProtocol(**raw["protocol"])})


class Backend(Protocol):
    """A framework's data-parallel training step, as xbench times it."""

    name: ClassVar[str]
    """The name users type (`--backends NAME`); equals the entry-point name."""

    install_hint: ClassVar[str]
    """What to install when `probe` finds the framework missing, e.g. "pip install 'xbench[jax]'"."""

    # programs: ClassVar[tuple[str, ...]] = ("data-parallel",)
    #     Optional. Add "plain" when `prepare` can build the plain single-device program
    #     (see "Programs and variants" above).
    # variants: ClassVar[tuple[Variant, ...]] = ()
    #     Optional. The backend's named variants besides "as-written".
    # families: ClassVar[tuple[str, ...]] = ("mlp",)
    #     Optional. The model families `prepare` can build (`xbench.models`: "mlp",
    #     "transformer", "cnn", "lstm", or a plugin's); trials of others are `unsupported`.
    # launchers: ClassVar[tuple[str, ...]] = ("subprocess",)
    #     Optional. The launchers that can start this backend, preferred first: "subprocess"
    #     (one process drives every device: `setup`) and/or "spmd" (one process per device:
    #     `setup_process` and `all_gather` below).

    def probe(self) -> Availability:
        """Is the framework installed, and which version? Cheap; must not import it."""

    def setup(self, devices: int, platform: str) -> DeviceInfo:
        """Configure `devices` devices on `platform` ("auto", "cpu" or "gpu") in this fresh
        process, before anything else; raise `DeviceUnavailable` if they do not exist.
        Every backend needs it, spmd-only ones too: the core calls `setup(1, platform)` in a
        short-lived process to learn which devices a backend sees (`available` = how many)."""

    def prepare(self, trial: Trial, work: Work) -> Prepared:
        """Build the model of `trial.model.family` from `work.arrays` (the family's canonical
        layout, converted explicitly to the framework's), place `work.shards(...)` on the devices, apply
        `trial.precision` explicitly, build the optimizer (`ADAM`, `trial.learning_rate`) and
        the compiled step. With `trial.all_reduce` False, build the same step without the
        gradient all-reduce (each device applies its own gradient), or raise `Unsupported`.
        Must not run training steps: the core times the first call."""

    def run(self, prepared: Prepared, steps: int) -> None:
        """Run `steps` training steps (a multiple of `trial.protocol.steps_per_call`) and
        return only after the devices have finished them."""

    # Needed for the spmd launcher (one process per device):
    #
    # def setup_process(self, process: Process, platform: str) -> DeviceInfo:
    #     """Like `setup`, for one device (`process.local_rank` on this node): join the job
    #     (jax.distributed.initialize, torch.distributed.init_process_group, TF_CONFIG, ...)."""
    # def all_gather(self, values: list[float]) -> list[list[float]]:
    #     """Every rank's `values`, by rank (through the framework's collectives; untimed).
    #     The core gathers each rank's window times with it: step time = max over ranks."""
    #
    # In an spmd job the verification capabilities below mean: `gradients` this rank's
    # (all-reduced) gradient, `train` the global mean loss of each step, `replica_weights`
    # every rank's weights, by rank.
    #
    # Optional capabilities. A backend without them is timed but marked unverifiable.
    #
    # def validate_options(self, options: dict) -> None:
    #     """Raise ValueError naming a bad key or value of [options.NAME]."""
    # def gradients(self, prepared) -> tuple[float, list[np.ndarray]]:
    #     """Global-batch loss and the gradient the data-parallel step applies after its
    #     all-reduce, at the current weights on the current step's batch; in the family's
    #     canonical order and layout, as `work.arrays` (replica 0)."""
    # def train(self, prepared, steps: int) -> list[float]:
    #     """Run `steps` training steps of the timed program; the global loss of each."""
    # def replica_weights(self, prepared) -> list[list[np.ndarray]]:
    #     """The weights held by each replica, in canonical order and layout."""
    # def allreduce_prepare(self, nbytes: int, options: dict) -> Any:
    #     """A float32 buffer of `nbytes` on each device and the framework's own SUM
    #     all-reduce over them (xbench allreduce, --breakdown); without it: 'unsupported'."""
    # def allreduce_run(self, prepared, iterations: int) -> None:
    #     """`iterations` all-reduces; return after the devices finished them."""
    # def memory_peak_bytes(self, prepared) -> dict | None:
    #     """{"peak_bytes": [per device], "scope": "trial" or "worker process"}: the
    #     framework's own peak counter, or None where it has none."""


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


def implementation(backend: str, variant: str = AS_WRITTEN, program: str = DATA_PARALLEL) -> str:
    """A backend with its variant and program, as verify keys and tables name it:
    "jax", "jax plain", "torch+compile", "torch plain+compile"."""
    name = backend if program == DATA_PARALLEL else f"{backend} {program}"
    return name if variant == AS_WRITTEN else f"{name}+{variant}"


def backend_of_implementation(name: str) -> str:
    """The backend of an `implementation` name: "torch plain+compile" -> "torch"."""
    return name.split(" ")[0].split("+")[0]


def replicate_id(config_id: str, replicate: int) -> str:
    return f"{config_id}/r{replicate}"


def backend_label(backend: str, launcher: str = "subprocess") -> str:
    """A backend as tables and plots show it, with its launcher when not the default."""
    return backend if launcher == "subprocess" else f"{backend} ({launcher})"


def implementation_of(trial: dict[str, Any]) -> str:
    """`implementation` of a trial as stored in a record (older records lack variant and program)."""
    return implementation(trial["backend"], trial.get("variant", AS_WRITTEN), trial.get("program", DATA_PARALLEL))


def programs_of(backend: Any) -> tuple[str, ...]:
    """The programs a backend can build: always "data-parallel", and "plain" if it says so."""
    declared = getattr(backend, "programs", ())
    return (DATA_PARALLEL, PLAIN) if isinstance(declared, (tuple, list)) and PLAIN in declared else (DATA_PARALLEL,)


def variants_of(backend: Any) -> dict[str, Variant]:
    """A backend's named variants by name (without "as-written")."""
    declared = getattr(backend, "variants", ())
    return {v.name: v for v in declared if isinstance(v, Variant)} if isinstance(declared, (tuple, list)) else {}


def families_of(backend: Any) -> tuple[str, ...]:
    """The model families a backend builds (`xbench.models`): the MLP unless it says more."""
    declared = getattr(backend, "families", ("mlp",))
    return tuple(declared) if isinstance(declared, (tuple, list)) else ("mlp",)


def launchers_of(backend: Any) -> tuple[str, ...]:
    """The launchers a backend supports, preferred first."""
    return tuple(getattr(backend, "launchers", ("subprocess",)))


def probe_distributions(framework: str, names: tuple[str, ...], hint: str) -> Availability:
    """Availability from installed distributions, without importing them.

    `names` are the distributions a backend needs; `framework` is the one whose version is
    reported; `hint` says what to install when one is missing.
    """
    missing = []
    for name in names:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        return Availability(False, reason=f"{', '.join(missing)} not installed; {hint}")
    return Availability(True, version=metadata.version(framework))
