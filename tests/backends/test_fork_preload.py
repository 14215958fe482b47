"""What each built-in backend lets the fork server (xbench.run.zygote) import before it forks
workers: the framework, and nothing that starts a device context or a framework runtime,
which a forked worker would share with its siblings instead of starting its own. Each check
runs in a fresh interpreter, as the fork server does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

# Per backend: its class, and a line printing True when the framework has started no runtime.
UNTOUCHED = {
    "jax": ("xbench_backends.jax.pmap:JaxPmapBackend",
            "from jax._src import xla_bridge; print(not xla_bridge.backends_are_initialized())"),
    "jax-shardmap": ("xbench_backends.jax.shardmap:JaxShardMapBackend",
                     "from jax._src import xla_bridge; print(not xla_bridge.backends_are_initialized())"),
    "tf": ("xbench_backends.tf.mirrored:TfMirroredBackend",
           "from tensorflow.python.eager import context; print(not context.context()._initialized)"),
    "torch": ("xbench_backends.torch.ddp:TorchDdpBackend",
              "import torch; print(not torch.cuda.is_initialized())"),
}

SCRIPT = """
import importlib, sys
from xbench.worker.zygote import preload
preload(sys.argv[1])
module, name = sys.argv[1].split(":")
print(all(m in sys.modules for m in getattr(importlib.import_module(module), name).fork_preload))
{check}
"""


@pytest.mark.parametrize("name", sorted(UNTOUCHED))
def test_the_fork_preload_imports_the_framework_and_starts_nothing(name):
    target, check = UNTOUCHED[name]
    module, attribute = target.split(":")
    assert getattr(__import__(module, fromlist=[attribute]), attribute).fork_preload, \
        f"{name} preloads nothing: each of its workers would import the framework again"
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(check=check), target], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    # every preloaded module imported, and no runtime started
    assert done.stdout.split() == ["True", "True"], done.stdout + done.stderr[-2000:]
