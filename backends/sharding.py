"""The sharded data-parallel variant (`fsdp`) that the `jax`, `torch` and `tf` backends
declare, and the rule it divides parameters by, shared so that every framework refuses the
same models.

`fsdp` is a variant of the data-parallel program: the batch is split over the devices as
before, and the parameters, their gradients and Adam's moments are split too (FSDP, ZeRO-3):
each device holds a share, gathers a unit's full parameters just before computing it and
reduce-scatters its gradients, so that each device keeps the gradient of its own share. The
same step on 1 device (a mesh, or a process group, of one: nothing divided, no collective) is
the program's own 1-device run: speedups compare the program with itself, and verify's
"N devices = 1 device" check, the only one that sees a gradient summed instead of averaged
(Adam's steps hardly change when every gradient doubles), compares its N-device gradient
with it.

A parameter is divided along the largest of its dimensions that the device count divides
(jax's NamedSharding needs an even split; torch's FSDP2 splits dimension 0 and pads an
uneven last share). A model none of whose parameters can be divided so is refused.

`fsdp-remat` (`remat_variant`) is `fsdp` with each transformer block's activations recomputed
in the backward pass (`xbench_backends.recompute`): the state sharded and the activations
checkpointed, which the largest models (GPT-3 6.7B, 13B) need together. It is refused where
either part is (the plain program; a family without blocks), by the parts' own rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from xbench.contract import DATA_PARALLEL, Variant
from xbench_backends import recompute

FSDP = "fsdp"
FSDP_FAMILIES = ("mlp", "transformer")
FSDP_REMAT = recompute.FSDP_REMAT
SHARDED = (FSDP, FSDP_REMAT)  # the variants that run the sharded program (a backend may add its own)


def variant(how: str, name: str = FSDP, first_call_per_array_s: float | None = None) -> Variant:
    """The `fsdp` Variant (or another sharded one, `name`) as a backend declares it, `how`
    saying with what (`first_call_per_array_s`: a compiling one's, `Variant`'s)."""
    return Variant(name, f"sharded data parallelism: parameters, gradients and Adam state split over the devices "
                         f"({how})", families=FSDP_FAMILIES, sharded=True, programs=(DATA_PARALLEL,),
                   # each device computes its share of the same formula, on 1 device all of it
                   same_formula=True, first_call_per_array_s=first_call_per_array_s)


def remat_variant(how_sharded: str, how_recomputed: str) -> Variant:
    """`fsdp-remat`: the `fsdp` Variant with `remat`'s blocks, as a backend declares it, each
    part described as its own variant says it (`how_*`: with what); transformer only, as remat."""
    sharded, remat = variant(how_sharded, FSDP_REMAT), recompute.variant(how_recomputed)
    return replace(sharded, description=f"{sharded.description}; and {remat.description}",
                   families=remat.families, recompute=True)


NO_TWIN = ("fsdp has no compute-only twin: its parameters are gathered and its gradients reduce-scattered by the "
           "same collectives, so a step without them is not the same program")


def shard_dim(shape: Sequence[int], devices: int) -> int | None:
    """The dimension a parameter of `shape` is divided along over `devices`: the largest one
    that `devices` divides (the first of equals); None where none is (the parameter stays
    whole on every device)."""
    found = [(-size, dim) for dim, size in enumerate(shape) if size >= devices and size % devices == 0]
    return min(found)[1] if found else None


def refusal(shapes: Sequence[Sequence[int]], devices: int) -> str | None:
    """Why a model with parameters of `shapes` cannot be sharded over `devices`, or None."""
    if devices > 1 and all(shard_dim(shape, devices) is None for shape in shapes):
        return (f"no parameter of this model has a dimension that {devices} devices divide: nothing to shard "
                f"(largest {max((max(s, default=1) for s in shapes), default=0)})")
    return None


def divided_share(shapes: Sequence[Sequence[int]], devices: int) -> tuple[int, int, float]:
    """(tensors divided, tensors in all, fraction of the parameters divided), for the notes."""
    sizes = [_size(shape) for shape in shapes]
    divided = [shard_dim(shape, devices) is not None for shape in shapes]
    total = sum(sizes) or 1
    return sum(divided), len(shapes), sum(s for s, d in zip(sizes, divided) if d) / total


def _size(shape: Sequence[int]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count
