"""The tf backend's models, one module per family (`mlp`, `transformer`, `cnn`, `lstm`), and
what `mirrored` needs of any of them (`Built`): the Keras model, its trainable variables in
the core's canonical order, the per-example loss, and the conversion of arrays read back
(weights, gradients) into the canonical layout.

Every family module but the MLP's provides `build_model(work, jit_compile) -> (model,
{canonical name: variable})`, `per_example_loss(model, x, y)`, `notes(model, jit_compile)`
and `to_framework` / `to_canonical(name, array)`. Weights load and read back by canonical
name, never by Keras's own weight order. The MLP keeps its Sequential model and
`set_weights` (its variables already are in canonical order and layout).

Dtypes follow the Keras global dtype policy that `mirrored` sets for each trial ("float32",
"mixed_bfloat16", or "float64" for `trial.precision == "fp64"`): variables take its variable
dtype (the core's float32 arrays are cast to it on loading; float32 -> float64 is exact),
float inputs its variable dtype too (`input_dtype`: a functional model converts what it is
fed to its Input's dtype, which would otherwise be floatx), losses `loss_dtype`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from xbench.contract import Work

FAMILIES = ("mlp", "transformer", "cnn", "lstm")


@dataclass
class Built:
    model: Any
    variables: list[Any]  # the trainable Keras variables, in canonical order
    per_example_loss: Callable[[Any, Any, Any], Any]  # (model, x, y) -> [per-device batch] in `loss_dtype`
    canonical: Callable[[list[np.ndarray]], list[np.ndarray]]  # arrays of `variables` -> canonical layout
    notes: tuple[str, ...]


def build(work: Work, jit_compile: bool, remat: bool = False) -> Built:
    """The model of `work`'s family holding the work's initial weights; call it inside the
    scope (strategy or device) its variables belong to. `remat` (the transformer only): each
    block recomputed in the backward pass."""
    family = work.model.family
    if remat and family != "transformer":
        raise ValueError(f"remat checkpoints transformer blocks; the {family} family has none")
    if family not in FAMILIES:
        raise ValueError(f"the tf backend builds the families {', '.join(FAMILIES)}, not {family!r}")
    if family == "mlp":
        from xbench_backends.tf import mlp

        model = mlp.build_model(work)
        return Built(model, model.trainable_variables, mlp.per_example_loss, list, ())
    module = importlib.import_module(f"xbench_backends.tf.{family}")
    model, named = module.build_model(work, jit_compile, remat=True) if remat else module.build_model(work, jit_compile)
    names = [param.name for param in work.parameters]
    _check_variables(model, named, names)
    variables = [named[name] for name in names]
    for name, variable, array in zip(names, variables, work.arrays):
        variable.assign(np.asarray(module.to_framework(name, array), dtype=variable.dtype))
    return Built(model, variables, module.per_example_loss,
                 lambda arrays: [module.to_canonical(name, a) for name, a in zip(names, arrays)],
                 (*module.notes(model, jit_compile),
                  *((module.REMAT_NOTE.format(layers=work.model.shape["layers"]),) if remat else ())))


def input_dtype() -> str:
    """The dtype of a model's float inputs: the global policy's variable dtype (float32 under
    "float32" and "mixed_bfloat16", float64 under "float64"); the model casts to its compute
    dtype itself."""
    import keras

    return keras.mixed_precision.global_policy().variable_dtype


def loss_dtype(tensor):
    """Where a loss is computed from `tensor` (logits or predictions): float64 for a float64
    model, else float32 (a bf16 model's outputs are upcast)."""
    import tensorflow as tf

    return tf.float64 if tensor.dtype == tf.float64 else tf.float32


def _check_variables(model, named: dict[str, Any], names: list[str]) -> None:
    """Every canonical parameter maps to exactly one trainable variable of the model and every
    trainable variable to a parameter: nothing loaded twice, nothing left at Keras's init."""
    missing = [name for name in names if name not in named]
    extra = [name for name in named if name not in set(names)]
    mapped = {id(v) for v in named.values()}
    trainable = {id(v) for v in model.trainable_variables}
    if missing or extra or len(mapped) != len(named) or mapped != trainable:
        unmapped = [v.path for v in model.trainable_variables if id(v) not in mapped]
        raise RuntimeError(f"the Keras model's variables do not match the canonical parameters: missing "
                           f"{missing[:3]}, unknown {extra[:3]}, unmapped Keras variables {unmapped[:3]}")
