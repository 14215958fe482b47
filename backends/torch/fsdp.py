"""`torch:fsdp`: the `torch` backend's sharded data-parallel program, PyTorch's FSDP2
(`torch.distributed.fsdp.fully_shard`) over a 1-D device mesh of every rank: each transformer
block (each Linear of the MLP) is one unit and the root holds the rest (the embeddings, the
tied head, the final LayerNorm). Each rank holds dimension 0 of every parameter split by rank
(FSDP2 pads an uneven last share), all-gathers a unit's parameters before its forward and again
for its backward (`reshard_after_forward`, FSDP2's default), and reduce-scatters its gradients
averaged over the ranks (FSDP2's default divide factor), so that each rank's fused Adam updates
its own share. bf16 runs under FSDP2's `MixedPrecisionPolicy`: parameters cast to bf16 for the
compute, float32 master weights, gradients reduced in float32; no autocast.

Runs where torch.distributed does: NCCL on GPUs, gloo on CPUs (torch 2.13's FSDP2 runs its
all-gathers and reduce-scatters over gloo, so the CPU tests exercise the real program). On one
rank the mesh has one device and nothing is divided: the program's own 1-device run.

What the verification reads is gathered: weights and gradients (`DTensor.full_tensor`, an
all-gather of the shares) in the core's canonical order and layout, by parameter name, since
`fully_shard` replaces each parameter with a sharded one of the same name.

`fsdp-remat` wraps each block in torch's `checkpoint_wrapper` (non-reentrant
`torch.utils.checkpoint`) before sharding it, torchtitan's order (`apply_ac`, then
`apply_fsdp`): each unit is then a checkpointed block, FSDP2's hooks are on the wrapper, so
its all-gather runs before the checkpointed forward, not inside it, and in the backward pass
FSDP2's pre-backward hook gathers the unit's parameters once, for the recomputation and the
gradient alike. (The other order, `remat`'s checkpoint around the sharded block's call, runs
the unit's forward hooks again in the recomputation, which FSDP2 tolerates but torchtitan does
not write.) The wrapper keeps the parameters' names (it strips its own prefix).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xbench.contract import DATA_PARALLEL, Trial, Work
from xbench_backends import sharding

# A classic sharding slip, planted by tests (verify must fail it): the gradients reduce-scattered
# as a sum over the ranks instead of a mean (FSDP2's `set_gradient_divide_factor(1.0)`).
SUM_SHARD_GRADIENTS = False


def refusal(trial: Trial, work: Work, world: int) -> str | None:
    """Why `torch:fsdp` cannot run the trial, or None; checked before torch builds anything."""
    if trial.program != DATA_PARALLEL:
        return f"{trial.variant} shards the data-parallel program over its ranks; the plain program has none"
    if not trial.all_reduce:
        return sharding.NO_TWIN
    return sharding.refusal([tuple(p.shape) for p in work.parameters], world)


def shard(model, canonical: Callable[..., Any], device, world: int, compute_dtype=None,
          compile_mode: str | None = None) -> Callable[..., Any]:
    """`fully_shard` each unit of `model` and then its root, in place, over all `world`
    ranks, each unit first compiled in place with `compile_mode` where one is given
    (`fsdp-compile`: torchtitan's order, so that FSDP2's hooks stay outside the compiled
    graphs); returns the gathered canonical reader (`canonical(grad)`: full weights or
    gradients, canonical order and layout) that replaces the family's `canonical`."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    places = _canonical_places(model, canonical(False))
    mesh = init_device_mesh(device.type, (world,))
    kwargs: dict[str, Any] = {"mesh": mesh}
    if compute_dtype is not None:
        import torch

        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for unit in units(model):
        if compile_mode is not None:
            unit.compile(mode=compile_mode)
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    if SUM_SHARD_GRADIENTS:
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
    return _gathered_reader(model, places)


def units(model) -> list[Any]:
    """The submodules sharded one by one: the transformer's blocks, else the MLP's Linears."""
    from torch import nn

    blocks = getattr(model, "blocks", None)
    if blocks is not None:
        return list(blocks)
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def checkpoint_units(model) -> str:
    """`fsdp-remat`: each block of a built transformer replaced, in place, by itself under
    torch's checkpoint_wrapper, before `shard` (see the module's note on the order); what it
    did, for the notes."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    blocks = model.blocks
    for index, block in enumerate(blocks):
        blocks[index] = checkpoint_wrapper(block, CheckpointImpl.NO_REENTRANT, preserve_rng_state=True)
    return (f"remat: each of the {len(blocks)} blocks wrapped in checkpoint_wrapper(NO_REENTRANT: "
            "torch.utils.checkpoint.checkpoint(use_reentrant=False), preserve_rng_state=True) before fully_shard, "
            "torchtitan's order: its activations recomputed from its input in the backward pass")


def compile_note(model, mode: str) -> str:
    return (f"torch.compile(mode={mode}) of each of the {len(units(model))} sharded units in place, before "
            "fully_shard; embeddings, head, loss and fused Adam eager")


def note(model, world: int, compute_dtype, shapes: list[tuple[int, ...]]) -> str:
    from torch.distributed.fsdp import FSDPModule

    sharded = sum(1 for m in model.modules() if isinstance(m, FSDPModule))
    divided, tensors, fraction = sharding.divided_share(shapes, world)
    policy = ("MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), float32 master weights"
              if compute_dtype is not None else "no mixed-precision policy")
    return (f"fsdp: FSDP2 fully_shard over {world} rank(s) ({sharded} units: {sharded - 1} and the root), "
            f"dimension 0 of every parameter split (padded where uneven; {divided} of {tensors} tensors, "
            f"{fraction:.1%} of the parameters, divide evenly), all-gathered per unit, gradients reduce-scattered "
            f"(mean), reshard_after_forward=True; {policy}; zero_grad(set_to_none=True)")


def _canonical_places(model, views: list[Any]) -> list[tuple[str, bool]]:
    """For each canonical view of the unsharded model's parameters (the family's reader:
    the parameter itself, or its transpose): the parameter's name and whether it is transposed."""
    by_storage = {p.data_ptr(): (name, p) for name, p in model.named_parameters()}
    places = []
    for view in views:
        name, param = by_storage[view.data_ptr()]
        same = tuple(view.shape) == tuple(param.shape) and view.stride() == param.stride()
        places.append((name, not same))
    return places


def _gathered_reader(model, places: list[tuple[str, bool]]) -> Callable[..., Any]:
    params = [(model.get_parameter(name), transposed) for name, transposed in places]

    def gathered(param, transposed: bool, grad: bool) -> Any:
        tensor = (param.grad if grad else param).detach()
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        return full.T if transposed else full

    def canonical(grad: bool = False, lazily: bool = False) -> Any:
        """Every parameter (or gradient) gathered whole; `lazily`, each as it is read, so that
        the device holds one at a time (every rank must read all of them: a gather is collective)."""
        found = (gathered(param, transposed, grad) for param, transposed in params)
        return found if lazily else list(found)

    return canonical
