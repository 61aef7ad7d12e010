"""What a cluster's replicas are built from, and the run's random streams.

:class:`ReplicaSpec` (one replica's config, cost model, KV blocks and length limit) and
:func:`replica_specs`, which derives them from a config; :func:`replica_rng` and
:func:`router_rng`, the Generators a replica and the router draw from (seeded so that a
cluster of one keeps the single engine's stream). No SimPy here: the one-process cluster
(:mod:`simsched.cluster.cluster`), the autoscaled fleet and the sharded run all build from these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simsched.cost import factory, hardware
from simsched.engine.lora import lora_blocks_left

__all__ = ["ReplicaSpec", "replica_rng", "replica_specs", "router_rng"]


@dataclass
class ReplicaSpec:
    """What one replica is built from: its config, cost model, KV blocks and length limit."""

    config: Any
    cost_model: Any
    num_blocks: int
    max_model_len: int | None


def replica_specs(config, cost_model=None, num_blocks: int | None = None,
                  max_model_len: int | None | str = "hardware") -> list[ReplicaSpec]:
    """One spec per replica of ``config``: each replica's own cost model, KV blocks and length
    limit.

    ``cost_model``, if given, serves every replica; otherwise each replica's hardware names its
    own. KV blocks are ``num_blocks`` if given, else ``cache.num_blocks`` or what the replica's
    hardware holds. ``max_model_len``: ``"hardware"`` (the default) takes each replica's
    hardware limit; a number, or None (no limit), applies to every replica.
    """
    out = []
    for rcfg in config.replica_configs():
        model = cost_model if cost_model is not None else factory.make_cost_model(rcfg.hardware)
        out.append(ReplicaSpec(
            rcfg, model, num_blocks if num_blocks is not None else _num_blocks(rcfg),
            hardware.max_model_len(rcfg.hardware) if max_model_len == "hardware"
            else max_model_len))
    return out


def _num_blocks(rcfg) -> int:
    if rcfg.cache.num_blocks is not None:
        return rcfg.cache.num_blocks
    blocks = hardware.kv_capacity_blocks(rcfg.hardware, rcfg.cache.block_size)
    if rcfg.scheduler.lora is not None:
        return lora_blocks_left(rcfg, blocks)
    return blocks


def replica_rng(seed: int, index: int) -> np.random.Generator:
    """Replica ``index``'s Generator: replica 0 keeps the single engine's stream."""
    if index == 0:
        return np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1])
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(3, index)))


def router_rng(seed: int) -> np.random.Generator:
    """The router's Generator (independent of the workload's and the replicas' streams)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2,)))
