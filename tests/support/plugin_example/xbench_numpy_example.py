"""`numpy-example`: an xbench backend plugin in pure numpy, the worked example of
docs/writing-a-backend.md.

The same data-parallel training step as every backend: the core's MLP (Dense layers from
`work.weights`, ReLU, inverted dropout, a final linear layer), the MSE loss averaged over the
batch and the outputs, hand-written backpropagation, and the contract's Adam. The "devices"
are simulated in this one process (the subprocess launcher): each computes the gradient of
its own shard in turn, then the "all-reduce" averages the gradients over the devices, and
every device applies the mean to its own copy of the weights. float32 throughout.

It uses only `xbench.contract`, the public plugin API. numpy is xbench's own dependency and
already imported by `xbench.contract`, so importing it at module level costs nothing here; a
plugin for a real framework imports that framework inside `setup`, never at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from xbench.contract import (
    ADAM,
    Availability,
    DeviceInfo,
    DeviceUnavailable,
    PreparedInfo,
    Trial,
    Unsupported,
    Work,
    hash_arrays,
    probe_distributions,
)

SIMULATED_DEVICES = 8  # as many "devices" as the built-in backends simulate on a CPU


@dataclass
class Replica:
    """One simulated device's state: kernels and biases in layer order, Adam's moments, and
    the generator of its dropout masks."""

    weights: list[np.ndarray]
    m: list[np.ndarray]
    v: list[np.ndarray]
    rng: np.random.Generator


@dataclass
class NumpyPrepared:
    info: PreparedInfo  # the only field the core reads
    replicas: list[Replica]
    xs: np.ndarray  # [devices, batches, per_device_batch, inputs]: work.shards(...)
    ys: np.ndarray
    dropout: float
    learning_rate: float
    all_reduce: bool  # False: the compute-only twin, each replica applies its own gradient
    step: int = 0  # steps taken; step k trains on batch k % batches


@dataclass
class NumpyAllReduce:
    buffers: list[np.ndarray]  # one float32 buffer per simulated device


class NumpyExampleBackend:
    name: ClassVar[str] = "numpy-example"  # equals the entry-point name
    install_hint: ClassVar[str] = "pip install numpy"
    launchers: ClassVar[tuple[str, ...]] = ("subprocess",)  # one process drives every device

    def __init__(self) -> None:
        self.devices = 0

    def probe(self) -> Availability:
        # From the installed distributions' metadata; imports nothing.
        return probe_distributions("numpy", ("numpy",), self.install_hint)

    def validate_options(self, options: dict[str, Any]) -> None:
        for key in options:
            raise ValueError(f"unknown option {key!r}; numpy-example takes no options")

    def setup(self, devices: int, platform: str) -> DeviceInfo:
        if platform == "gpu":
            raise DeviceUnavailable("numpy-example runs on the CPU only")
        if devices > SIMULATED_DEVICES:
            raise DeviceUnavailable(f"asked for {devices} devices; numpy-example simulates at most {SIMULATED_DEVICES}")
        self.devices = devices
        return DeviceInfo(framework="numpy", framework_version=np.__version__, platform="cpu",
                          device_names=tuple(f"numpy:{i}" for i in range(devices)), simulated=True,
                          available=SIMULATED_DEVICES,
                          details={"simulation": "one process computes each device's shard in turn"})

    def prepare(self, trial: Trial, work: Work) -> NumpyPrepared:
        if trial.devices != self.devices:
            raise ValueError(f"trial {trial.id} wants {trial.devices} devices; setup made {self.devices}")
        # Precision is set explicitly: numpy has no tf32 or bf16 matmul, so those are refused
        # (the trial's record says "unsupported" with this reason).
        if trial.precision != "fp32":
            raise Unsupported(f"numpy-example computes in float32 only, not {trial.precision!r}")
        dtype = np.float32
        xs, ys = (a.astype(dtype) for a in work.shards(trial.global_batch, trial.devices))
        replicas = []
        for rank in range(trial.devices):
            weights = [np.array(a, dtype=dtype) for a in work.flat_weights]  # the core's weights, copied
            replicas.append(Replica(weights, [np.zeros_like(w) for w in weights], [np.zeros_like(w) for w in weights],
                                    np.random.default_rng([trial.seed, rank])))  # each device its own masks
        held = replicas[0].weights  # read back what the "framework" holds, not work.weights
        info = PreparedInfo(
            params=sum(w.size for w in held),
            weights_hash=hash_arrays(held),
            precision={"param_dtype": str(held[0].dtype), "compute_dtype": str(np.result_type(xs, *held))},
            notes=("devices simulated in one process: each step computes the shards' gradients in turn",
                   "all-reduce: the mean of the devices' gradients, in numpy" if trial.all_reduce
                   else "compute-only: no all-reduce, each replica applies its own gradient"),
        )
        return NumpyPrepared(info, replicas, xs, ys, work.model.dropout, trial.learning_rate, trial.all_reduce)

    def run(self, prepared: NumpyPrepared, steps: int) -> None:
        for _ in range(steps):  # numpy is synchronous: done means done
            _train_step(prepared)

    def memory_peak_bytes(self, prepared: NumpyPrepared) -> dict[str, Any] | None:
        return None  # numpy keeps no peak-memory counter

    # -- all-reduce microbenchmark capability (xbench allreduce, --breakdown) ---------------

    def allreduce_prepare(self, nbytes: int, options: dict[str, Any]) -> NumpyAllReduce:
        self.validate_options(options)
        return NumpyAllReduce([np.ones(nbytes // 4, np.float32) for _ in range(self.devices)])

    def allreduce_run(self, prepared: NumpyAllReduce, iterations: int) -> None:
        """SUM all-reduce in place: every buffer becomes the sum of all of them."""
        total = np.empty_like(prepared.buffers[0])
        with np.errstate(over="ignore"):  # values grow to inf; a sum's cost does not change
            for _ in range(iterations):
                np.copyto(total, prepared.buffers[0])
                for buffer in prepared.buffers[1:]:
                    total += buffer
                for buffer in prepared.buffers:
                    np.copyto(buffer, total)

    # -- verification capability (xbench verify) -------------------------------------------

    def gradients(self, prepared: NumpyPrepared) -> tuple[float, list[np.ndarray]]:
        """Global-batch loss and the gradient the step applies (replica 0), at the current
        weights on the current step's batch; no step is taken."""
        loss, grads = _data_parallel_gradients(prepared)
        return loss, grads[0]

    def train(self, prepared: NumpyPrepared, steps: int) -> list[float]:
        return [_train_step(prepared) for _ in range(steps)]

    def replica_weights(self, prepared: NumpyPrepared) -> list[list[np.ndarray]]:
        return [[w.copy() for w in replica.weights] for replica in prepared.replicas]


def _train_step(p: NumpyPrepared) -> float:
    """One data-parallel step on every simulated device; the global-batch mean loss."""
    loss, grads = _data_parallel_gradients(p)
    p.step += 1
    for replica, g in zip(p.replicas, grads):
        _adam(replica, g, p.step, p.learning_rate)
    return loss


def _data_parallel_gradients(p: NumpyPrepared) -> tuple[float, list[list[np.ndarray]]]:
    """Each device's gradient on its shard of this step's batch, then the all-reduce (unless
    compute-only); the mean of the devices' losses (equal shards: the global-batch loss) and
    the gradient each replica applies."""
    batch = p.step % p.xs.shape[1]
    results = [_loss_and_grads(r.weights, p.xs[k, batch], p.ys[k, batch], p.dropout, r.rng)
               for k, r in enumerate(p.replicas)]
    grads = [g for _, g in results]
    if p.all_reduce:
        mean = [np.stack(per_device).sum(axis=0) / len(grads) for per_device in zip(*grads)]
        grads = [mean] * len(grads)
    return float(np.mean([loss for loss, _ in results])), grads


def _loss_and_grads(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray, dropout: float,
                    rng: np.random.Generator) -> tuple[float, list[np.ndarray]]:
    """MSE loss of one device's batch and its gradient, kernels and biases in layer order."""
    layers = len(weights) // 2
    inputs, gates = [], []  # each layer's input; each hidden layer's ReLU x dropout factor
    h = x
    for i in range(layers):
        inputs.append(h)
        z = h @ weights[2 * i] + weights[2 * i + 1]
        if i == layers - 1:
            h = z  # the final layer is linear
            break
        gate = (z > 0).astype(np.float32)  # ReLU
        if dropout:  # inverted dropout: keep with probability 1 - p, scale the kept by 1 / (1 - p)
            gate *= (rng.random(z.shape, dtype=np.float32) >= dropout) / np.float32(1 - dropout)
        gates.append(gate)
        h = z * gate
    diff = h - y
    loss = np.mean(diff ** 2)  # over the batch and the outputs, as jnp.mean((pred - y) ** 2)
    d = diff * np.float32(2 / diff.size)  # dloss/dpred
    grads: list[Any] = [None] * len(weights)
    for i in reversed(range(layers)):
        grads[2 * i] = inputs[i].T @ d
        grads[2 * i + 1] = d.sum(axis=0)
        if i:
            d = (d @ weights[2 * i].T) * gates[i - 1]
    return float(loss), grads


def _adam(replica: Replica, grads: list[np.ndarray], t: int, learning_rate: float) -> None:
    """contract.ADAM, Kingma and Ba's Algorithm 1: bias-corrected moments, eps added to
    sqrt(v_hat) (optax's and torch's form), in place. `t` counts steps from 1."""
    b1, b2, eps = ADAM.b1, ADAM.b2, ADAM.eps
    for w, m, v, g in zip(replica.weights, replica.m, replica.v, grads):
        m[...] = b1 * m + (1 - b1) * g
        v[...] = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** t)
        w -= learning_rate * (m_hat / (np.sqrt(v_hat) + eps))
