"""A sharded run's place in :func:`simsched.analysis.runner.run`: what it refuses up front and
the coordinator it runs (:mod:`simsched.cluster.shards`)."""

from __future__ import annotations

from simsched.analysis.shard_workers import shard_opener
from simsched.analysis.stream import StreamingRequests
from simsched.cluster.lazy import LazyRequests
from simsched.cluster.shards import ShardedCluster, check_shardable


def refuse_unshardable(config, shards, record_steps: bool, keep_engine: bool) -> None:
    """Raise ValueError, before the workload is drawn, for what a sharded run cannot do."""
    check_shardable(config, shards)
    named = [name for name, on in (("record_steps", record_steps),
                                   ("keep_engine", keep_engine)) if on]
    if named:
        raise ValueError(f"shards: {', '.join(named)} not supported in sharded runs yet (they "
                         "read every replica's scheduler or write from one process)")


def sharded_cluster(config, reqs, specs: list, shards: int, workers: str,
                    ray_address: str | None, stream_to=None) -> ShardedCluster:
    """The coordinator of ``config``'s run over ``reqs`` in ``shards`` shards (``stream_to``:
    ``reqs`` is the run's :class:`~simsched.analysis.stream.StreamingRequests` and each shard
    streams its own records beside the coordinator's)."""
    if not isinstance(reqs, (LazyRequests, StreamingRequests)):
        raise ValueError("shards: plain workloads only (no closed-loop sessions, benchmark "
                         "client, prefix-cache content such as hash_ids or shared prefixes, or "
                         "LoRA adapters): their requests are objects the shards cannot share")
    prefix = getattr(reqs, "prefix", False)
    return ShardedCluster(config, reqs, shards,
                          shard_opener(config, specs, len(reqs), workers, ray_address, stream_to,
                                       prefix), specs)
