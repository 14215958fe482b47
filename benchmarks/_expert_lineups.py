"""expert_loops.py's lineups: the programs of each framework, one line a program (xbench's and
the minimal loops), and the choice of those that run for a family, a platform and --programs."""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass
from typing import Any

from _expert_config import MinimalProgram, XbenchProgram
from _expert_jax import jax_gpt2, jax_mlp, jax_resnet
from _expert_torch import torch_gpt2, torch_mlp, torch_resnet

JAX_XBENCH = (
    XbenchProgram("as-written"),
    XbenchProgram("jnp"),
    XbenchProgram("functional"),
    XbenchProgram("cudnn", families=("transformer",)),
    # 50 steps per call: it matters where steps are short; a GPT-2 window would last 2-4 s.
    XbenchProgram("fused", families=("mlp",)),
)
TORCH_XBENCH = (
    XbenchProgram("as-written", compiles=False),
    XbenchProgram("compile", slow_on_cpu=True),
    # CUDA graphs hold a private memory pool of a whole step's activations; they pay off
    # where launches dominate (the MLPs), not at 40-100 ms steps.
    XbenchProgram("cuda-graphs", families=("mlp",), slow_on_cpu=True),
    XbenchProgram("channels-last", families=("cnn",), compiles=False),
)
# Per family, the first minimal loop that runs is the reference: the expert's fastest first.
JAX_MINIMAL = (
    MinimalProgram("minimal jax+cudnn", "transformer", functools.partial(jax_gpt2, attention="cudnn"), gpu_only=True),
    MinimalProgram("minimal jax", "transformer", functools.partial(jax_gpt2, attention=None)),
    MinimalProgram("minimal jax (flax)", "cnn", jax_resnet),
    MinimalProgram("minimal jax", "mlp", jax_mlp),
)
TORCH_MINIMAL = (
    MinimalProgram("minimal torch+compile", "transformer", functools.partial(torch_gpt2, compiled=True),
                   slow_on_cpu=True),
    MinimalProgram("minimal torch", "transformer", functools.partial(torch_gpt2, compiled=False), compiles=False),
    MinimalProgram("minimal torch+compile+channels-last", "cnn", functools.partial(torch_resnet, compiled=True),
                   slow_on_cpu=True),
    MinimalProgram("minimal torch+channels-last", "cnn", functools.partial(torch_resnet, compiled=False),
                   compiles=False),
    MinimalProgram("minimal torch", "mlp", torch_mlp, compiles=False),
)
LINEUPS = {"jax": (JAX_XBENCH, JAX_MINIMAL), "torch": (TORCH_XBENCH, TORCH_MINIMAL)}
DATA_PARALLEL_PROGRAM = XbenchProgram("as-written", program="data-parallel")  # --dp


@dataclass
class Entry:
    """A program of one configuration's lineup, and why it is left out (None: it runs)."""

    name: str
    kind: str  # "xbench" or "minimal"
    spec: XbenchProgram | MinimalProgram
    skip: str | None = None


def lineup(framework: str, family: str, platform: str, options: dict[str, Any]) -> list[Entry]:
    """The programs of `framework` for `family`: minimal loops first (the reference first),
    then xbench's; --programs patterns select (the reference always runs), and on a CPU the
    torch.compile programs are left out unless --programs names them."""
    xbench_programs, minimal_programs = LINEUPS[framework]
    patterns = options.get("programs") or []
    entries = [Entry(p.name, "minimal", p) for p in minimal_programs if p.family == family]
    extra = (DATA_PARALLEL_PROGRAM,) if options.get("dp") else ()
    entries += [Entry(p.name(framework), "xbench", p) for p in (*xbench_programs, *extra)
                if patterns or p.families is None or family in p.families]
    for i, entry in enumerate(entries):
        reference_candidate = entry.kind == "minimal" and not any(e.kind == "minimal" and not e.skip
                                                                   for e in entries[:i])
        if platform == "cpu" and getattr(entry.spec, "gpu_only", False):
            entry.skip = "needs an NVIDIA GPU"
        elif patterns and not selected(entry.name, patterns) and not reference_candidate:
            entry.skip = "not selected (--programs)"
        elif platform == "cpu" and entry.spec.slow_on_cpu and not (patterns and selected(entry.name, patterns)):
            entry.skip = "torch.compile takes minutes on a CPU; name it in --programs to time it"
    return entries


def selected(name: str, patterns: list[str]) -> bool:
    """A pattern selects a name it matches (fnmatch), or, without wildcards, one containing it."""
    name = name.lower()
    for pattern in (p.lower() for p in patterns):
        if fnmatch.fnmatchcase(name, pattern) or (not any(c in pattern for c in "*?[") and pattern in name):
            return True
    return False
