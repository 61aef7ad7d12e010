"""The prefix cache's bookkeeping records: segment nodes, evictable runs, holdings, segment runs.

:class:`~simsched.engine.kv.prefix_cache.PrefixCache` (whose docstring explains the scheme) groups
cached blocks by prompt segment: a :class:`_Node` per segment key, :class:`_Run` s of evictable
blocks in one LRU list, a :class:`_Holding` per request; :func:`segment_runs` cuts a request's
content into per-segment block ranges (also used by the KV tiers, the block pool and the
cluster's prefix-holders index).
"""

from __future__ import annotations

OPEN_END = 1 << 62          # the output segment has no end


class _Node:
    """The cached full blocks of one segment key: positions ``[0, num_cached)``."""

    __slots__ = ("key", "num_cached", "max_reach", "reach", "runs")

    def __init__(self, key: int) -> None:
        self.key = key
        self.num_cached = 0
        self.max_reach = 0          # positions [0, max_reach) are referenced
        self.reach: dict[int, int] = {}   # reach -> number of holders reaching exactly that far
        self.runs: list[_Run] = []  # evictable runs, deepest (oldest) first


class _Run:
    """Evictable positions ``[lo, hi)`` of a node, released together."""

    __slots__ = ("node", "lo", "hi")

    def __init__(self, node: _Node, lo: int, hi: int) -> None:
        self.node = node
        self.lo = lo
        self.hi = hi


class _Holding:
    """A request's registered blocks: the first ``num_registered`` blocks of its segment runs.

    Run ``i`` covers the request's blocks ``[los[i], his[i])`` (those whose last token lies in
    segment ``keys[i]``); ``index`` is the first run not fully registered.
    """

    __slots__ = ("keys", "los", "his", "num_registered", "index")

    def __init__(self, runs: tuple) -> None:
        _, self.keys, self.los, self.his = runs
        self.num_registered = 0
        self.index = 0


def segment_runs(content, block_size: int) -> tuple | None:
    """``(block_size, keys, los, his)``: each segment's blocks, the output's last; memoised.

    None for a request without identity. Blocks ``[lo, hi)`` of a run are those whose last token
    falls in the segment; segments too short to hold a block end are skipped.
    """
    memo = content.runs
    if memo is not None and memo[0] == block_size:
        return memo
    if not content.keys:
        return None
    keys, los, his = [], [], []
    start = 0
    for key, end in zip(content.keys, content.ends):
        lo, hi = start // block_size, end // block_size
        if hi > lo:
            keys.append(key)
            los.append(lo)
            his.append(hi)
        start = end
    keys.append(content.output_key)
    los.append(start // block_size)
    his.append(OPEN_END)
    memo = content.runs = (block_size, keys, los, his)
    return memo
