"""Automatic prefix caching (vLLM V1 semantics): shared, reference-counted, LRU-evicted KV blocks.

A full KV block has an identity: the content of every token up to its end (a chained hash, from
:class:`~simsched.request.Content`). Running requests whose prompts start alike reference the
same blocks; admission reuses the longest run of cached full blocks from the start of the prompt
and prefills only the rest (always at least one token; with one-token blocks the block of that
token is not a hit: it is a duplicate when registered, see below); a block whose last reference
drops stays cached in an evictable pool, counted as free, until its memory is needed (least
recently released first, a request's tail blocks before its head). Recompute preemption releases a request's
references the same way, so its re-admission may hit them.

How it is kept fast (work grows with the segments a request touches, never with the cache):

* Blocks are grouped by the prompt *segment* their last token falls in (a trace block of 512
  tokens, a system prompt, a turn of a conversation). A node per segment key
  (:class:`~simsched.engine.kv.prefix_blocks._Node`) holds the cached blocks of that segment as
  positions ``[0, num_cached)``: every holder of a block also holds all blocks before it, and
  ties in release time evict the deeper block first, so a segment's cached blocks always form a
  prefix and are evicted from their tail.
* A holder covers positions ``[0, reach)`` of a node; the node keeps how many holders have each
  reach, so a block's reference count is the number of holders reaching past it, and the
  referenced blocks are ``[0, max_reach)``. Evictable blocks ``[max_reach, num_cached)`` form
  runs (blocks released together), queued oldest first in one LRU list shared by all nodes.
* Blocks computed by a prefill are registered when the chunk is scheduled (as vLLM does, so a
  request admitted later in the same iteration hits them); a duplicate of a block already cached
  is dropped and the cached copy referenced instead (vLLM would keep both copies). Blocks filled
  by decoding are registered lazily, when their request finishes or is preempted: only then can
  anyone else use them (the next turn of a session, or the request's own re-admission).
* Requests without content (no ``Request.content``) hold private blocks exactly as
  :class:`~simsched.engine.kv.cache.KVCacheManager` does: they never hit and never populate the
  cache, and pay nothing for it.

Allocation takes never-used ("empty") blocks before evicting cached ones, so a cached block is
evicted only when its memory is needed (vLLM's single free queue may evict a cached block while
uncached free blocks remain further back; this model does not). New blocks are registered before
anything is evicted for them: one that duplicates a cached block needs no memory, and the cached
copy it will reference is never evicted to make room for it.
"""

from __future__ import annotations

from collections import OrderedDict

from simsched.engine.kv.cache import KVCacheError, KVCacheManager
from simsched.engine.kv.prefix_blocks import (  # noqa: F401  (re-exported)
    OPEN_END, _Holding, _Node, _Run, segment_runs)


class PrefixCache(KVCacheManager):
    """A KV cache whose full blocks are shared by content, reference-counted and LRU-evicted.

    ``num_free`` counts every allocatable block: empty ones plus ``num_evictable`` cached blocks
    nobody references. ``num_used`` is therefore the blocks in use by running requests (a shared
    block counts once).
    """

    __slots__ = ("_nodes", "_lru", "_holding", "num_evictable", "num_evicted_blocks", "on_node",
                 "whole_block_hits")
    prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int = 16, watermark: float = 0.0,
                 hit_rule: str = "token") -> None:
        super().__init__(num_blocks, block_size, watermark)
        # "token": a fully cached prompt computes its last token only; "block" (vLLM's): the
        # hit is at most prompt - 1 tokens rounded down to whole blocks.
        self.whole_block_hits = hit_rule == "block"
        self._nodes: dict[int, _Node] = {}
        self._lru: OrderedDict[_Run, None] = OrderedDict()
        self._holding: dict[int, _Holding] = {}
        self.num_evictable = 0
        self.num_evicted_blocks = 0
        # on_node(key, cached): a segment key gained its first cached block (True) or lost its
        # last (False); a cluster's prefix index listens (KV events, as gateways receive them).
        self.on_node = None

    # ------------------------------------------------------------------ queries
    def match(self, req) -> tuple[int, int, int]:
        """``(cached_tokens, hit_blocks, evictable_hit_blocks)`` if ``req`` were admitted now.

        The hit is the longest run of cached full blocks from the start of the request's
        ``prefill_target`` tokens, at most ``prefill_target - 1`` tokens (one is always
        computed); taking its evictable blocks uses that many free blocks. No side effects;
        O(segments of the prompt).
        """
        content = req.content
        if content is None:
            return 0, 0, 0
        runs = segment_runs(content, self.block_size)
        if runs is None:
            return 0, 0, 0
        target = req.prefill_target
        if self.whole_block_hits:
            limit = (target - 1) // self.block_size
        else:
            # Full blocks only, and never a block that only the token to compute would need
            # (with one-token blocks a fully cached prompt holds one block fewer than its length).
            limit = min(target // self.block_size, -(-(target - 1) // self.block_size))
        nodes = self._nodes
        hit = evictable = 0
        for key, lo, hi in zip(runs[1], runs[2], runs[3]):
            if lo >= limit:
                break
            node = nodes.get(key)
            if node is None:
                break
            cap = (hi if hi < limit else limit) - lo
            got = node.num_cached if node.num_cached < cap else cap
            if got > node.max_reach:
                evictable += got - node.max_reach
            hit = lo + got
            if got < cap:
                break
        if not hit:
            return 0, 0, 0
        cached = hit * self.block_size
        return (cached if cached < target else target - 1), hit, evictable

    def num_cached_prefix_tokens(self, req) -> int:
        """Tokens of ``req``'s ``prefill_target`` (its prompt, for a new request) the cache holds.

        What admission would reuse now: cached full blocks from the start, at most all but one
        token. Side-effect free, O(segments of the prompt); for routers and cache-aware policies.
        """
        return self.match(req)[0]

    # ------------------------------------------------------------------ holding blocks
    def acquire(self, req, num_hit_blocks: int, num_tokens: int = 0) -> None:
        """Admit ``req``: reference its first ``num_hit_blocks`` cached blocks (from :meth:`match`)
        and hold blocks for its first ``num_tokens`` tokens (:meth:`allocate`).

        Also records the request's content, so the blocks it computes later are registered.
        ``req`` must hold nothing yet.
        """
        content = req.content
        runs = None if content is None else segment_runs(content, self.block_size)
        if runs is not None:
            holding = self._holding[req.id] = _Holding(runs)
            if num_hit_blocks:
                self.num_free += self._extend(holding, num_hit_blocks, False)
                self._held[req.id] = num_hit_blocks
        if num_tokens:
            self.allocate(req.id, num_tokens)

    def hold(self, req_id: int, num_blocks: int) -> None:
        """Give ``req_id``, which holds nothing and has no content identity, ``num_blocks``
        private blocks (evicting cached ones if the empty ones are too few)."""
        self.allocate(req_id, num_blocks * self.block_size)

    def allocate(self, req_id: int, num_tokens: int) -> int:
        """Grow ``req_id``'s holding to ``num_tokens`` tokens and register its full blocks.

        Returns the blocks added. Registering may find some of them cached already (computed
        concurrently by another request): those are returned to the free pool.
        """
        if req_id in self._members:
            self._settle(req_id)
        held = self._held.get(req_id, 0)
        extra = -(-num_tokens // self.block_size) - held
        if extra > 0:
            if extra > self.num_free:
                raise KVCacheError(f"request {req_id} needs {extra} blocks, {self.num_free} free")
            self.num_free -= extra
            self._held[req_id] = held + extra
        else:
            extra = 0
        holding = self._holding.get(req_id)
        if holding is not None:
            n = num_tokens // self.block_size
            if n > holding.num_registered:
                self.num_free += self._extend(holding, n, True)
        # Evict only now, for the new blocks that found no cached copy: a cached block the
        # request is about to reference (with one-token blocks, a fully cached prompt's last
        # block, which it recomputes) must not be evicted to make room for its own duplicate.
        if self.num_free < self.num_evictable:
            self._evict(self.num_evictable - self.num_free)
        return extra

    def add_block(self, req_id: int) -> None:
        """Give ``req_id`` one more block (a decode's; registered when the request stops)."""
        if self.num_free < 1:
            raise KVCacheError(f"request {req_id} needs 1 block, none free")
        if self.num_free == self.num_evictable:
            run = next(iter(self._lru))
            if run.hi - run.lo > 1:         # the common case, inline: shorten the oldest run
                run.hi -= 1
                run.node.num_cached -= 1
                self.num_evictable -= 1
                self.num_evicted_blocks += 1
            else:
                self._evict(1)
        self._held[req_id] += 1
        self.num_free -= 1

    def free(self, req_id: int, num_tokens: int = 0) -> int:
        """Release ``req_id``'s blocks; the full blocks of its ``num_tokens`` tokens stay cached.

        The blocks the request filled while decoding are registered first (the lazy scheme);
        blocks registered for a chunk that was planned but never computed (a request preempted
        in the iteration that scheduled it) are dropped from the cache when nobody else uses them.
        """
        self.leave_group(req_id)
        held = self._held.pop(req_id, 0)
        holding = self._holding.pop(req_id, None)
        if holding is None:
            self.num_free += held
            return held
        n = num_tokens // self.block_size
        if n > held:
            n = held
        if n > holding.num_registered:
            self.num_free += self._extend(holding, n, True)
        private = held - holding.num_registered
        released, uncached = self._release(holding, n)
        self.num_evictable += released
        self.num_free += private + released + uncached
        return held

    # ------------------------------------------------------------------ internals
    def _extend(self, holding: _Holding, n_new: int, private: bool) -> int:
        """Register (``private``: the holder's own new blocks) or reference blocks up to ``n_new``.

        Returns the change in free blocks: duplicates of cached blocks give the holder's copies
        back, and cached blocks nobody held leave the evictable pool.
        """
        n_old = holding.num_registered
        keys, los, his = holding.keys, holding.los, holding.his
        nodes = self._nodes
        i = holding.index
        freed = taken = 0
        while True:
            lo, hi = los[i], his[i]
            if lo >= n_new:
                break
            old_r = n_old - lo if n_old > lo else 0
            new_r = (hi if hi < n_new else n_new) - lo
            key = keys[i]
            node = nodes.get(key)
            if node is None:
                node = nodes[key] = _Node(key)
                if self.on_node is not None:
                    self.on_node(key, True)
            cached, top_ref = node.num_cached, node.max_reach
            top = new_r if new_r < cached else cached
            if private and top > old_r:
                freed += top - old_r
            if top > top_ref:
                taken += top - top_ref
                self._unevict(node, top)
            if new_r > cached:
                node.num_cached = new_r
            reach = node.reach
            if old_r:
                count = reach[old_r] - 1
                if count:
                    reach[old_r] = count
                else:
                    del reach[old_r]
            reach[new_r] = reach.get(new_r, 0) + 1
            if new_r > top_ref:
                node.max_reach = new_r
            if hi > n_new:
                break
            i += 1
        holding.index = i
        holding.num_registered = n_new
        self.num_evictable -= taken
        return freed - taken

    def _unevict(self, node: _Node, top: int) -> None:
        """Take positions up to ``top`` of ``node`` out of its evictable runs (the newest ones)."""
        runs, lru = node.runs, self._lru
        while runs:
            run = runs[-1]
            if run.hi <= top:
                runs.pop()
                del lru[run]
            else:
                if run.lo < top:
                    run.lo = top
                break

    def _release(self, holding: _Holding, n_computed: int) -> tuple[int, int]:
        """Drop ``holding``'s references, deepest segment first: (blocks now evictable, uncached).

        Blocks past ``n_computed`` that nobody else uses and that end their segment's cached
        blocks are dropped from the cache (they were never computed).
        """
        reg = holding.num_registered
        if not reg:
            return 0, 0
        keys, los, his = holding.keys, holding.los, holding.his
        nodes, lru = self._nodes, self._lru
        j = holding.index if los[holding.index] < reg else holding.index - 1
        released = uncached = 0
        while j >= 0:
            lo = los[j]
            r = (his[j] if his[j] < reg else reg) - lo
            node = nodes[keys[j]]
            reach = node.reach
            count = reach[r] - 1
            j -= 1
            if count:
                reach[r] = count
                continue
            del reach[r]
            if r != node.max_reach:
                continue
            m = max(reach) if reach else 0
            node.max_reach = m
            cut = n_computed - lo
            if cut < r and node.num_cached == r:
                keep = cut if cut > m else m
                uncached += r - keep
                node.num_cached = r = keep
            if r > m:
                run = _Run(node, m, r)
                node.runs.append(run)
                lru[run] = None
                released += r - m
            if not node.num_cached:
                self._drop(node)
        return released, uncached

    def _evict(self, k: int) -> None:
        """Evict ``k`` cached blocks nobody holds, least recently released first."""
        lru = self._lru
        evicted = 0
        while evicted < k:
            run = next(iter(lru))
            node = run.node
            size = run.hi - run.lo
            t = k - evicted
            if t >= size:
                t = size
                del lru[run]
                node.runs.pop(0)
            run.hi -= t
            node.num_cached -= t
            evicted += t
            if not node.num_cached:
                self._drop(node)
        self.num_evictable -= evicted
        self.num_evicted_blocks += evicted

    def _drop(self, node: _Node) -> None:
        """Forget ``node``, whose last cached block is gone (and tell a listening index)."""
        del self._nodes[node.key]
        if self.on_node is not None:
            self.on_node(node.key, False)

    # ------------------------------------------------------------------ inspection
    def nodes(self) -> dict:
        """Segment key -> ``(num_cached, max_reach, {reach: holders}, [(lo, hi) runs])``, a copy."""
        return {k: (n.num_cached, n.max_reach, dict(n.reach), [(r.lo, r.hi) for r in n.runs])
                for k, n in self._nodes.items()}

    def lru_runs(self) -> list[tuple[int, int, int]]:
        """The evictable runs ``(segment key, lo, hi)``, next to be evicted first."""
        return [(r.node.key, r.lo, r.hi) for r in self._lru]

    def registered(self) -> dict[int, tuple]:
        """Request id -> ``(num_registered, keys, los, his)`` of the blocks it references."""
        return {rid: (h.num_registered, h.keys, h.los, h.his) for rid, h in self._holding.items()}
