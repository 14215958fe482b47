"""The simulated CPU devices the jax backend tests share (jax fixes its device count at its
first operation, so whichever test module starts jax first decides it for the process: each
starts it with DEVICES, whatever it asks for, so that the modules may run in any order and
in any pytest-xdist worker)."""

from __future__ import annotations

import pytest

from xbench_backends.jax.pmap import JaxPmapBackend

DEVICES = 2


def simulated_devices(count: int = DEVICES) -> list:
    """`count` simulated CPU devices: set up here, or taken from a jax already started with
    enough of them; the test is skipped otherwise."""
    first = JaxPmapBackend()
    try:
        first.setup(max(count, DEVICES), "cpu")
        first.devices = first.devices[:count]
    except RuntimeError:  # jax already started in this process: use its devices if enough
        import jax

        if len(jax.devices()) < count or jax.devices()[0].platform != "cpu":
            pytest.skip(f"jax already started here without {count} CPU devices")
        first.devices = jax.devices()[:count]
    return list(first.devices)
