"""Backends for tests: a numpy one that really computes, and plugins that misbehave.

The numpy backend can be told, through its options, to crash, hang, fail or run out of memory on one global
batch size (hang_replicate: hang in that replicate only, as each hang costs a whole trial timeout), so tests
can check that the launcher loses nothing else; temporary_file: each trial leaves a temporary file that its
worker removes at exit, as a compiler's cache.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from xbench.contract import (
    ADAM,
    DATA_PARALLEL,
    MEMORY_SHARE_VARIABLE,
    PLAIN,
    Availability,
    DeviceInfo,
    DeviceUnavailable,
    PreparedInfo,
    Trial,
    Unsupported,
    Variant,
    Work,
    variants_of,
)

FAKE_DEVICES = 4
STOP = "XBENCH_TEST_STOP"  # "worker" or "server": one such process stops itself (SIGSTOP) ...
STOP_DIR = "XBENCH_TEST_STOP_DIR"  # ... after claiming a file of that name in this directory (its pid)
STOP_SKIP = "XBENCH_TEST_STOP_SKIP"  # ... past this many that claim one first (default 0)
STOP_RANK = "XBENCH_TEST_STOP_RANK"  # a worker of an spmd job stops only at this rank


def stop_once(what: str) -> None:
    """Stop this process as a debugger or job control would, once a test: the processes that
    get here claim STOP_DIR/`what`.0, .1, ... in turn, and the one that claims the file past
    STOP_SKIP stops; later ones (a replacement, a resumed run) go on."""
    directory = os.environ.get(STOP_DIR)
    if os.environ.get(STOP) != what or not directory:
        return
    skip = int(os.environ.get(STOP_SKIP, "0"))
    for number in range(skip + 1):
        try:
            fd = os.open(Path(directory) / f"{what}.{number}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        if number == skip:
            os.kill(os.getpid(), signal.SIGSTOP)
        return


ACTIONS = ("crash_batch", "hang_batch", "hang_replicate", "fail_batch", "oom_batch", "oom_batch_after_others",
           "work_factor", "rank", "fail_if_env", "delay_rank", "fail_allreduce_bytes", "temporary_file")
_PREPARED_BATCHES: set[int] = set()  # this process's trials' global batches (oom_batch_after_others)


@dataclass
class NumpyPrepared:
    info: PreparedInfo
    trial: Trial
    x: np.ndarray
    kernel: np.ndarray


class NumpyBackend:
    """Forward passes of the first layer in numpy: real work, no framework."""

    name: ClassVar[str] = "numpy"
    install_hint: ClassVar[str] = "nothing to install"

    def probe(self) -> Availability:
        return Availability(True, version=np.__version__)

    def validate_options(self, options: dict[str, Any]) -> None:
        unknown = set(options) - set(ACTIONS)
        if unknown:
            raise ValueError(f"unknown option {sorted(unknown)[0]!r}")

    def setup(self, devices: int, platform: str) -> DeviceInfo:
        stop_once("worker")
        if devices > FAKE_DEVICES:
            raise DeviceUnavailable(f"asked for {devices} devices; numpy fakes {FAKE_DEVICES}")
        return DeviceInfo("numpy", np.__version__, "cpu", tuple(f"fake:{i}" for i in range(devices)),
                          simulated=True, available=FAKE_DEVICES)

    def prepare(self, trial: Trial, work: Work) -> NumpyPrepared:
        info = PreparedInfo(params=work.params, weights_hash=work.weights_hash,
                            precision={"numpy": trial.precision})
        _PREPARED_BATCHES.add(trial.global_batch)
        if trial.options.get("temporary_file"):  # as a compiler's cache: removed at exit, if the worker gets there
            fd, path = tempfile.mkstemp(prefix="xbench-fake-")
            os.close(fd)
            atexit.register(os.remove, path)
        return NumpyPrepared(info, trial, work.x[: trial.global_batch], work.weights[0][0])

    def run(self, prepared: NumpyPrepared, steps: int) -> None:
        batch = prepared.trial.global_batch
        options = {k: int(v) for k, v in prepared.trial.options.items() if k != "fail_if_env"}
        if options.pop("delay_rank", -1) == _rank():
            time.sleep(2.0)  # a slow rank: the others report first
        if "rank" in options and options["rank"] != _rank():  # the planned mishap is another rank's
            if _stops(options, prepared.trial):
                time.sleep(3600)  # as in a collective that waits for a rank that died or hangs
            options = {"work_factor": options.get("work_factor", 1)}
        elif os.environ.get(str(prepared.trial.options.get("fail_if_env", "")) or "-"):
            raise RuntimeError("planned failure (environment)")
        if options.get("crash_batch") == batch:
            os._exit(3)
        if _hangs(options, prepared.trial):
            time.sleep(3600)
        if options.get("fail_batch") == batch:
            raise RuntimeError("planned failure")
        if options.get("oom_batch") == batch:  # torch's words for it
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (planned)")
        if options.get("oom_batch_after_others") == batch and _PREPARED_BATCHES - {batch}:
            # an allocator's pool left in pieces by the trials before it in this process
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (planned, after other trials)")
        for _ in range(steps * options.get("work_factor", 1)):  # work_factor: a planned slowdown
            np.maximum(prepared.x @ prepared.kernel, 0)


def _hangs(options: dict[str, int], trial: Trial) -> bool:
    """hang_batch at this batch; hang_replicate: only that replicate hangs (each costs a timeout)."""
    return options.get("hang_batch") == trial.global_batch and options.get("hang_replicate", trial.replicate) == (
        trial.replicate)


def _stops(options: dict[str, int], trial: Trial) -> bool:
    """Whether the rank of a planned crash or hang stops this trial's training."""
    return options.get("crash_batch") == trial.global_batch or _hangs(options, trial)


class SpmdNumpyBackend(NumpyBackend):
    """The numpy backend started one process per device (spmd launcher). Its `all_gather` is
    not a collective: it repeats this rank's values, enough for launcher tests. Option
    `rank=R` confines crash/hang/fail to rank R; where rank R crashes or hangs, the other ranks
    wait at that batch as a real program's would in its next collective, instead of running on
    into the next trials (which made the launcher's records depend on how far they got)."""

    name: ClassVar[str] = "numpy-spmd"
    launchers: ClassVar[tuple[str, ...]] = ("spmd",)

    def setup_process(self, process: Any, platform: str) -> DeviceInfo:
        if os.environ.get(STOP_RANK, str(process.rank)) == str(process.rank):
            stop_once("worker")
        self.world = process.world_size
        return DeviceInfo("numpy", np.__version__, "cpu", (f"fake:{process.local_rank}",),
                          simulated=True, available=FAKE_DEVICES)

    def all_gather(self, values: list[float]) -> list[list[float]]:
        return [list(values) for _ in range(self.world)]

    def allreduce_prepare(self, nbytes: int, options: dict[str, Any]) -> np.ndarray:
        """Option fail_allreduce_bytes=N (with rank=R): that rank fails at that size."""
        planned = int(options.get("fail_allreduce_bytes", -1)) == nbytes
        if planned and int(options.get("rank", _rank())) == _rank():
            raise RuntimeError("planned all-reduce failure")
        return np.ones(nbytes // 4, np.float32)

    def allreduce_run(self, prepared: np.ndarray, iterations: int) -> None:
        for _ in range(iterations):
            prepared += 1.0  # work of a sum that never overflows


class PeersBackend(SpmdNumpyBackend):
    """The spmd numpy backend with a rendezvous: in a multi-node job a process of node > 0
    waits for node 0's coordinator port to open, as a framework's distributed start does."""

    name: ClassVar[str] = "numpy-peers"

    def setup_process(self, process: Any, platform: str) -> DeviceInfo:
        host, port = process.coordinator.rsplit(":", 1)
        while process.node_rank > 0:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        return super().setup_process(process, platform)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class MissingFrameworkBackend(NumpyBackend):
    name: ClassVar[str] = "missing"
    install_hint: ClassVar[str] = "pip install 'xbench[missing]'"

    def probe(self) -> Availability:
        return Availability(False, reason=f"missingframework not installed; {self.install_hint}")


class UnforkableBackend(NumpyBackend):
    """Names a module for the fork server to preload that does not exist: the server cannot
    start, and the run must go on with workers started from scratch (which never import it)."""

    name: ClassVar[str] = "numpy-unforkable"
    fork_preload: ClassVar[tuple[str, ...]] = ("xbench_test_no_such_module",)


class HangingPreloadBackend(NumpyBackend):
    """Its fork server's preload never finishes importing: the server must be given up after
    the run's start-up timeout, not a fixed one."""

    name: ClassVar[str] = "numpy-hanging-preload"
    fork_preload: ClassVar[tuple[str, ...]] = ("tests.support.plugin_hangs_at_import",)


class StoppingPreloadBackend(NumpyBackend):
    """Its first fork server stops itself while it imports (see `stop_once`)."""

    name: ClassVar[str] = "numpy-stopping-preload"
    fork_preload: ClassVar[tuple[str, ...]] = ("tests.support.plugin_stops_at_import",)


class IncompleteBackend:
    """Lacks `run`: must show as unavailable, not crash the tool."""

    name: ClassVar[str] = "incomplete"

    def probe(self) -> Availability:
        return Availability(True, version="0")

    def setup(self, devices: int, platform: str) -> DeviceInfo: ...
    def prepare(self, trial: Trial, work: Work) -> Any: ...


# -- a numpy MLP that trains and can be verified ---------------------------------------------

PAUSE_TRIAL = "XBENCH_TEST_PAUSE_TRIAL"  # a verification trial id: its worker stops in `gradients`
PAUSE_DIR = "XBENCH_TEST_PAUSE_DIR"  # ... after writing its pid to PAUSE_DIR/pid (to be killed)
# a verification trial id: out of memory the first time; the memory share each attempt saw is
# written to PAUSE_DIR/out-of-memory-once, then PAUSE_DIR/again
OOM_ONCE = "XBENCH_TEST_OOM_ONCE"


@dataclass
class MlpPrepared:
    info: PreparedInfo
    trial: Trial
    x: np.ndarray  # [devices, batches, per_device, inputs]
    y: np.ndarray
    replicas: list[list[np.ndarray]]  # each device's weights (kernel, bias per layer)
    moments: list[list[tuple[np.ndarray, np.ndarray]]]  # each device's Adam (m, v) per array
    dtype: Any
    bf16: bool
    scale: float  # the (wrong) factor a broken variant applies to its gradients
    step: int = 0
    losses: list[float] = field(default_factory=list)


class NumpyMlpBackend(NumpyBackend):
    """The MLP family in numpy: forward, backward and the contract's Adam; data-parallel over
    fake devices (each device's shard of the global batch, gradients averaged: a mean
    all-reduce), and a plain program on one device. Precisions: fp32, fp64 and "bf16" as a
    mixed-precision program computes it (inputs, weights, activations and the gradients
    flowing back rounded to bfloat16 through ml_dtypes, products summed in float32, weights
    and Adam in float32). Variants that run only in bf16: "bf16" (correct) and "bf16-scaled"
    (applies 1.5 x the gradient: a bug that verify must catch; 1.1 x would be 9e-2 from float64,
    inside the 1.2e-1 that this model's bf16 floor of 2.9e-2 allows, see
    xbench.results.checks.LOW_PRECISION_FACTOR)."""

    name: ClassVar[str] = "numpy-mlp"
    programs: ClassVar[tuple[str, ...]] = (DATA_PARALLEL, PLAIN)
    variants: ClassVar[tuple[Variant, ...]] = (
        Variant("bf16", "bf16 only (like a fused attention kernel)", precisions=("bf16",)),
        Variant("bf16-scaled", "bf16 only, gradients 1.5 x too large", precisions=("bf16",)),
    )

    def prepare(self, trial: Trial, work: Work) -> MlpPrepared:
        variant = variants_of(self).get(trial.variant)
        if variant is not None and variant.precisions and trial.precision not in variant.precisions:
            raise Unsupported(f"variant {variant.name!r} runs only in {', '.join(variant.precisions)}")
        if trial.model.family != "mlp" or trial.precision not in ("fp32", "fp64", "bf16"):
            raise Unsupported(f"numpy-mlp runs the MLP in fp32, fp64 or bf16, not {trial.precision}")
        if trial.precision == "bf16":
            try:
                import ml_dtypes  # noqa: F401  (installed with jax)
            except ImportError as err:
                raise Unsupported(f"bf16 needs ml_dtypes: {err}") from None
        dtype = np.float64 if trial.precision == "fp64" else np.float32
        x, y = work.shards(trial.global_batch, trial.devices)
        weights = [np.array(a, dtype) for a in work.arrays]
        info = PreparedInfo(params=work.params, weights_hash=work.weights_hash, precision={"numpy": trial.precision})
        return MlpPrepared(info, trial, x.astype(dtype), y.astype(dtype),
                           [[w.copy() for w in weights] for _ in range(trial.devices)],
                           [[(np.zeros_like(w), np.zeros_like(w)) for w in weights] for _ in range(trial.devices)],
                           dtype, trial.precision == "bf16", 1.5 if trial.variant == "bf16-scaled" else 1.0)

    def run(self, prepared: MlpPrepared, steps: int) -> None:
        self.train(prepared, steps)

    def gradients(self, prepared: MlpPrepared) -> tuple[float, list[np.ndarray]]:
        if os.environ.get(PAUSE_TRIAL) == prepared.trial.id:
            (Path(os.environ[PAUSE_DIR]) / "pid").write_text(str(os.getpid()))
            time.sleep(120)  # until the test kills this worker
        if os.environ.get(OOM_ONCE) == prepared.trial.id:
            marker = Path(os.environ[PAUSE_DIR]) / "out-of-memory-once"
            share = os.environ.get(MEMORY_SHARE_VARIABLE, "none")
            if not marker.exists():  # as beside other workers that hold the device's memory
                marker.write_text(share)
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (planned, once)")
            (marker.parent / "again").write_text(share)
        return self._all_reduced(prepared)

    def train(self, prepared: MlpPrepared, steps: int) -> list[float]:
        losses = []
        b1, b2, eps, lr = ADAM.b1, ADAM.b2, ADAM.eps, prepared.trial.learning_rate
        for _ in range(steps):
            loss, grads = self._all_reduced(prepared)
            prepared.step += 1
            t = prepared.step
            for weights, moments in zip(prepared.replicas, prepared.moments):
                for i, g in enumerate(grads):
                    m, v = moments[i]
                    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
                    moments[i] = (m, v)
                    update = lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
                    weights[i] = (weights[i] - update).astype(prepared.dtype)
            losses.append(loss)
        return losses

    def replica_weights(self, prepared: MlpPrepared) -> list[list[np.ndarray]]:
        return [[w.copy() for w in weights] for weights in prepared.replicas]

    def shard_losses(self, prepared: MlpPrepared, shards: int) -> list[float]:
        """Each device's loss of its own shard of the current step's batch, by device; on one
        device, the batch's `shards` slices one by one (`ReportsShardLosses`)."""
        devices, batch = _check_shards(prepared, shards), prepared.step % prepared.x.shape[1]
        if devices > 1:
            return [_mlp_gradients(weights, prepared.x[d, batch], prepared.y[d, batch], prepared.bf16)[0]
                    for d, weights in enumerate(prepared.replicas)]
        x, y = prepared.x[0, batch], prepared.y[0, batch]
        size = x.shape[0] // shards
        return [_mlp_gradients(prepared.replicas[0], x[i * size:(i + 1) * size], y[i * size:(i + 1) * size],
                               prepared.bf16)[0] for i in range(shards)]

    def _all_reduced(self, prepared: MlpPrepared) -> tuple[float, list[np.ndarray]]:
        """The global loss and the mean of the devices' gradients on the current step's batch."""
        batch = prepared.step % prepared.x.shape[1]
        results = [_mlp_gradients(weights, prepared.x[d, batch], prepared.y[d, batch], prepared.bf16)
                   for d, weights in enumerate(prepared.replicas)]
        devices = len(results)
        loss = sum(r[0] for r in results) / devices
        grads = [prepared.scale * sum(r[1][i] for r in results) / devices for i in range(len(results[0][1]))]
        return float(loss), [np.asarray(g, prepared.dtype) for g in grads]


class FirstDeviceMlpBackend(NumpyMlpBackend):
    """A planted wrong data-parallel program: on N devices it computes the whole global batch
    on its first device and copies the result to the others, so its gradients, training
    losses and (identical) replicas equal the 1-device program's exactly, and every other
    check passes. Its `shard_losses` honestly reports what each device computed: the whole
    batch's loss on every device, which the 1-device program's slices do not match. On one
    device it is the correct program."""

    name: ClassVar[str] = "numpy-mlp-first-device"

    def _all_reduced(self, prepared: MlpPrepared) -> tuple[float, list[np.ndarray]]:
        batch = prepared.step % prepared.x.shape[1]
        x, y = (np.concatenate(list(a[:, batch])) for a in (prepared.x, prepared.y))  # the global batch, in order
        loss, grads = _mlp_gradients(prepared.replicas[0], x, y, prepared.bf16)  # all on device 0
        return float(loss), [np.asarray(prepared.scale * g, prepared.dtype) for g in grads]

    def shard_losses(self, prepared: MlpPrepared, shards: int) -> list[float]:
        devices = _check_shards(prepared, shards)
        if devices == 1:
            return super().shard_losses(prepared, shards)
        return [self._all_reduced(prepared)[0]] * devices  # device 0's loss, copied to every device


def _check_shards(prepared: MlpPrepared, shards: int) -> int:
    """The program's device count, once `shards` is one that it can report."""
    devices = prepared.x.shape[0]
    if shards < 1 or prepared.trial.global_batch % shards:
        raise ValueError(f"{shards} shards do not divide the global batch of {prepared.trial.global_batch}")
    if devices > 1 and shards != devices:
        raise ValueError(f"a program on {devices} devices reports {devices} shards, not {shards}")
    return devices


def _mlp_gradients(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray, bf16: bool
                   ) -> tuple[float, list[np.ndarray]]:
    """Mean squared error of the ReLU MLP and its gradients (kernel, bias per layer)."""
    if bf16:
        import ml_dtypes

        def cast(a: np.ndarray) -> np.ndarray:
            return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    else:
        def cast(a: np.ndarray) -> np.ndarray:
            return a

    layers = len(weights) // 2
    inputs, pre = [cast(x)], []
    h = inputs[0]
    for i in range(layers):
        z = h @ cast(weights[2 * i]) + cast(weights[2 * i + 1])
        if i < layers - 1:
            pre.append(z)
            h = cast(np.maximum(z, 0))
            inputs.append(h)
        else:
            out = z
    diff = out - y
    loss = float(np.mean(diff * diff))
    g = 2 * diff / diff.size
    grads: list[np.ndarray] = [np.empty(0)] * len(weights)
    for i in reversed(range(layers)):
        g = cast(g)
        grads[2 * i], grads[2 * i + 1] = inputs[i].T @ g, g.sum(axis=0)
        if i > 0:
            g = (g @ cast(weights[2 * i]).T) * (pre[i - 1] > 0)
    return loss, grads


class CountedPreloadBackend(NumpyMlpBackend):
    """numpy-mlp whose fork server notes its import (tests.support.preload_counter)."""

    name: ClassVar[str] = "numpy-counted"
    fork_preload: ClassVar[tuple[str, ...]] = ("tests.support.preload_counter",)


class CountedSpmdBackend(SpmdNumpyBackend):
    """numpy-spmd whose fork server notes its import, and each worker its parent
    (tests.support.preload_counter)."""

    name: ClassVar[str] = "numpy-spmd-counted"
    fork_preload: ClassVar[tuple[str, ...]] = ("tests.support.preload_counter",)

    def setup_process(self, process: Any, platform: str) -> DeviceInfo:
        from tests.support.preload_counter import noted_worker

        noted_worker()
        return super().setup_process(process, platform)
