"""`tf`: a Keras 3 model of any built-in family trained with Adam in a custom loop under
`tf.distribute.MirroredStrategy`; `strategy.run` inside a `tf.function`.

Keras 3's `apply_gradients` sum-reduces gradients across replicas, so the per-replica loss is
scaled with `tf.nn.compute_average_loss(..., global_batch_size=GB)` (Keras sums gradients over replicas), and the
optimizer's slots are built inside the strategy scope before the loop (built lazily inside a tf.function, they fail).

With the spmd launcher (one process per device) the same program runs under
`tf.distribute.MultiWorkerMirroredStrategy`, from a TF_CONFIG built from the job's `Process`:
RING collectives on CPU, NCCL on GPUs.

The plain program (`trial.program == "plain"`) is what a user writes for one device without a
strategy: the same model, Adam and step, called directly. The `xla` variant compiles each
replica's forward and backward with `tf.function(jit_compile=True)`, in either program. The
`fsdp` variant (sharded data parallelism, as `jax` and `torch` have it) is declared so that it
is asked of TensorFlow too, and refused with the reason (`FSDP_REASON`), as is `fsdp-remat`
(the same, its blocks recomputed). The `remat` variant (transformer) recomputes each block in
the backward pass through `keras.remat`, in either program.

The models (`mlp`, `transformer`, `cnn`, `lstm`), their per-example losses and the mapping of
their variables to the core's canonical parameters are in `models`; the step programs here
are the same for every family. Gradients and weights read back in canonical order and layout.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from xbench.contract import (
    ADAM,
    ALL_GATHER,
    AS_WRITTEN,
    DATA_PARALLEL,
    PLAIN,
    Availability,
    DeviceInfo,
    DeviceUnavailable,
    PreparedInfo,
    Process,
    Trial,
    Unsupported,
    Variant,
    Work,
    hash_weights,
    probe_distributions,
)
from xbench_backends import recompute
from xbench_backends.sharding import FSDP, FSDP_FAMILIES, FSDP_REMAT, SHARDED
from xbench_backends.tf.models import FAMILIES, Built, build

SIMULATED_DEVICE_LIMIT = 8
CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical", "reduce-to-one")
OPTIONS = {"cross_device_ops": CROSS_DEVICE_OPS}
# trial.precision -> Keras global dtype policy. "fp64" (verify's CNN runs): float64 variables,
# inputs, activations, BatchNorm statistics, losses, gradients, all-reduce and Adam state.
KERAS_POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16", "fp64": "float64"}
VARIANTS = (Variant("xla", "XLA: jit_compile=True on the per-replica forward and backward", same_formula=True),
            Variant(FSDP, "sharded data parallelism: unsupported, TensorFlow has no sharded data-parallel strategy",
                    families=FSDP_FAMILIES, programs=(DATA_PARALLEL,)),
            recompute.variant("keras.remat around each block: tf.recompute_grad"),
            Variant(FSDP_REMAT, "fsdp with each transformer block recomputed: unsupported, as fsdp",
                    families=recompute.REMAT_FAMILIES, programs=(DATA_PARALLEL,)))
# Checked in TensorFlow 2.21 and Keras 3.15: nothing in tf.distribute shards a data-parallel
# program's variables over its own replicas (ZeRO/FSDP); what comes closest is not one.
FSDP_REASON = ("TensorFlow has no sharded data-parallel strategy: MirroredStrategy and MultiWorkerMirroredStrategy "
               "replicate every variable, ParameterServerStrategy keeps variables on parameter-server tasks for "
               "asynchronous training, and Keras 3's ModelParallel layouts are a prototype on the TensorFlow backend "
               "(its distribution_lib says 'DO NOT USE'; distribute_value is unimplemented)")


@dataclass
class TfPrepared:
    info: PreparedInfo
    train: Any  # tf.function: (start step) -> None; `steps_per_call` steps
    one_step: Any  # tf.function: (step) -> per-replica losses; the same replica step
    gradients: Any  # tf.function: (step) -> per-replica (loss, all-reduced gradients)
    strategy: Any  # None for the plain program: its results are the one replica's
    variables: list[Any]  # the trainable variables in canonical order
    canonical: Any  # arrays of `variables` -> canonical layout (models.Built.canonical)
    steps_per_call: int
    next_step: int = 0
    # tf.function: (step, slices) -> per-replica losses of `slices` slices of each replica's batch
    shard_losses: Any = None
    global_batch: int = 0
    model: Any = None  # the Keras model


@dataclass
class TfAllReduce:
    reduce: Any  # tf.function: one all-reduce (or all-gather)


class TfMirroredBackend:
    name: ClassVar[str] = "tf"
    install_hint: ClassVar[str] = "pip install 'xbench[tf]'"
    launchers: ClassVar[tuple[str, ...]] = ("subprocess", "spmd")
    programs: ClassVar[tuple[str, ...]] = (DATA_PARALLEL, PLAIN)
    variants: ClassVar[tuple[Variant, ...]] = VARIANTS
    families: ClassVar[tuple[str, ...]] = FAMILIES
    # Imported once by the fork server (xbench.run.zygote); neither starts TensorFlow's runtime.
    fork_preload: ClassVar[tuple[str, ...]] = ("tensorflow", "keras")

    def __init__(self) -> None:
        self.device_names: list[str] = []
        self.platform = ""
        self.strategies: dict[str, Any] = {}
        self.multi_worker: Any = None  # the MultiWorkerMirroredStrategy of an spmd job

    def probe(self) -> Availability:
        # tensorflow-cpu and tensorflow both provide the module; accept either distribution.
        for dist in ("tensorflow", "tensorflow-cpu"):
            availability = probe_distributions(dist, (dist, "keras"), self.install_hint)
            if availability.installed:
                return availability
        return availability

    def validate_options(self, options: dict[str, Any]) -> None:
        for key, value in options.items():
            if key not in OPTIONS:
                raise ValueError(f"unknown option {key!r}; known: {', '.join(OPTIONS)}")
            if value not in OPTIONS[key]:
                raise ValueError(f"{key} must be one of {', '.join(OPTIONS[key])}, got {value!r}")

    def setup(self, devices: int, platform: str) -> DeviceInfo:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if platform == "gpu" and not gpus:
            raise DeviceUnavailable("tensorflow finds no GPU")
        if gpus and platform != "cpu":
            if devices > len(gpus):
                raise DeviceUnavailable(f"asked for {devices} devices; tensorflow sees {len(gpus)} GPU(s)")
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)  # else TF grabs the GPU's memory
            self.platform, available = "gpu", len(gpus)
            names = [d.name for d in tf.config.list_logical_devices("GPU")]
        else:
            if devices > SIMULATED_DEVICE_LIMIT:
                raise DeviceUnavailable(
                    f"asked for {devices} simulated CPU devices; xbench allows {SIMULATED_DEVICE_LIMIT}")
            if gpus:
                tf.config.set_visible_devices([], "GPU")
            # Must happen before the runtime starts: TF refuses logical devices afterwards.
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(devices)])
            self.platform, available = "cpu", SIMULATED_DEVICE_LIMIT
            names = [d.name for d in tf.config.list_logical_devices("CPU")]
        self.device_names = names[:devices]
        import keras

        return DeviceInfo(
            framework="tensorflow",
            framework_version=tf.__version__,
            platform=self.platform,
            device_names=tuple(self.device_names),
            simulated=self.platform == "cpu",
            available=available,
            details={"keras": keras.__version__},
        )

    def setup_process(self, process: Process, platform: str) -> DeviceInfo:
        """One device per process: a TF_CONFIG cluster of `world_size` workers and
        MultiWorkerMirroredStrategy, created before anything else runs in TensorFlow."""
        try:
            workers = [process.address(r) for r in range(process.world_size)]
        except ValueError as err:
            raise DeviceUnavailable(f"TF_CONFIG needs every worker's address: {err}") from None
        os.environ["TF_CONFIG"] = json.dumps({
            "cluster": {"worker": workers},
            "task": {"type": "worker", "index": process.rank},
        })
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if platform == "gpu" and not gpus:
            raise DeviceUnavailable("tensorflow finds no GPU")
        use_gpu = bool(gpus) and platform != "cpu"
        if use_gpu:
            if process.local_rank >= len(gpus):
                raise DeviceUnavailable(f"local rank {process.local_rank}, but tensorflow sees {len(gpus)} GPU(s)")
            tf.config.set_visible_devices([gpus[process.local_rank]], "GPU")
            tf.config.experimental.set_memory_growth(gpus[process.local_rank], True)  # else TF grabs it all
        elif gpus:
            tf.config.set_visible_devices([], "GPU")
        implementation = (tf.distribute.experimental.CommunicationImplementation.NCCL if use_gpu
                          else tf.distribute.experimental.CommunicationImplementation.RING)
        self.multi_worker = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(implementation=implementation))
        self.platform = "gpu" if use_gpu else "cpu"
        self.device_names = list(self.multi_worker.extended.worker_devices)
        import keras

        return DeviceInfo(
            framework="tensorflow",
            framework_version=tf.__version__,
            platform=self.platform,
            device_names=tuple(self.device_names),
            simulated=not use_gpu,
            available=process.local_world_size,
            details={"keras": keras.__version__, "strategy": "MultiWorkerMirroredStrategy",
                     "collectives": implementation.name, "workers": process.world_size},
        )

    def all_gather(self, values: list[float]) -> list[list[float]]:
        """Every worker's `values`, by task index, through the strategy's collectives."""
        import tensorflow as tf

        strategy = self.multi_worker
        local = strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant([values], tf.float64))
        return [[float(v) for v in row] for row in strategy.gather(local, axis=0).numpy()]

    def prepare(self, trial: Trial, work: Work) -> TfPrepared:
        if trial.variant in SHARDED:
            raise Unsupported(FSDP_REASON)  # before TensorFlow is even imported
        jit_compile = _jit_compile(trial.variant)  # refuses an unknown one before touching TensorFlow
        remat = trial.variant == recompute.REMAT
        if remat and (why := recompute.refusal(trial.model.family)):
            raise Unsupported(why)
        import tensorflow as tf

        # Explicit, never the default: TF allows TF32 on GPUs unless told otherwise.
        tf.config.experimental.enable_tensor_float_32_execution(trial.precision == "tf32")
        import keras

        # Global in Keras: set for every trial, so one trial's policy never leaks into the next.
        if trial.precision not in KERAS_POLICIES:
            raise Unsupported(f"precision {trial.precision!r} is not one the tf backend knows: "
                              f"{', '.join(KERAS_POLICIES)}")
        keras.mixed_precision.set_global_policy(KERAS_POLICIES[trial.precision])
        if self.platform == "gpu":
            for i in range(len(tf.config.list_logical_devices("GPU"))):
                tf.config.experimental.reset_memory_stats(f"GPU:{i}")  # peaks per trial
        if trial.program == PLAIN:
            strategy, scope, notes = None, tf.device(self._plain_device(trial)), (
                f"program=plain: no strategy, the step called directly on {self.device_names[0]}",)
        else:
            strategy = self._strategy(trial.options.get("cross_device_ops", "auto"))
            scope, notes = strategy.scope(), (
                f"program=data-parallel: strategy.run under "
                f"{'MirroredStrategy' if self.multi_worker is None else 'MultiWorkerMirroredStrategy'}",
                f"cross_device_ops={type(strategy.extended._cross_device_ops).__name__}")
        with scope:
            built = build(work, jit_compile, remat=remat)
            optimizer = _optimizer(trial.learning_rate, all_reduce=trial.all_reduce)
            optimizer.build(built.variables)  # before the loop: slots built lazily in a tf.function fail
            x_all, y_all = _data(strategy, work, trial.global_batch, float64=trial.precision == "fp64")
        train, one_step, gradients, shard_losses = _programs(
            _on_replicas(strategy), built, optimizer, x_all, y_all, trial,
            batches=work.x.shape[0] // trial.global_batch, jit_compile=jit_compile)
        info = PreparedInfo(
            # Keras's own count of trainable parameters (a tied embedding counts once).
            params=sum(int(np.prod(v.shape)) for v in built.model.trainable_variables),
            weights_hash=hash_weights(built.canonical([v.numpy() for v in built.variables])),
            precision={"tensor_float_32_execution": tf.config.experimental.tensor_float_32_execution_enabled(),
                       "keras_policy": keras.mixed_precision.global_policy().name},
            notes=notes + built.notes,
            # tf.function, XLA-compiled in the `xla` variant: no persistent compilation cache
            # (TF's XLA one, --tf_xla_persistent_cache_directory, only if TF_XLA_FLAGS sets it);
            # cuDNN autotuning unless turned off.
            settings={"variant": trial.variant, "jit_compile": jit_compile,
                      "TF_CUDNN_USE_AUTOTUNE": os.environ.get("TF_CUDNN_USE_AUTOTUNE", "1 (default)"),
                      "TF_XLA_FLAGS": os.environ.get("TF_XLA_FLAGS", ""), "compile_cache": None},
        )
        return TfPrepared(info, train, one_step, gradients, strategy, built.variables, built.canonical,
                          trial.protocol.steps_per_call, shard_losses=shard_losses, global_batch=trial.global_batch,
                          model=built.model)

    def _plain_device(self, trial: Trial) -> str:
        """The one device of the plain program. Under the spmd launcher it is built the same
        way (this worker's device, no strategy): one process, one device, and the job's
        MultiWorkerMirroredStrategy stays unused."""
        if trial.devices != 1:
            raise ValueError(f"the plain program runs on one device, not {trial.devices}")
        return self.device_names[0]

    def run(self, prepared: TfPrepared, steps: int) -> None:
        import tensorflow as tf

        for _ in range(steps // prepared.steps_per_call):
            prepared.train(tf.constant(prepared.next_step, dtype=tf.int64))
            prepared.next_step += prepared.steps_per_call
        self._sync()  # waits for every local device's pending work

    def _sync(self) -> None:
        """Wait for this process's devices' pending work (tf.test.experimental.sync_devices,
        restricted to local devices: under MultiWorkerMirroredStrategy it would also try
        the other workers' devices, and fail)."""
        import tensorflow as tf

        if self.multi_worker is None:
            tf.test.experimental.sync_devices()
            return
        for device in self.device_names:
            with tf.device(device):
                tf.raw_ops.SyncDevice()
        from tensorflow.python.eager import context  # async_wait has no public name

        context.async_wait()

    def memory_peak_bytes(self, prepared: TfPrepared) -> dict[str, Any] | None:
        """Each GPU's peak bytes allocated by TensorFlow during this trial; None on CPU."""
        import tensorflow as tf

        if self.platform != "gpu":
            return None
        return {"peak_bytes": [int(tf.config.experimental.get_memory_info(f"GPU:{i}")["peak"])
                               for i in range(len(tf.config.list_logical_devices("GPU")))], "scope": "trial"}

    # -- all-reduce microbenchmark capability (xbench allreduce, --breakdown) ---------------

    def allreduce_prepare(self, nbytes: int, options: dict[str, Any]) -> TfAllReduce:
        """A float32 buffer of `nbytes` on every replica and a SUM all-reduce through the
        strategy's cross-device ops (the ones the training step uses)."""
        import tensorflow as tf

        def reduce(x):
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, x)

        return self._replica_op(reduce, nbytes // 4, options)

    def allreduce_run(self, prepared: TfAllReduce, iterations: int) -> None:
        for _ in range(iterations):
            prepared.reduce()
        self._sync()

    def collective_prepare(self, collective: str, nbytes: int, options: dict[str, Any]) -> TfAllReduce:
        """An all-gather through the replica context (each replica's share of nbytes, the
        gathered buffer); no reduce-scatter: the strategy's replica context has none."""
        import tensorflow as tf

        if collective != ALL_GATHER:
            raise Unsupported(f"no {collective} in tf.distribute: MirroredStrategy's replica context offers "
                              "all_reduce and all_gather only")

        def gather(x):
            return tf.distribute.get_replica_context().all_gather(x, axis=0)

        return self._replica_op(gather, nbytes // 4 // self._replicas(options), options)

    def collective_run(self, prepared: TfAllReduce, iterations: int) -> None:
        self.allreduce_run(prepared, iterations)

    def _replicas(self, options: dict[str, Any]) -> int:
        return self._strategy(options.get("cross_device_ops", "auto")).num_replicas_in_sync

    def _replica_op(self, op, count: int, options: dict[str, Any]) -> TfAllReduce:
        """`op` of a float32 buffer of `count` elements on every replica, as one tf.function."""
        import tensorflow as tf

        strategy = self._strategy(options.get("cross_device_ops", "auto"))

        def on_replica(context):
            with tf.device(_replica_device(strategy, context)):
                return tf.ones([count], tf.float32)

        buffer = strategy.experimental_distribute_values_from_function(on_replica)

        @tf.function
        def run():
            return strategy.run(op, args=(buffer,))

        return TfAllReduce(run)

    # -- verification capability (xbench verify) -------------------------------------------

    def gradients(self, prepared: TfPrepared) -> tuple[float, list[np.ndarray]]:
        import tensorflow as tf

        losses, grads = prepared.gradients(tf.constant(prepared.next_step, dtype=tf.int64))
        return _global_loss(prepared.strategy, losses), prepared.canonical(
            [_first_replica(prepared.strategy, g).numpy() for g in grads])

    def train(self, prepared: TfPrepared, steps: int) -> list[float]:
        import tensorflow as tf

        result = []
        for _ in range(steps):
            losses = prepared.one_step(tf.constant(prepared.next_step, dtype=tf.int64))
            prepared.next_step += 1
            result.append(_global_loss(prepared.strategy, losses))
        return result

    def shard_losses(self, prepared: TfPrepared, shards: int) -> list[float]:
        """Each replica's loss of its own share of the current step's batch: `strategy.run` of
        the replica's loss (no scaling by the global batch, no reduction), read with
        `experimental_local_results` in replica order (gathered from every worker under
        MultiWorkerMirroredStrategy); on one replica (and in the plain program), the batch's
        `shards` slices, each its own forward pass. Untimed; no variable changes (BatchNorm's
        moving statistics and the dropout seed included: `keras.StatelessScope`)."""
        import tensorflow as tf

        replicas = 1 if prepared.strategy is None else prepared.strategy.num_replicas_in_sync
        if shards < 1 or prepared.global_batch % shards:
            raise ValueError(f"{shards} shards do not divide the global batch of {prepared.global_batch}")
        if replicas > 1 and shards != replicas:
            raise ValueError(f"a program on {replicas} devices reports {replicas} shards (one per replica), "
                             f"not {shards}")
        losses = prepared.shard_losses(tf.constant(prepared.next_step, dtype=tf.int64), 1 if replicas > 1 else shards)
        if prepared.strategy is None:
            return [float(v) for v in losses.numpy()]
        if self.multi_worker is not None:
            return [float(v) for v in prepared.strategy.gather(losses, axis=0).numpy()]
        return [float(v) for local in prepared.strategy.experimental_local_results(losses) for v in local.numpy()]

    def replica_weights(self, prepared: TfPrepared) -> list[list[np.ndarray]]:
        if prepared.strategy is None:
            return [prepared.canonical([v.numpy() for v in prepared.variables])]
        # Keras variables wrap the strategy's mirrored tf.Variable in `.value`.
        per_variable = [prepared.strategy.experimental_local_results(getattr(v, "value", v))
                        for v in prepared.variables]
        local = [prepared.canonical([values[r].numpy() for values in per_variable])
                 for r in range(len(per_variable[0]))]
        if self.multi_worker is None:
            return local
        return _gather_replicas(prepared.strategy, local)

    def _strategy(self, cross_device_ops: str):
        """One strategy per worker and choice: two MirroredStrategy objects in one process
        reuse collective instance keys, and a later trial's all-reduce then fails."""
        import tensorflow as tf

        if self.multi_worker is not None:
            if cross_device_ops != "auto":
                raise ValueError("cross_device_ops applies to one process driving every device; with one "
                                 "process per device TensorFlow uses collectives (RING on CPU, NCCL on GPU)")
            return self.multi_worker
        if cross_device_ops not in self.strategies:
            self.strategies[cross_device_ops] = tf.distribute.MirroredStrategy(
                devices=self.device_names, cross_device_ops=self._cross_device_ops(cross_device_ops))
        return self.strategies[cross_device_ops]

    def _cross_device_ops(self, choice: str):
        import tensorflow as tf

        if choice == "auto":
            return None  # TensorFlow's own choice; the record's notes name what it chose
        if choice == "nccl" and self.platform != "gpu":
            raise ValueError("cross_device_ops 'nccl' needs GPUs; use 'auto' or 'reduce-to-one' on CPU")
        return {
            "nccl": tf.distribute.NcclAllReduce,
            "hierarchical": tf.distribute.HierarchicalCopyAllReduce,
            "reduce-to-one": tf.distribute.ReductionToOneDevice,
        }[choice]()


def _optimizer(learning_rate: float, all_reduce: bool = True):
    optimizer = _paper_adam()(learning_rate=learning_rate, beta_1=ADAM.b1, beta_2=ADAM.b2, epsilon=ADAM.eps)
    optimizer.all_reduce = all_reduce
    optimizer.exact_learning_rate = float(learning_rate)
    return optimizer


@functools.lru_cache(maxsize=None)
def _paper_adam():
    import keras
    from keras import ops

    class PaperAdam(keras.optimizers.Adam):
        """Keras's Adam with the update of the contract's `Adam`: eps added to sqrt(v_hat).
        (Keras adds it to sqrt(v) and folds the bias correction into the step size.)
        With `all_reduce` False it skips the cross-replica sum, so each replica applies its
        own gradient: the compute-only step. Dtype-generic: the update runs in each variable's
        dtype (its slots have it too); a float64 variable takes the learning rate as the
        Python float, since Keras keeps it in a float32 variable (1e-3 there is 1e-3 + 4.7e-11)."""

        all_reduce = True
        exact_learning_rate: float | None = None

        def _all_reduce_sum_gradients(self, grads_and_vars):
            if self.all_reduce:
                return super()._all_reduce_sum_gradients(grads_and_vars)
            return list(grads_and_vars)

        def update_step(self, gradient, variable, learning_rate):
            dtype = variable.dtype
            if dtype == "float64" and self.exact_learning_rate is not None:
                lr = ops.convert_to_tensor(self.exact_learning_rate, dtype=dtype)
            else:
                lr = ops.cast(learning_rate, dtype)
            g = ops.cast(gradient, dtype)
            t = ops.cast(self.iterations + 1, dtype)
            # Python floats converted straight to `dtype`: ops.cast would make a float32
            # constant first (0.9 -> 0.8999999762 in float64).
            b1, b2 = (ops.convert_to_tensor(beta, dtype=dtype) for beta in (self.beta_1, self.beta_2))
            m = self._momentums[self._get_variable_index(variable)]
            v = self._velocities[self._get_variable_index(variable)]
            self.assign(m, b1 * m + (1 - b1) * g)
            self.assign(v, b2 * v + (1 - b2) * ops.square(g))
            m_hat = m / (1 - ops.power(b1, t))
            v_hat = v / (1 - ops.power(b2, t))
            self.assign_sub(variable, lr * m_hat / (ops.sqrt(v_hat) + self.epsilon))

    return PaperAdam


def _jit_compile(variant: str) -> bool:
    """Whether `variant` compiles the per-replica forward and backward with XLA."""
    known = (AS_WRITTEN, *(v.name for v in VARIANTS))
    if variant not in known:
        raise ValueError(f"unknown variant {variant!r} of tf; known: {', '.join(known)}")
    return variant == "xla"


def _data(strategy, work: Work, global_batch: int, float64: bool = False):
    """The data as [batches, per_device_batch, features] on every replica's device; for the
    plain program (no strategy), plain tensors on the current device. With `float64` the float
    arrays (images, sequences, features, regression targets) are float64; tokens and labels
    keep their integer dtype."""
    import tensorflow as tf

    def dtype(shards: np.ndarray) -> np.ndarray:
        return shards.astype(np.float64) if float64 and np.issubdtype(shards.dtype, np.floating) else shards

    if strategy is None:
        return tuple(tf.identity(tf.constant(dtype(shards[0]))) for shards in work.shards(global_batch, 1))
    replicas = strategy.num_replicas_in_sync
    return tuple(_per_replica(strategy, dtype(shards)) for shards in work.shards(global_batch, replicas))


def _on_replicas(strategy):
    """(fn, args) -> fn's per-replica results: `strategy.run`, or a direct call (plain)."""
    if strategy is None:
        return lambda fn, args: fn(*args)
    return lambda fn, args: strategy.run(fn, args=args)


def _per_replica(strategy, shards: np.ndarray):
    """Each replica's data [batches, per_device_batch, features], resident on its device."""
    import tensorflow as tf

    def on_replica(context):
        replica = context.replica_id_in_sync_group
        # The function runs without a device scope: place each shard on its replica's device.
        with tf.device(_replica_device(strategy, context)):
            return tf.identity(tf.constant(shards[replica]))

    return strategy.experimental_distribute_values_from_function(on_replica)


def _replica_device(strategy, context) -> str:
    """The local device of a replica; replica ids are global under MultiWorkerMirroredStrategy,
    where every worker holds the same number of devices."""
    devices = strategy.extended.worker_devices
    return devices[context.replica_id_in_sync_group % len(devices)]


def _global_loss(strategy, losses) -> float:
    """The global mean loss: per-replica losses are pre-scaled by 1/global batch, so their
    sum over every replica (of every worker); the plain program's one loss already is."""
    import tensorflow as tf

    if strategy is None:
        return float(losses)
    return float(strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None).numpy())


def _first_replica(strategy, value):
    return value if strategy is None else strategy.experimental_local_results(value)[0]


def _gather_replicas(strategy, local: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """Every worker's replicas' weights, by global replica id (flattened on the way)."""
    import tensorflow as tf

    shapes = [w.shape for w in local[0]]
    flat = [np.concatenate([w.ravel() for w in replica]) for replica in local]
    value = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(flat[context.replica_id_in_sync_group % len(flat)][None, :]))
    rows = strategy.gather(value, axis=0).numpy()
    splits = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]
    return [[part.reshape(shape) for part, shape in zip(np.split(row, splits), shapes)] for row in rows]


def _programs(on_replicas, built: Built, optimizer, x_all, y_all, trial: Trial, batches: int, jit_compile: bool):
    """The timed loop, one step of it, the gradients it applies, and each replica's loss of
    its batch's slices (`shard_losses`), as tf.functions; `on_replicas` (`_on_replicas`) runs a
    replica function on every replica."""
    import keras
    import tensorflow as tf

    model, variables, per_example_loss = built.model, built.variables, built.per_example_loss

    def forward_backward(x, y):
        with tf.GradientTape() as tape:
            per_example = per_example_loss(model, x, y)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=trial.global_batch)
        # Dense gradients: an embedding lookup's alone would be IndexedSlices (a no-op for
        # the dense gradients every other variable has).
        return loss, [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]

    if jit_compile:
        # XLA around each replica's forward and backward only: jit_compile around strategy.run
        # fails across devices, so apply_gradients (the all-reduce and Adam) stays
        # outside, in both programs alike. Keras's own jit_compile=True (model.compile) would
        # also compile the optimizer update. Dropout compiles (Keras draws it with stateless
        # RNG ops), but XLA's generator may give other masks than TF's kernels (verify runs
        # with dropout 0).
        forward_backward = tf.function(forward_backward, jit_compile=True)

    def batch(xs, ys, index):
        return tf.gather(xs, index), tf.gather(ys, index)

    def replica_step(xs, ys, index):
        loss, grads = forward_backward(*batch(xs, ys, index))
        optimizer.apply_gradients(zip(grads, variables))  # all-reduces (SUM) under a strategy
        return loss

    def replica_gradients(xs, ys, index):
        loss, grads = forward_backward(*batch(xs, ys, index))
        # The reduction Keras 3's apply_gradients performs under a strategy, called as it calls
        # it (a private method, on purpose: verify must see what the timed step applies);
        # without a strategy there is one replica, and the sum is the gradient itself.
        reduced = optimizer._all_reduce_sum_gradients(list(zip(grads, variables)))
        return loss, [grad for grad, _ in reduced]

    @tf.function
    def train(start):
        for i in tf.range(trial.protocol.steps_per_call, dtype=tf.int64):
            on_replicas(replica_step, (x_all, y_all, (start + i) % batches))

    @tf.function
    def one_step(step):
        return on_replicas(replica_step, (x_all, y_all, step % batches))

    @tf.function
    def gradients(step):
        return on_replicas(replica_gradients, (x_all, y_all, step % batches))

    def slice_loss(x, y):
        """One slice's mean loss, its own forward pass in training mode (batch statistics and
        dropout as the step has them). Keras's StatelessScope keeps the forward's variable
        updates (BatchNorm's moving statistics, the dropout seed) from being applied; entered
        here, in the replica's thread, as Keras's scopes are per thread."""
        with keras.StatelessScope():
            per_example = per_example_loss(model, x, y)
        return tf.reduce_mean(per_example)

    if jit_compile:  # as the step's forward: XLA around each replica's computation only
        slice_loss = tf.function(slice_loss, jit_compile=True)

    def replica_losses(xs, ys, index, slices: int):
        x, y = batch(xs, ys, index)
        size = x.shape[0] // slices
        return tf.stack([slice_loss(x[i * size:(i + 1) * size], y[i * size:(i + 1) * size]) for i in range(slices)])

    @tf.function
    def shard_losses(step, slices: int):
        return on_replicas(functools.partial(replica_losses, slices=slices), (x_all, y_all, step % batches))

    return train, one_step, gradients, shard_losses
