"""Deliberately broken data-parallel steps that `xbench verify` must catch."""

from __future__ import annotations

from typing import ClassVar

from xbench.contract import ADAM
from xbench_backends.jax.pmap import JaxPmapBackend
from xbench_backends.jax.steps import AXIS


class NoAllReduceJax(JaxPmapBackend):
    """Each device applies its own shard's gradient: it never communicates, so it 'scales'."""

    name: ClassVar[str] = "jax-noreduce"

    def reduce_gradients(self, grads):
        return grads


class SummedJax(JaxPmapBackend):
    """Psum instead of pmean: the gradient comes out N times too large (shard_map's silent N x gradient)."""

    name: ClassVar[str] = "jax-sum"

    def reduce_gradients(self, grads):
        from jax import lax

        return lax.psum(grads, AXIS)


class KerasEpsilonJax(JaxPmapBackend):
    """Adam with Keras's default epsilon, 1e-7, instead of the contract's 1e-8: a formula
    difference that ten fp32 steps of the seed's medium MLP show at only 7e-5 (within the
    fp32 tolerance); the float64 runs show it at once."""

    name: ClassVar[str] = "jax-eps"

    def prepare(self, trial, work):
        import optax

        from xbench_backends.jax import pmap

        contract = pmap.optimizer
        pmap.optimizer = lambda learning_rate: optax.adam(learning_rate, b1=ADAM.b1, b2=ADAM.b2, eps=1e-7)
        try:
            return super().prepare(trial, work)
        finally:
            pmap.optimizer = contract
