"""The jax backends' all-gather and reduce-scatter (`GathersAndScatters`): nccl-tests' size is
the whole buffer, so each device sends or receives its 1/n share, and a reduce-scatter sums."""

from __future__ import annotations

import numpy as np
import pytest

from xbench.contract import ALL_GATHER, REDUCE_SCATTER, GathersAndScatters, Unsupported

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

from tests.backends.jax.cpu_devices import DEVICES, simulated_devices  # noqa: E402
from xbench_backends.jax.pmap import JaxPmapBackend  # noqa: E402
from xbench_backends.jax.shardmap import JaxShardMapBackend  # noqa: E402

NBYTES = 4 * 8 * DEVICES  # 8 float32 per device's share


@pytest.fixture(scope="module")
def devices():
    return simulated_devices(DEVICES)


def _backend(cls, devices):
    backend = cls()
    backend.devices = devices
    return backend


@pytest.mark.parametrize("cls", [JaxPmapBackend, JaxShardMapBackend], ids=["pmap", "shardmap"])
def test_each_device_gathers_the_whole_buffer_and_receives_its_summed_share(devices, cls):
    backend = _backend(cls, devices)
    assert isinstance(backend, GathersAndScatters)
    gather = backend.collective_prepare(ALL_GATHER, NBYTES, {})
    scatter = backend.collective_prepare(REDUCE_SCATTER, NBYTES, {})
    gathered, scattered = np.asarray(gather.op(gather.buffer)), np.asarray(scatter.op(scatter.buffer))
    assert gather.buffer.shape == (DEVICES, 8) and gathered.shape == (DEVICES, 8 * DEVICES)
    assert scatter.buffer.shape == (DEVICES, 8 * DEVICES) and scattered.shape == (DEVICES, 8)
    assert np.all(gathered == 1.0) and np.all(scattered == float(DEVICES))  # n ones summed
    backend.collective_run(gather, 3)
    backend.collective_run(scatter, 3)


def test_an_unknown_collective_is_unsupported(devices):
    with pytest.raises(Unsupported, match="no collective 'alltoall'"):
        _backend(JaxPmapBackend, devices).collective_prepare("alltoall", NBYTES, {})
