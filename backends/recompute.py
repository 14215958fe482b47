"""The activation-checkpointing variant (`remat`) that the `jax`, `torch` and `tf` backends
declare, shared so that every framework names it, scopes it and refuses it the same way.

`remat` is a variant of either program: the same model, loss, optimizer and data, with each
transformer block's activations dropped after its forward pass and recomputed from the block's
input during the backward pass (activation checkpointing, per block, as practitioners write it:
nnx.remat over each block, torch.utils.checkpoint around each block). The arithmetic is the
same operations on the same values, so verify holds it to the plain programs; what changes is
the memory the step keeps (every block's input and one block's activations at a time,
`xbench.models.memory`) and the time it takes (each block's forward runs twice).

`fsdp-remat` is the sharded program (`xbench_backends.sharding`) with remat's blocks, as FSDP
trainers run the largest models: declared by `xbench_backends.sharding.remat_variant`, named
here so that whatever builds a block knows from one place whether to checkpoint it.
"""

from __future__ import annotations

from xbench.contract import Variant

REMAT = "remat"
# Per-block checkpointing is what is done for transformers; the other families have no blocks.
REMAT_FAMILIES = ("transformer",)
FSDP_REMAT = "fsdp-remat"
RECOMPUTING = (REMAT, FSDP_REMAT)  # the variants whose blocks are checkpointed


def variant(how: str) -> Variant:
    """The `remat` Variant as a backend declares it, `how` saying with what."""
    return Variant(REMAT, f"activation checkpointing: each transformer block's activations recomputed in the "
                          f"backward pass ({how})", families=REMAT_FAMILIES, recompute=True,
                   same_formula=True)  # the same operations on the same values, twice


def refusal(family: str, name: str = REMAT) -> str | None:
    """Why `remat` (or `name`, another variant that checkpoints blocks) does not apply to a
    model of `family`, or None."""
    if family in REMAT_FAMILIES:
        return None
    return (f"{name} checkpoints each transformer block; the {family} family has no blocks "
            f"(it runs on {', '.join(REMAT_FAMILIES)})")
