"""The GPU-to-GPU links a run's collectives may use: the machine's own (NVLink, PCIe
peer-to-peer), or host memory only (`--p2p off`, the spec's `p2p = false`), as on a PCIe
machine without peer-to-peer such as the seed study's.

P2P off is NCCL's own switches in every worker's environment: `NCCL_P2P_DISABLE=1` (no
direct GPU-to-GPU transport, over NVLink or PCIe) and `NCCL_NVLS_ENABLE=0` (no NVLink SHARP,
which would otherwise still reduce over NVLink on NVSwitch machines); `NCCL_SHM_DISABLE` is
left out, so that the traffic goes through host shared memory rather than the network. jax's
and torch's collectives on NVIDIA GPUs, and TensorFlow's NCCL all-reduce, read them; the
collectives of simulated CPU devices (in-process, or gloo) do not.

The variables are set in xbench's own environment for the length of a command (`applied`):
every worker, fork server, probe and verification run inherits it from there, and a fork
server is keyed by its environment, so one started without them never serves a run with them.
A variable the user set is respected: `NCCL_P2P_DISABLE=1` in the shell turns P2P off for a
run whose spec leaves it on, and the record says the environment did it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from xbench.results.links import HOST_MEMORY_PATH, P2P_OFF, nccl_variables


def changes(p2p: bool, environ: Mapping[str, str]) -> dict[str, str | None]:
    """What the workers' environment needs for `p2p` (a value to set, None to remove):
    nothing for P2P on (the machine's links, or what the user's own variables say)."""
    if p2p:
        return {}
    wanted: dict[str, str | None] = dict(P2P_OFF)
    if HOST_MEMORY_PATH in environ:
        wanted[HOST_MEMORY_PATH] = None
    return wanted


@contextlib.contextmanager
def applied(p2p: bool, environ: Any = None) -> Iterator[dict[str, str]]:
    """xbench's environment, which every worker inherits, with NCCL's variables for `p2p`, for
    the length of the block (restored after it); yields the NCCL variables in force."""
    environ = os.environ if environ is None else environ
    wanted = changes(p2p, environ)
    before = {name: environ.get(name) for name in wanted}
    try:
        for name, value in wanted.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
        yield nccl_variables(environ)
    finally:
        for name, value in before.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
