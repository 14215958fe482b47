"""Deliberately broken data-parallel steps that `xbench verify` must catch."""

from __future__ import annotations

from typing import ClassVar

from xbench_backends.jax.pmap import JaxPmapBackend
from xbench_backends.jax.steps import AXIS


class NoAllReduceJax(JaxPmapBackend):
    """Each device applies its own shard's gradient: it never communicates, so it 'scales'."""

    name: ClassVar[str] = "jax-noreduce"

    def reduce_gradients(self, grads):
        return grads


class SummedJax(JaxPmapBackend):
    """psum instead of pmean: the gradient comes out N times too large (pitfall 2's symptom)."""

    name: ClassVar[str] = "jax-sum"

    def reduce_gradients(self, grads):
        from jax import lax

        return lax.psum(grads, AXIS)
