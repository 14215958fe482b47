"""`jax-shardmap` and `jax-auto`: the `jax` backend's models (every family of `families`),
optimizer, loss and data, stepped with today's JAX data-parallel idioms instead of `jax.pmap`.

- `jax-shardmap`: `jax.jit` over `jax.shard_map` on a 1-D mesh (axis "d"); parameters and
  optimizer state replicated (P()), data sharded on its leading device axis (P("d")), and an
  explicit `lax.pmean` of the gradients inside.
- `jax-auto`: `jax.jit` with `NamedSharding`s and no shard_map; the compiler (GSPMD/Shardy)
  inserts the gradient all-reduce. One program holds the global batch, so BatchNorm (cnn)
  takes its statistics over each device's rows explicitly (`batch_groups`), as `jax` does.

Both run on jax 0.10 and 0.11, where `jax.shard_map` and `jax.lax.pcast` are public; older
jax falls back to `jax.experimental.shard_map` and `lax.pvary` (untested here).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from xbench.contract import ALL_GATHER, DATA_PARALLEL, PreparedInfo, Trial, Unsupported, Work, hash_weights
from xbench_backends.extra_work import ExtraWork
from xbench_backends.jax.families import JaxModel, build, refusal
from xbench_backends.jax.layers import FLOAT64, float64_scope, in_precision
from xbench_backends.jax.nnx_transformer import FSDP_CUDNN
from xbench_backends.jax.pmap import FUNCTIONAL, VARIANTS, JaxPmapBackend, precision_info, program_notes
from xbench_backends.jax.steps import (
    AXIS,
    MATMUL_PRECISION,
    JaxAllReduce,
    JaxCollective,
    check_shards,
    check_variant,
    collective_shape,
    dropout_rng,
    initial_state,
    kernel_settings,
    optimizer,
    shard_loss_fn,
    step_losses,
    train_steps,
)
from xbench_backends.recompute import REMAT
from xbench_backends.sharding import FSDP, FSDP_REMAT


@dataclass
class MeshPrepared:
    info: PreparedInfo
    step: Any  # jitted: (state, xs, ys) -> (state, each step's loss: per device or global)
    grads: Any  # jitted: (state, xs, ys) -> (loss, all-reduced gradients, replicated)
    state: Any  # (params, opt_state, step, key), every leaf replicated over the mesh
    xs: Any
    ys: Any
    steps_per_call: int
    in_order: Any  # a tree shaped like the params -> its leaves in canonical order
    float64: bool = False  # an "fp64" trial: every call runs in x64 mode (`layers.float64_scope`)
    extra: ExtraWork = field(default_factory=ExtraWork)  # the extra_work option's calls (`run` is jax's)
    global_batch: int = 0
    # shards -> jitted (state, xs, ys) -> each device's loss of its share (one device: each
    # slice's), no collective; built and compiled on first use only (`shard_losses`)
    shard_program: Any = None


class _MeshBackend(JaxPmapBackend):
    """What both variants share with `jax` (setup, probe, memory counter, all-reduce loop)
    and with each other (placement, readback, capabilities); subclasses build the programs."""

    launchers: ClassVar[tuple[str, ...]] = ("subprocess",)
    # The plain single-device program is `jax`'s (jit on one device): timed there, not twice.
    programs: ClassVar[tuple[str, ...]] = (DATA_PARALLEL,)
    # `functional` is a variant of the plain program; these programs are functional as written.
    # `fsdp` is `jax`'s sharded program (jit with NamedShardings already): not a variant of these.
    # `remat` changes how a block is differentiated, not how the step is distributed: `jax`'s to time.
    # `fsdp-remat` and `fsdp-cudnn` are `fsdp` and more: `jax`'s.
    variants: ClassVar[tuple] = tuple(v for v in VARIANTS
                                      if v.name not in (FUNCTIONAL, FSDP, REMAT, FSDP_REMAT, FSDP_CUDNN))
    runner: ClassVar[str] = ""  # how the step runs, for the notes

    def prepare(self, trial: Trial, work: Work) -> MeshPrepared:
        import jax

        check_variant(trial, self.variants)
        if trial.program != DATA_PARALLEL:
            raise Unsupported(f"{self.name} has only the data-parallel program; the plain one is jax's")

        jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION[trial.precision])
        float64 = trial.precision == FLOAT64
        with float64_scope(float64):  # x64 for an fp64 trial's calls only (`layers`)
            why = refusal(trial, work, self.devices[0])
            if why:
                raise Unsupported(why)
            mesh = jax.sharding.Mesh(np.array(self.devices), (AXIS,))
            tx = optimizer(trial.learning_rate)
            model = self.model(trial, work)
            state = jax.device_put(initial_state(model.params, tx, trial.seed), _sharding(mesh))
            xs, ys = self.place_data(mesh, *in_precision(work.shards(trial.global_batch, len(self.devices)), trial))
            step, grads, program_notes_ = self.step_programs(trial, work, tx, mesh, model)
            info = PreparedInfo(
                params=sum(int(a.size) for a in jax.tree.leaves(state[0])),
                weights_hash=hash_weights(self.canonical_arrays(model.in_order(state[0]), replica=0)),
                precision=precision_info(trial),
                # Simulated CPU devices can deadlock when collective steps are queued back to back
                # (the all-reduce's rendezvous hangs, then aborts the process): wait for every call.
                sync_every_call=self.devices[0].platform == "cpu",
                notes=(*program_notes(trial, self.runner), *program_notes_, *model.notes),
                settings=kernel_settings(),
            )
        return MeshPrepared(info, step, grads, state, xs, ys, trial.protocol.steps_per_call, model.in_order, float64,
                            ExtraWork.of(trial.options), trial.global_batch,
                            functools.cache(lambda shards: self.shard_program(trial, work, mesh, model, shards)))

    def model(self, trial: Trial, work: Work) -> JaxModel:
        return build(trial, work, self.devices[0])

    def place_data(self, mesh, xs: np.ndarray, ys: np.ndarray):
        """[devices, batches, per_device, ...sample shape], split on the device axis."""
        import jax

        return jax.device_put(xs, _sharding(mesh, AXIS)), jax.device_put(ys, _sharding(mesh, AXIS))

    def step_programs(self, trial: Trial, work: Work, tx, mesh, model: JaxModel) -> tuple[Any, Any, tuple[str, ...]]:
        raise NotImplementedError

    def shard_program(self, trial: Trial, work: Work, mesh, model: JaxModel, shards: int) -> Any:
        """The jitted `(state, xs, ys) -> losses` of `shard_losses`: one per device, in device
        order, each computed on the device that holds that share (one device: one per slice)."""
        raise NotImplementedError

    def canonical_arrays(self, leaves: list, replica: int) -> list[np.ndarray]:
        """Leaves in canonical order (`JaxModel.in_order`), as held (and read back) by device
        `replica`; no device axis here."""
        device = self.devices[replica]

        def held(array) -> np.ndarray:
            return next(np.asarray(s.data) for s in array.addressable_shards if s.device == device)

        return [held(leaf) for leaf in leaves]

    # -- all-reduce microbenchmark capability (xbench allreduce, --breakdown) ---------------

    def allreduce_prepare(self, nbytes: int, options: dict[str, Any]) -> JaxAllReduce:
        """A float32 buffer of `nbytes` on every device, made there, and a shard_map psum."""
        import jax
        import jax.numpy as jnp
        from jax import lax

        mesh = jax.sharding.Mesh(np.array(self.devices), (AXIS,))
        n, count = len(self.devices), nbytes // 4
        buffer = jax.jit(lambda: jnp.ones((n, count), jnp.float32), out_shardings=_sharding(mesh, AXIS))()
        # Donated, so XLA reduces in place as `jax` and torch.distributed do. The psum's result
        # is the same on every device; out_specs P("d") keeps each device's copy where it is.
        psum = _shard_map(lambda x: lax.psum(x, AXIS), mesh, in_specs=_spec(AXIS), out_specs=_spec(AXIS))
        reduce = jax.jit(psum, donate_argnums=0)
        return JaxAllReduce(reduce, buffer, sync_every_call=self.devices[0].platform == "cpu")

    def collective_prepare(self, collective: str, nbytes: int, options: dict[str, Any]) -> JaxCollective:
        """A float32 input on every device, made there, and a shard_map lax.all_gather or
        lax.psum_scatter along each device's row (tiled: one flat buffer each, as NCCL's)."""
        import jax
        import jax.numpy as jnp
        from jax import lax

        mesh = jax.sharding.Mesh(np.array(self.devices), (AXIS,))
        n = len(self.devices)
        count, _ = collective_shape(collective, nbytes, n)
        buffer = jax.jit(lambda: jnp.ones((n, count), jnp.float32), out_shardings=_sharding(mesh, AXIS))()
        if collective == ALL_GATHER:
            def body(x):
                return lax.all_gather(x, AXIS, axis=1, tiled=True)
        else:
            def body(x):
                return lax.psum_scatter(x, AXIS, scatter_dimension=1, tiled=True)
        op = jax.jit(_shard_map(body, mesh, in_specs=_spec(AXIS), out_specs=_spec(AXIS)))
        return JaxCollective(op, buffer, sync_every_call=self.devices[0].platform == "cpu")

    # -- verification capability (xbench verify) -------------------------------------------

    def gradients(self, prepared: MeshPrepared) -> tuple[float, list[np.ndarray]]:
        with float64_scope(prepared.float64):
            loss, grads = prepared.grads(prepared.state, prepared.xs, prepared.ys)
        return float(np.mean(np.asarray(loss))), self.canonical_arrays(prepared.in_order(grads), replica=0)

    def train(self, prepared: MeshPrepared, steps: int) -> list[float]:
        losses: list[float] = []
        with float64_scope(prepared.float64):
            for _ in range(steps // prepared.steps_per_call):
                prepared.state, loss = prepared.step(prepared.state, prepared.xs, prepared.ys)
                losses += step_losses(loss, prepared.steps_per_call)
        return losses

    def shard_losses(self, prepared: MeshPrepared, shards: int) -> list[float]:
        """Each device's loss of its own share of the current step's batch, without the
        reduction, in device order; on one device, the batch's `shards` slices, each its own
        forward pass. Untimed; the state is read, never donated or changed."""
        check_shards(prepared.global_batch, len(self.devices), shards)
        with float64_scope(prepared.float64):
            losses = prepared.shard_program(shards)(prepared.state, prepared.xs, prepared.ys)
            return [float(v) for v in np.asarray(losses).reshape(-1)]

    def replica_weights(self, prepared: MeshPrepared) -> list[list[np.ndarray]]:
        leaves = prepared.in_order(prepared.state[0])
        return [self.canonical_arrays(leaves, replica=r) for r in range(len(self.devices))]


class JaxShardMapBackend(_MeshBackend):
    name: ClassVar[str] = "jax-shardmap"
    runner: ClassVar[str] = "jax.jit(jax.shard_map), a lax.pmean of the gradients"

    def to_varying(self, params):
        """Under shard_map's type checking (check_vma), the gradient with respect
        to a replicated (invariant) value comes out already summed over "d", N times the
        single-device one. Marking the params as varying first keeps it per device, so the
        explicit pmean below is the only reduction."""
        from jax import lax

        if hasattr(lax, "pcast"):  # jax 0.10 and 0.11; pvary (gone in 0.10) on older jax
            return lax.pcast(params, AXIS, to="varying")
        return lax.pvary(params, AXIS)

    def step_programs(self, trial: Trial, work: Work, tx, mesh, model: JaxModel):
        import jax
        from jax import lax

        loss_fn = model.loss_fn
        batches = work.x.shape[0] // trial.global_batch  # as Work.shards lays them out
        reduce = self.reduce_gradients if trial.all_reduce else (lambda grads: grads)
        devices = len(self.devices)

        def loss_and_grads(state, xs, ys):
            params, _, step, key = state
            x, y = (lax.dynamic_index_in_dim(a[0], step % batches, keepdims=False) for a in (xs, ys))
            # As `jax`: one dropout stream per (step, device).
            rng = dropout_rng(key, step, devices, lambda: lax.axis_index(AXIS))
            loss, grads = jax.value_and_grad(loss_fn)(self.to_varying(params), x, y, rng)
            return loss[None], reduce(grads)  # [None]: one loss per device, stacked on "d"

        step_fn = train_steps(tx, loss_and_grads, trial.protocol.steps_per_call)
        # The compute-only twin (no pmean) leaves each device with its own gradient, params and
        # Adam moments: values the type checker rightly calls varying, so out_specs P() would
        # be rejected. We keep P() and turn the check off for the twin only: the state keeps
        # the real step's layout, donation and per-device compute, and each device's buffer
        # holds its own diverged copy, which is what "each device applies its own gradient"
        # means. (A P("d") state would need a stacked state and a different program.)
        # The twin is timed only, never verified.
        check = trial.all_reduce
        specs = dict(in_specs=(_spec(), _spec(AXIS), _spec(AXIS)), out_specs=(_spec(), _spec(AXIS)))
        step = jax.jit(_shard_map(step_fn, mesh, check_vma=check, **specs), donate_argnums=0)
        grads_specs = dict(specs, out_specs=(_spec(AXIS), _spec()))
        grads = jax.jit(_shard_map(loss_and_grads, mesh, check_vma=check, **grads_specs))
        return step, grads, ()

    def shard_program(self, trial: Trial, work: Work, mesh, model: JaxModel, shards: int):
        """The step's shard_map and loss without grad or pmean: each device's loss of its own
        batch (with its own dropout stream), out_specs P("d")."""
        import jax
        from jax import lax

        devices = len(self.devices)
        losses = shard_loss_fn(model.loss_fn, work.x.shape[0] // trial.global_batch, devices,
                               lambda: lax.axis_index(AXIS), shards)
        return jax.jit(_shard_map(lambda state, xs, ys: losses(state, xs[0], ys[0]), mesh,
                                  in_specs=(_spec(), _spec(AXIS), _spec(AXIS)), out_specs=_spec(AXIS)))


class JaxAutoBackend(_MeshBackend):
    name: ClassVar[str] = "jax-auto"
    runner: ClassVar[str] = "jax.jit with NamedShardings, the all-reduce the compiler's"

    def place_data(self, mesh, xs: np.ndarray, ys: np.ndarray):
        """[batches, global_batch, ...sample shape] with the batch split on "d": device r holds
        the same rows as in `jax` (the core's shards, regrouped)."""
        import jax

        def regroup(a: np.ndarray) -> np.ndarray:
            n, batches, per, *sample = a.shape
            return np.ascontiguousarray(np.swapaxes(a, 0, 1).reshape(batches, n * per, *sample))

        return (jax.device_put(regroup(a), _sharding(mesh, None, AXIS)) for a in (xs, ys))

    def model(self, trial: Trial, work: Work) -> JaxModel:
        # BatchNorm statistics per device's rows, as `jax` takes them (not over the global batch).
        return build(trial, work, self.devices[0], batch_groups=len(self.devices))

    def step_programs(self, trial: Trial, work: Work, tx, mesh, model: JaxModel):
        import jax
        from jax import lax

        if not trial.all_reduce:
            raise Unsupported("jax-auto has no compute-only step: the compiler (GSPMD/Shardy) inserts "
                              "the gradient all-reduce itself, so there is no program without it")
        loss_fn = model.loss_fn
        batches = work.x.shape[0] // trial.global_batch

        def loss_and_grads(state, xs, ys):
            params, _, step, key = state
            x, y = (lax.dynamic_index_in_dim(a, step % batches, keepdims=False) for a in (xs, ys))
            # One stream per step; Flax draws each layer's mask over the whole global batch, so
            # an example's mask depends on (seed, step, layer, its row in the global batch) and
            # not on the device count (threefry is partitionable: no device draws all bits).
            # Masks differ from `jax`'s per-device streams; verification runs without dropout.
            rng = jax.random.fold_in(jax.random.wrap_key_data(key), step)
            return jax.value_and_grad(loss_fn)(params, x, y, rng)

        replicated, batch = _sharding(mesh), _sharding(mesh, None, AXIS)
        shardings = dict(in_shardings=(replicated, batch, batch), out_shardings=(replicated, replicated))
        step = jax.jit(train_steps(tx, loss_and_grads, trial.protocol.steps_per_call), donate_argnums=0,
                       **shardings)
        grads = jax.jit(loss_and_grads, **shardings)
        if work.model.family != "mlp":  # only the MLP has dropout
            return step, grads, ()
        partitionable = bool(getattr(jax.config, "jax_threefry_partitionable", True))
        return step, grads, (f"dropout: one mask over the global batch per step and layer "
                             f"(jax_threefry_partitionable={partitionable})",)

    def shard_program(self, trial: Trial, work: Work, mesh, model: JaxModel, shards: int):
        """The global batch regrouped as [shards, rows of one share] with the groups on "d",
        the loss vmapped over them: the compiler gives device i group i, the rows its step holds.
        BatchNorm's statistics per group: the model's loss of one share (built again here where
        the step's normalises several devices' rows in one call). Dropout: group i draws the
        stream device i does in `jax` (the step draws one mask over the global batch, so with
        dropout on these are not its masks; verify runs without dropout)."""
        import jax
        import jax.numpy as jnp
        from jax import lax

        loss_fn = model.loss_fn
        if len(self.devices) > 1 and work.model.kind.batch_statistics:
            loss_fn = build(trial, work, self.devices[0]).loss_fn  # statistics of the group it is given
        batches = work.x.shape[0] // trial.global_batch
        grouped = _sharding(mesh, AXIS) if len(self.devices) > 1 else _sharding(mesh)

        def losses(state, xs, ys):
            params, _, step, key = state
            x, y = (lax.dynamic_index_in_dim(a, step % batches, keepdims=False) for a in (xs, ys))
            x, y = (lax.with_sharding_constraint(a.reshape(shards, a.shape[0] // shards, *a.shape[1:]), grouped)
                    for a in (x, y))

            def one(i, xi, yi):
                return loss_fn(params, xi, yi, dropout_rng(key, step, shards, lambda: i))

            return jax.vmap(one)(jnp.arange(shards), x, y)

        replicated, batch = _sharding(mesh), _sharding(mesh, None, AXIS)
        return jax.jit(losses, in_shardings=(replicated, batch, batch), out_shardings=grouped)


def _spec(*axes):
    import jax

    return jax.sharding.PartitionSpec(*axes)


def _sharding(mesh, *axes):
    import jax

    return jax.sharding.NamedSharding(mesh, _spec(*axes))


def _shard_map(f, mesh, *, in_specs, out_specs, check_vma: bool = True):
    """`jax.shard_map` (jax >= 0.7), else the experimental one of older jax."""
    import jax

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma)
