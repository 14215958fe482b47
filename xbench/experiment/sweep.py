"""`xbench sweep`'s design: the few measurements a step model (`xbench.results.step_model`) needs on this
machine, as a compare spec, and how long they will take.

Each model at a few per-device batches (weak scaling), on 1 and N devices, each multi-device
step with its compute-only twin, and the all-reduce benchmark at a range of sizes (`--breakdown`).
MLP sizes are given as parameter counts: a ladder of 3 equal hidden layers (the seed's 50
inputs, 3 outputs), so that one fit spans model sizes at a fixed shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from xbench.errors import SpecError, brief
from xbench.experiment.spec import Spec, build_spec, presets

LADDER_DEPTH = 3
LADDER_INPUTS, LADDER_OUTPUTS = 50, 3
# Defaults sized for the machine: CPU runs must finish in minutes on two cores.
DEFAULT_PARAMS = {"cpu": (3e4, 1e5, 3e5, 1e6), "gpu": (1e6, 4e6, 16e6, 64e6)}
DEFAULT_BATCHES = {"cpu": (16, 64, 256, 1024), "gpu": (256, 1024, 4096, 16384)}
# At 1e-3, ten Adam steps of the ladder's wide MLPs amplify fp32 rounding at ReLU kinks: torch
# and jax (both correct, strict fp32) ended 7e-3 apart at width 1,400, beyond verify's fixed
# tolerance of the time (it now widens by each model's measured floor, `xbench.results.checks`); at
# 1e-4, 2e-7. The step's cost does not depend on the rate (a config may set its own).
SWEEP_LEARNING_RATE = 1e-4


def ladder_width(params: float) -> int:
    """The hidden width w of the ladder MLP nearest `params` (50 w + w + 2 (w^2 + w) + 3 w + 3
    parameters: inputs, 3 hidden layers with biases, outputs), rounded as people size layers:
    to a multiple of 64 (of 8 below 128). Measured on an H200 in tf32, odd widths (693, 2,814)
    ran up to 2x slower per FLOP than aligned ones, a kernel effect no size law can follow."""
    a, b, c = LADDER_DEPTH - 1, LADDER_INPUTS + 1 + (LADDER_DEPTH - 1) + LADDER_OUTPUTS, LADDER_OUTPUTS
    exact = (-b + math.sqrt(b * b + 4 * a * (params - c))) / (2 * a)
    step = 64 if exact >= 128 else 8
    return max(step, step * round(exact / step))


def ladder_name(params: float) -> str:
    for unit, scale in (("b", 1e9), ("m", 1e6), ("k", 1e3)):
        if params >= scale:
            return f"mlp-{params / scale:.3g}{unit}"
    return f"mlp-{params:.0f}"


def ladder_table(params: float, batch_sizes: Sequence[int]) -> dict[str, Any]:
    if not 1e3 <= params <= 1e10:
        raise SpecError(f"--params {params:g} is outside 1e3-1e10; give MLP sizes in parameters, e.g. 1e5 1e6")
    width = ladder_width(params)
    return {"name": ladder_name(params), "family": "mlp", "widths": [width] * LADDER_DEPTH,
            "inputs": LADDER_INPUTS, "outputs": LADDER_OUTPUTS, "dropout": 0.0, "batch_sizes": list(batch_sizes)}


def preset_table(name: str, batch_sizes: Sequence[int]) -> dict[str, Any]:
    if name not in presets():
        raise SpecError(f"unknown model {brief(name)}; `xbench models` lists the presets")
    return {"name": name, "preset": name, "batch_sizes": list(batch_sizes)}


def sweep_spec(backends: Sequence[str], params: Sequence[float], models: Sequence[str], batch_sizes: Sequence[int],
               devices: Sequence[int], precision: str, replicates: int | None, seed: int = 0,
               window_budget_s: float | None = None, config: Mapping[str, Any] | None = None,
               p2p: bool | None = None, time_budget_s: float | None = None) -> Spec:
    """The compare spec of a sweep: every model at every per-device batch, weak scaling. A
    config (a compare spec's raw tables) adds its [[models]] (keeping their batch sizes) and
    its [protocol], [data] and learning rate; the sweep's own settings win."""
    if 1 not in devices:
        raise SpecError("--devices must include 1: the model's terms start from the 1-device step")
    if len(set(batch_sizes)) < 2:
        raise SpecError("--per-device-batch needs at least two batches (three or more to validate)")
    config = dict(config or {})
    tables = ([ladder_table(p, batch_sizes) for p in params] + [preset_table(m, batch_sizes) for m in models]
              + list(config.pop("models", None) or []))
    if not tables:
        raise SpecError("nothing to sweep: give --params, --model or a --config with [[models]]")
    biggest = max(max(t.get("batch_sizes") or batch_sizes) for t in tables) * max(devices)
    own = {"replicates": replicates, "window_budget_s": window_budget_s, "time_budget_s": time_budget_s}
    protocol = {**config.pop("protocol", {}), **{key: v for key, v in own.items() if v is not None}}
    raw: dict[str, Any] = {
        "learning_rate": SWEEP_LEARNING_RATE, **config, "models": tables, "backends": list(backends),
        "devices": sorted(set(devices)), "scaling": "weak", "precision": precision, "seed": seed,
        "protocol": protocol, **({} if p2p is None else {"p2p": p2p}),
        "data": {**config.get("data", {}), "samples": max(config.get("data", {}).get("samples", 0), biggest)},
    }
    return build_spec(raw, "the sweep")
