"""`prefer_quick_compilation` (the contract's `CompilesQuickly`): a jax verification worker on a
GPU compiles without XLA's kernel autotuning, unless the user's XLA_FLAGS sets its level; on
a CPU, and in timed workers, XLA_FLAGS stays as it was. Each case sets up a fresh process,
since jax reads XLA_FLAGS once, when its client starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from xbench_backends.jax.steps import GPU_AUTOTUNE_FLAG, quick_gpu_compilation

pytest.importorskip("jax")

QUICK = f"{GPU_AUTOTUNE_FLAG}=0"

# Sets the backend up as a worker would and prints XLA_FLAGS as jax's client would read it;
# on this GPU-less machine setting up for a GPU fails once jax looks for one, after the flags.
SETUP = """
import json, os, sys
import jax
from xbench.contract import Process
from xbench_backends.jax import pmap

quick, platform, spmd = json.loads(sys.argv[1])
backend = pmap.JaxPmapBackend()
if quick:
    backend.prefer_quick_compilation()
pmap._cuda_plugin_present = lambda: platform == "gpu"
def stop(*args, **kwargs):
    raise RuntimeError("no GPU here")
jax.distributed.initialize = stop
try:
    if spmd:
        backend.setup_process(Process(0, 1, 0, 1, 0, 1, "127.0.0.1:1", ("127.0.0.1",)), platform)
    else:
        backend.setup(1, platform)
except Exception:
    pass
print(os.environ.get("XLA_FLAGS", ""))
"""


def flags_after_setup(quick: bool, platform: str, spmd: bool = False, user_flags: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if user_flags is not None:
        env["XLA_FLAGS"] = user_flags
    done = subprocess.run([sys.executable, "-c", SETUP, json.dumps([quick, platform, spmd])], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


@pytest.mark.parametrize("spmd", [False, True])
def test_a_verification_worker_on_a_gpu_skips_autotuning(spmd):
    assert QUICK in flags_after_setup(quick=True, platform="gpu", spmd=spmd).split()


@pytest.mark.parametrize(("quick", "platform"), [(False, "gpu"), (True, "cpu"), (False, "cpu")])
def test_timed_workers_and_cpus_compile_as_before(quick, platform):
    assert GPU_AUTOTUNE_FLAG not in flags_after_setup(quick=quick, platform=platform)


def test_the_users_autotuning_level_wins():
    assert flags_after_setup(quick=True, platform="gpu", user_flags="--xla_gpu_autotune_level=4") == \
        "--xla_gpu_autotune_level=4"


@pytest.mark.parametrize(("before", "after"), [
    (None, QUICK),
    ("--xla_dump_to=/tmp/x", f"--xla_dump_to=/tmp/x {QUICK}"),
    ("--xla_gpu_autotune_level=2", "--xla_gpu_autotune_level=2"),
    ("--xla_dump_to=/tmp/xla_gpu_autotune_level", f"--xla_dump_to=/tmp/xla_gpu_autotune_level {QUICK}"),
])
def test_the_flag_is_added_unless_set(monkeypatch, before, after):
    if before is None:
        monkeypatch.delenv("XLA_FLAGS", raising=False)
    else:
        monkeypatch.setenv("XLA_FLAGS", before)
    quick_gpu_compilation()
    assert os.environ["XLA_FLAGS"] == after
