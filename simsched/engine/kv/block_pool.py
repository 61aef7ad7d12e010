"""vLLM V1's block pool, block by block: a prefix cache that keeps duplicate copies.

:class:`~simsched.engine.kv.prefix_cache.PrefixCache` tracks cached blocks per prompt segment and
shares one copy of each block. vLLM's pool keeps every physical block: a block a request computes
is its own even when an identical block is already cached (block tables are append-only), and
both copies are cached; a lookup takes the copy cached first. That costs memory whenever a
request recomputes a cached block (a fully cached, block-aligned prompt recomputes its last
block; two requests prefilling the same new text at once compute it twice), so it changes which
requests fit. :class:`BlockPool` (``cache.prefix_cache_model = "blocks"``) models the pool as
vLLM 0.33 runs it:

* one free pool: blocks that hold nothing are taken first, then cached blocks nobody holds,
  least recently released first (a request releases its blocks last first);
* a full block is cached when the chunk that fills it is scheduled; decode blocks, which nobody
  else can match, are cached when their request stops (the same hits, no per-step work);
* blocks cached for a chunk that never ran (its request was preempted in the step that
  scheduled it) stay cached, as in vLLM;
* blocks of requests without content are cached too (nothing ever matches them), so they take
  their place in the eviction order.

Operations cost O(blocks touched), not O(segments): meant for parity with vLLM (the ``vllm_v1``
preset), not for million-request runs.
"""

from __future__ import annotations

from collections import OrderedDict

from simsched.engine.kv.cache import KVCacheManager
from simsched.engine.kv.prefix_cache import segment_runs


class _Block:
    """One physical block that holds a full block of tokens: ``key`` is ``(segment key, block
    index)``, or None when no other request can have its tokens."""

    __slots__ = ("key", "ref")

    def __init__(self, key) -> None:
        self.key = key
        self.ref = 1


class _Table:
    """A request's full blocks, in order (the first ``num_hit`` came from the cache)."""

    __slots__ = ("runs", "blocks")

    def __init__(self, runs) -> None:
        self.runs = runs
        self.blocks: list[_Block] = []


def _keys(runs, start: int, stop: int):
    """The keys of block positions ``start .. stop - 1`` (``runs``: :func:`segment_runs`)."""
    if runs is None:
        for _ in range(start, stop):
            yield None
        return
    _, keys, los, his = runs
    for key, lo, hi in zip(keys, los, his):
        if hi <= start:
            continue
        if lo >= stop:
            return
        for j in range(max(lo, start), min(hi, stop)):
            yield (key, j)


class BlockPool(KVCacheManager):
    """A prefix cache of physical blocks with vLLM V1's pool rules (see the module docstring).

    ``num_free`` counts every allocatable block: empty ones plus ``num_evictable`` cached blocks
    nobody holds. ``hit_rule`` is ``cache.prefix_hit_rule``.
    """

    __slots__ = ("_copies", "_lru", "_tables", "_segments", "num_evictable",
                 "num_evicted_blocks", "on_node", "whole_block_hits")
    prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int = 16, watermark: float = 0.0,
                 hit_rule: str = "block") -> None:
        super().__init__(num_blocks, block_size, watermark)
        self._copies: dict[tuple, list[_Block]] = {}   # key -> cached copies, oldest first
        self._lru: OrderedDict[_Block, None] = OrderedDict()   # held by nobody, evict first first
        self._tables: dict[int, _Table] = {}
        self._segments: dict[int, int] = {}      # segment key -> cached blocks (on_node)
        self.num_evictable = 0
        self.num_evicted_blocks = 0
        self.on_node = None
        self.whole_block_hits = hit_rule == "block"

    # ------------------------------------------------------------------ queries
    def _runs(self, req):
        content = req.content
        return None if content is None else segment_runs(content, self.block_size)

    def match(self, req) -> tuple[int, int, int]:
        """``(cached_tokens, hit_blocks, evictable_hit_blocks)`` if ``req`` were admitted now:
        the longest run of cached blocks from the start of its ``prefill_target`` tokens (as
        :meth:`PrefixCache.match <simsched.engine.kv.prefix_cache.PrefixCache.match>`)."""
        runs = self._runs(req)
        if runs is None:
            return 0, 0, 0
        target = req.prefill_target
        size = self.block_size
        limit = (target - 1) // size if self.whole_block_hits \
            else min(target // size, -(-(target - 1) // size))
        hit = evictable = 0
        copies = self._copies
        for key in _keys(runs, 0, limit):
            found = copies.get(key)
            if not found:
                break
            hit += 1
            if not found[0].ref:
                evictable += 1
        if not hit:
            return 0, 0, 0
        cached = hit * size
        return (cached if cached < target else target - 1), hit, evictable

    def num_cached_prefix_tokens(self, req) -> int:
        """Prompt tokens of ``req`` the cache would serve if it were admitted now."""
        return self.match(req)[0]

    # ------------------------------------------------------------------ holding blocks
    def acquire(self, req, num_hit_blocks: int, num_tokens: int = 0) -> None:
        """Admit ``req`` (holding nothing yet): reference its first ``num_hit_blocks`` cached
        blocks (from :meth:`match`), taking evictable ones out of the free pool, and hold blocks
        for its first ``num_tokens`` tokens (:meth:`allocate`)."""
        table = self._tables[req.id] = _Table(self._runs(req))
        if num_hit_blocks:
            lru, copies = self._lru, self._copies
            for key in _keys(table.runs, 0, num_hit_blocks):
                block = copies[key][0]
                if not block.ref:
                    del lru[block]
                    self.num_evictable -= 1
                    self.num_free -= 1
                block.ref += 1
                table.blocks.append(block)
            self._held[req.id] = num_hit_blocks
        if num_tokens:
            self.allocate(req.id, num_tokens)

    def hold(self, req_id: int, num_blocks: int) -> None:
        """Give ``req_id``, which holds nothing, ``num_blocks`` blocks (:meth:`allocate`)."""
        self.allocate(req_id, num_blocks * self.block_size)

    def allocate(self, req_id: int, num_tokens: int) -> int:
        """Grow ``req_id``'s holding to ``num_tokens`` tokens and cache its full blocks (new
        copies, even of blocks cached already); return the blocks added."""
        extra = super().allocate(req_id, num_tokens)
        self._evict_for_allocation()
        table = self._tables.get(req_id)
        if table is not None:
            self._register(table, num_tokens // self.block_size)
        return extra

    def add_block(self, req_id: int) -> None:
        """Give ``req_id`` one more block (a decode's; cached when the request stops)."""
        super().add_block(req_id)
        self._evict_for_allocation()

    def free(self, req_id: int, num_tokens: int = 0) -> int:
        """Release ``req_id``'s blocks, last first; its full blocks of ``num_tokens`` tokens (and
        any cached earlier) stay cached, evictable once nobody holds them. Returns the blocks
        the request held."""
        self.leave_group(req_id)
        held = self._held.pop(req_id, 0)
        table = self._tables.pop(req_id, None)
        if table is None:
            self.num_free += held
            return held
        self._register(table, min(num_tokens // self.block_size, held))
        lru = self._lru
        released = 0
        for block in reversed(table.blocks):
            block.ref -= 1
            if not block.ref:
                lru[block] = None
                released += 1
        self.num_evictable += released
        self.num_free += released + held - len(table.blocks)
        return held

    # ------------------------------------------------------------------ internals
    def _register(self, table: _Table, n: int) -> None:
        """Cache ``table``'s blocks up to position ``n`` (its own new copies)."""
        blocks = table.blocks
        if n <= len(blocks):
            return
        copies, segments = self._copies, self._segments
        for key in _keys(table.runs, len(blocks), n):
            block = _Block(key)
            blocks.append(block)
            if key is None:
                continue
            copies.setdefault(key, []).append(block)
            count = segments.get(key[0], 0)
            segments[key[0]] = count + 1
            if not count and self.on_node is not None:
                self.on_node(key[0], True)

    def _evict_for_allocation(self) -> None:
        """The blocks just taken came from the empty ones first, then the oldest evictable."""
        if self.num_free < self.num_evictable:
            self._evict(self.num_evictable - self.num_free)

    def _evict(self, k: int) -> None:
        """Evict the ``k`` oldest cached blocks nobody holds."""
        lru, copies, segments = self._lru, self._copies, self._segments
        for _ in range(k):
            block, _ = lru.popitem(last=False)
            key = block.key
            if key is None:
                continue
            found = copies[key]
            found.remove(block)
            if not found:
                del copies[key]
            count = segments[key[0]] - 1
            if count:
                segments[key[0]] = count
            else:
                del segments[key[0]]
                if self.on_node is not None:
                    self.on_node(key[0], False)
        self.num_evictable -= k
        self.num_evicted_blocks += k

    # ------------------------------------------------------------------ inspection
    def registered(self) -> dict[int, tuple]:
        """Request id -> ``(number of full blocks it references,)``."""
        return {rid: (len(t.blocks),) for rid, t in self._tables.items()}

    def inconsistency(self, held: dict) -> str | None:
        """What is wrong with the pool's books given ``held`` (request id -> blocks held), or
        None: reference counts, the evictable pool and block conservation."""
        refs: dict[int, int] = {}
        blocks: dict[int, _Block] = {}
        private = 0
        for rid, n in held.items():
            table = self._tables.get(rid)
            own = table.blocks if table is not None else []
            if len(own) > n:
                return f"request {rid} references {len(own)} blocks but holds {n}"
            private += n - len(own)
            for block in own:
                refs[id(block)] = refs.get(id(block), 0) + 1
                blocks[id(block)] = block
        if set(self._tables) - set(held):
            return f"blocks referenced by requests holding none: {set(self._tables) - set(held)}"
        for bid, block in blocks.items():
            if block.ref != refs[bid]:
                return f"block {block.key}: reference count {block.ref}, {refs[bid]} holders"
        if any(block.ref for block in self._lru) or len(self._lru) != self.num_evictable:
            return f"evictable: {self.num_evictable} counted, {len(self._lru)} queued"
        cached = sum(len(c) for c in self._copies.values())
        anonymous = sum(1 for b in self._lru if b.key is None) \
            + sum(1 for b in blocks.values() if b.key is None)
        if cached + anonymous != len(blocks) + len(self._lru):
            return f"{cached} cached copies, {len(blocks)} held and {len(self._lru)} evictable"
        empty = self.num_free - self.num_evictable
        if empty < 0 or len(blocks) + private + self.num_evictable + empty != self.num_blocks:
            return (f"used {len(blocks)} shared + {private} private, evictable "
                    f"{self.num_evictable}, empty {empty} != {self.num_blocks} blocks")
        return None
