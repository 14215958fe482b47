"""A deliberately broken shard_map step that `xbench verify` must catch: the gradient of a
replicated parameter taken inside shard_map is already summed over devices, so a pmean after it
leaves it N times too large."""

from __future__ import annotations

from typing import ClassVar

from xbench_backends.jax.shardmap import JaxShardMapBackend


class UncastShardMap(JaxShardMapBackend):
    """The grad is taken of the replicated params themselves, without casting them to
    varying: shard_map's type checking then sums the gradient over the devices, and the pmean
    after it changes nothing. On 2 devices the applied gradient is exactly 2x too large."""

    name: ClassVar[str] = "jax-shardmap-nocast"

    def to_varying(self, params):
        return params
