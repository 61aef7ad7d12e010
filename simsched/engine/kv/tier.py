"""One tier below the GPU of the tiered KV cache (:mod:`simsched.engine.kv.tiers`): which
prefix blocks it holds, its link to the GPU (loads and stores queue on it) and its counters."""

from __future__ import annotations

import math
from collections import OrderedDict


class Tier:
    """One tier below the GPU: which blocks it holds (one run per segment key), its link, stats.

    ``blocks`` maps segment key -> ``[lo, hi]``, least recently used first. Counters:
    ``num_offered_blocks`` (GPU evictions offered) = ``num_written_blocks`` +
    ``num_duplicate_blocks`` (already held) - ``num_copied_blocks`` (still on the GPU, copied to
    close a gap); ``num_written_blocks`` = ``num_used`` + ``num_evicted_blocks``.
    """

    __slots__ = ("name", "capacity_blocks", "bytes_per_block", "read_bps", "write_bps",
                 "latency", "lru", "blocks", "num_used", "free_at", "num_hit_tokens",
                 "num_load_bytes", "load_time", "num_loads", "num_store_bytes", "store_time",
                 "num_offered_blocks", "num_written_blocks", "num_duplicate_blocks",
                 "num_copied_blocks", "num_evicted_blocks", "gpus", "timeline")

    def __init__(self, cfg, bytes_per_block: float, gpus: int = 1) -> None:
        if bytes_per_block <= 0:
            raise ValueError(f"kv tier {cfg.name!r}: bytes per block must be > 0")
        self.name = cfg.name
        cap = cfg.capacity_bytes
        # Capacity is per replica: each block takes bytes_per_block on each of its GPUs.
        self.capacity_blocks = cap if math.isinf(cap) else int(cap // (bytes_per_block * gpus))
        self.bytes_per_block = float(bytes_per_block)
        self.gpus = gpus
        self.read_bps, self.write_bps, self.latency = cfg.link()
        self.lru = cfg.eviction == "lru"
        self.blocks: OrderedDict[int, list] = OrderedDict()
        self.num_used = 0
        self.free_at = 0.0          # when the link finishes the transfers queued so far
        self.num_hit_tokens = 0
        self.num_load_bytes = self.load_time = 0.0
        self.num_loads = 0
        self.num_store_bytes = self.store_time = 0.0
        self.num_offered_blocks = self.num_written_blocks = 0
        self.num_duplicate_blocks = self.num_evicted_blocks = self.num_copied_blocks = 0
        # The link's bandwidth over time when it degrades (simsched.cluster.links; None: never):
        # an object whose finish(start, latency, bytes, bytes/s) says when a transfer is done.
        self.timeline = None

    def covering(self, key: int, pos: int) -> int:
        """How far from position ``pos`` of segment ``key`` this tier holds blocks (``pos`` if
        it does not hold block ``pos``)."""
        run = self.blocks.get(key)
        if run is not None and run[0] <= pos < run[1]:
            return run[1]
        return pos

    def touch(self, key: int) -> None:
        """A hit on ``key``'s blocks: most recently used (``lru`` only)."""
        if self.lru and key in self.blocks:
            self.blocks.move_to_end(key)

    def store(self, key: int, lo: int, hi: int, now: float) -> None:
        """Offer blocks ``[lo, hi)`` of segment ``key`` (evicted from a GPU at ``now``): write
        those not held, queued on the link; a run not touching the held one replaces it."""
        blocks = self.blocks
        self.num_offered_blocks += hi - lo
        copied = 0
        run = blocks.get(key)
        if run is None:
            added = hi - lo
            blocks[key] = [lo, hi]
        else:
            blocks.move_to_end(key)
            old = run[1] - run[0]
            if lo <= run[1] and hi >= run[0]:       # overlapping or adjacent: one run
                if lo < run[0]:
                    run[0] = lo
                if hi > run[1]:
                    run[1] = hi
                added = run[1] - run[0] - old
            elif lo > run[1]:
                # A gap above the held run: the GPU still holds it (it evicts a segment's
                # blocks from the tail), so copy it down too and keep one run.
                copied = lo - run[1]
                self.num_copied_blocks += copied
                added = hi - run[1]
                run[1] = hi
            else:
                # A gap below the held run: that run can no longer continue any prefix (the
                # gap is nowhere), so the new run replaces it.
                run[0], run[1] = lo, hi
                added = hi - lo
                self.num_used -= old
                self.num_evicted_blocks += old
        self.num_duplicate_blocks += hi - lo + copied - added
        if added:
            self.num_used += added
            self.num_written_blocks += added
            nbytes = added * self.bytes_per_block
            duration = nbytes / self.write_bps
            start = now if now > self.free_at else self.free_at
            if self.timeline is None:
                self.free_at = start + duration
            else:
                self.free_at = self.timeline.finish(start, 0.0, nbytes, self.write_bps)
                duration = self.free_at - start
            self.num_store_bytes += nbytes
            self.store_time += duration
            if self.num_used > self.capacity_blocks:
                self._shrink(self.num_used - self.capacity_blocks)

    def _shrink(self, excess: int) -> None:
        """Evict ``excess`` blocks: the least recently used key's run first, from its tail."""
        blocks = self.blocks
        self.num_used -= excess
        self.num_evicted_blocks += excess
        while excess:
            key, run = next(iter(blocks.items()))
            size = run[1] - run[0]
            if size <= excess:
                del blocks[key]
                excess -= size
            else:
                run[1] -= excess
                excess = 0

    def load(self, num_blocks: int, now: float) -> float:
        """Load ``num_blocks`` blocks to the GPU, starting at ``now`` or when the link is free;
        the seconds from ``now`` until they are there."""
        nbytes = num_blocks * self.bytes_per_block
        start = now if now > self.free_at else self.free_at
        if self.timeline is None:
            duration = self.latency + nbytes / self.read_bps
            self.free_at = start + duration
        else:
            self.free_at = self.timeline.finish(start, self.latency, nbytes, self.read_bps)
            duration = self.free_at - start
        self.num_load_bytes += nbytes
        self.load_time += duration
        self.num_loads += 1
        return self.free_at - now

    def stats(self) -> dict:
        """This tier's counters as a row."""
        return {"tier": self.name, "hit_tokens": self.num_hit_tokens,
                "load_bytes": self.num_load_bytes, "load_time": self.load_time,
                "num_loads": self.num_loads, "store_bytes": self.num_store_bytes,
                "store_time": self.store_time, "blocks_used": self.num_used,
                "evicted_blocks": self.num_evicted_blocks}

    def inconsistency(self) -> str | None:
        """What is wrong with this tier's books (None if nothing)."""
        used = 0
        for key, (lo, hi) in self.blocks.items():
            if not 0 <= lo < hi:
                return f"tier {self.name}: segment {key} holds run [{lo}, {hi})"
            used += hi - lo
        if used != self.num_used or used > self.capacity_blocks:
            return (f"tier {self.name}: {used} blocks in runs, {self.num_used} counted, "
                    f"capacity {self.capacity_blocks}")
        if self.num_offered_blocks + self.num_copied_blocks \
                != self.num_written_blocks + self.num_duplicate_blocks \
                or self.num_written_blocks != self.num_used + self.num_evicted_blocks:
            return (f"tier {self.name}: offered {self.num_offered_blocks} != written "
                    f"{self.num_written_blocks} + duplicates {self.num_duplicate_blocks}, or "
                    f"written != used {self.num_used} + evicted {self.num_evicted_blocks}")
        return None
