"""Paged KV-cache block managers: one interface, private blocks (the default) or a prefix cache.

A request holding ``n`` cached tokens holds exactly ``ceil(n / block_size)`` blocks. Only block
counts are tracked (which physical block holds what does not affect scheduling). The scheduler
asks a manager only what :class:`KVManager` lists. :class:`KVCacheManager` never shares a block
(its ``match`` never hits); :class:`~simsched.engine.kv.prefix_cache.PrefixCache`
(``cache.enable_prefix_caching``) shares full blocks of equal content between requests and keeps
released ones cached until their memory is needed;
:func:`~simsched.engine.kv.factory.make_kv_cache` picks one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

_NO_HIT = (0, 0, 0)


@runtime_checkable
class KVManager(Protocol):
    """What the scheduler asks of a KV-cache manager (vLLM V1's ``KVCacheManager`` calls, by
    block counts): a request's life is ``match`` (what of its prompt is cached), ``acquire``
    (admission: the hit blocks plus its first chunk's), ``allocate`` / ``add_block`` and the
    growth groups (prefill chunks, decode tokens), ``free`` (finished, preempted or handed off).

    ``num_free`` counts every allocatable block (a prefix cache's evictable cached blocks
    included); ``watermark_blocks`` are kept back by admissions while requests run;
    ``prefix_caching`` says whether ``match`` can hit at all (the iteration log, routers and
    cache-aware policies skip asking when it cannot).
    """

    num_blocks: int
    block_size: int
    num_free: int
    watermark_blocks: int
    num_evictable: int          # cached blocks nobody holds (part of num_free)
    num_evicted_blocks: int     # cumulative evictions of cached blocks
    prefix_caching: bool

    @property
    def num_used(self) -> int:
        """Blocks held by requests (a shared block counts once)."""

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""

    def num_held(self, req_id: int) -> int:
        """Blocks held by request ``req_id`` (0 if none)."""

    def num_new_blocks(self, req_id: int, num_tokens: int) -> int:
        """Extra blocks ``req_id`` needs to hold ``num_tokens`` tokens in total."""

    def can_allocate(self, num_new_blocks: int, use_watermark: bool = False) -> bool:
        """Whether ``num_new_blocks`` more blocks are free (beyond the watermark if asked)."""

    def match(self, req) -> tuple[int, int, int]:
        """``(cached_tokens, hit_blocks, evictable_hit_blocks)`` if ``req`` were admitted now:
        its first ``cached_tokens`` tokens need no prefill, ``hit_blocks`` blocks are reused and
        ``evictable_hit_blocks`` of them now count as free. No side effects."""

    def num_cached_prefix_tokens(self, req) -> int:
        """``match(req)[0]``: what admission would reuse now (routers, cache-aware policies)."""

    def acquire(self, req, num_hit_blocks: int, num_tokens: int = 0) -> None:
        """Admit ``req``, which holds nothing: reference its first ``num_hit_blocks`` cached
        blocks (from :meth:`match`) and hold blocks for its first ``num_tokens`` tokens."""

    def hold(self, req_id: int, num_blocks: int) -> None:
        """Give ``req_id``, which holds nothing, ``num_blocks`` private blocks (never shared:
        for a request without a content identity, whose blocks nobody could reuse)."""

    def allocate(self, req_id: int, num_tokens: int) -> int:
        """Grow ``req_id``'s holding to cover ``num_tokens`` tokens; return the blocks added."""

    def add_block(self, req_id: int) -> None:
        """Give ``req_id`` one more block (decode: the caller knows one is due)."""

    def join_group(self, req_id: int, group: int) -> None:
        """Make ``req_id`` a member of decode growth group ``group``."""

    def shrink(self, req_id: int, num_tokens: int) -> int:
        """Give back ``req_id``'s blocks beyond those of its first ``num_tokens`` tokens
        (a speculative step's rejected proposals); return how many."""

    def leave_group(self, req_id: int) -> None:
        """Take ``req_id`` out of its growth group."""

    def grow_group(self, group: int, num_members: int) -> bool:
        """One more block for each of the ``num_members`` members of ``group``, in O(1); False
        (nothing done) if that many are not free without evicting cached blocks."""

    def grow_groups(self, first_group: int, sizes: list) -> bool:
        """:meth:`grow_group` of groups ``first_group``, the next, ... (cyclically), ``sizes``
        their members (a group of 0 is skipped); False (nothing done) if their sum is not free."""

    def free(self, req_id: int, num_tokens: int = 0) -> int:
        """Release ``req_id``'s blocks (the KV of its first ``num_tokens`` tokens was computed:
        a prefix cache keeps those blocks cached); return how many it held."""

    def holders(self) -> dict[int, int]:
        """A copy of request id -> blocks held."""

    def registered(self) -> dict:
        """Request id -> the cached blocks it references (empty without sharing)."""


class KVCacheError(RuntimeError):
    """An allocation the manager cannot satisfy, or a free of something not held."""


class KVCacheManager:
    """A :class:`KVManager` of private blocks: counts free and held KV blocks, never shares one
    (``match`` never hits); admission keeps a watermark of free blocks back.

    Decoders grow in *groups* (:meth:`join_group`): :meth:`grow_group` gives every member of a
    group one more block in O(1), and each member's count catches up when it is read or freed.
    """

    __slots__ = ("num_blocks", "block_size", "num_free", "watermark_blocks", "_held",
                 "_grants", "_members")
    prefix_caching = False
    num_evictable = 0           # cached blocks nobody holds (always 0 here)
    num_evicted_blocks = 0      # cumulative evictions (always 0 here)

    def __init__(self, num_blocks: int, block_size: int = 16, watermark: float = 0.0) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0.0 <= watermark <= 0.5:
            raise ValueError(f"watermark must be in [0, 0.5], got {watermark}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_free = num_blocks
        self.watermark_blocks = int(watermark * num_blocks)
        self._held: dict[int, int] = {}
        self._grants: list[int] = []                   # blocks granted per group member so far
        self._members: dict[int, tuple] = {}           # req id -> (group, grants when counted)

    @property
    def num_used(self) -> int:
        """Blocks held by requests."""
        return self.num_blocks - self.num_free

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def num_held(self, req_id: int) -> int:
        """Blocks held by request ``req_id`` (0 if none)."""
        member = self._members.get(req_id)
        if member is None:
            return self._held.get(req_id, 0)
        return self._held[req_id] + self._grants[member[0]] - member[1]

    def num_new_blocks(self, req_id: int, num_tokens: int) -> int:
        """Extra blocks ``req_id`` needs to hold ``num_tokens`` tokens in total."""
        return max(0, self.blocks_for(num_tokens) - self.num_held(req_id))

    def join_group(self, req_id: int, group: int) -> None:
        """Make ``req_id`` (which holds blocks) a member of growth group ``group`` (an int >= 0)."""
        grants = self._grants
        if group >= len(grants):
            grants.extend([0] * (group + 1 - len(grants)))
        self._members[req_id] = (group, grants[group])

    def leave_group(self, req_id: int) -> None:
        """Take ``req_id`` out of its growth group, its count brought up to date (if a member)."""
        member = self._members.pop(req_id, None)
        if member is not None:
            self._held[req_id] += self._grants[member[0]] - member[1]

    def _settle(self, req_id: int) -> None:
        """Bring a group member's count in ``_held`` up to date (it stays a member)."""
        member = self._members.get(req_id)
        if member is not None:
            group = member[0]
            self._held[req_id] += self._grants[group] - member[1]
            self._members[req_id] = (group, self._grants[group])

    def grow_group(self, group: int, num_members: int) -> bool:
        """Give each of the ``num_members`` members of ``group`` one more block, in O(1).

        The caller passes the group's size (it keeps the members). False, and nothing done, if
        fewer blocks than that are free without evicting cached ones: grow them one by one.
        """
        if num_members > self.num_free - self.num_evictable:
            return False
        self._grants[group] += 1
        self.num_free -= num_members
        return True

    def grow_groups(self, first_group: int, sizes: list) -> bool:
        """:meth:`grow_group` of groups ``first_group``, the next, ... (cyclically, modulo
        ``block_size``), ``sizes`` their numbers of members: the growth of a run of quiet decode
        steps at once (:mod:`simsched.engine.scheduler.quiet`). False, and nothing done, if fewer blocks
        than their sum are free."""
        total = sum(sizes)
        if total > self.num_free - self.num_evictable:
            return False
        grants, last = self._grants, self.block_size - 1
        group = first_group
        for size in sizes:
            if size:
                grants[group] += 1
            group = group + 1 if group < last else 0
        self.num_free -= total
        return True

    def can_allocate(self, num_new_blocks: int, use_watermark: bool = False) -> bool:
        """Whether ``num_new_blocks`` more blocks are free (beyond the watermark if asked)."""
        reserve = self.watermark_blocks if use_watermark else 0
        return self.num_free - num_new_blocks >= reserve

    def allocate(self, req_id: int, num_tokens: int) -> int:
        """Grow ``req_id``'s holding to cover ``num_tokens`` tokens; return the blocks added."""
        if req_id in self._members:
            self._settle(req_id)
        held = self._held.get(req_id, 0)
        extra = -(-num_tokens // self.block_size) - held
        if extra <= 0:
            return 0
        if extra > self.num_free:
            raise KVCacheError(f"request {req_id} needs {extra} blocks, {self.num_free} free")
        self._held[req_id] = self._held.get(req_id, 0) + extra
        self.num_free -= extra
        return extra

    def hold(self, req_id: int, num_blocks: int) -> None:
        """Give ``req_id``, which holds nothing, ``num_blocks`` blocks (an admission's first
        chunk whose block count the caller knows: :meth:`acquire` without counting them)."""
        if num_blocks > self.num_free:
            raise KVCacheError(f"request {req_id} needs {num_blocks} blocks, {self.num_free} free")
        self._held[req_id] = num_blocks
        self.num_free -= num_blocks

    def match(self, req) -> tuple[int, int, int]:
        """``(0, 0, 0)``: nothing is cached for another request to reuse."""
        return _NO_HIT

    def acquire(self, req, num_hit_blocks: int, num_tokens: int = 0) -> None:
        """Admit ``req``, which holds nothing: hold the blocks of its first ``num_tokens``
        tokens (:meth:`allocate` without the bookkeeping of an existing holding).
        ``num_hit_blocks`` is 0 (:meth:`match` never hits)."""
        num_blocks = -(-num_tokens // self.block_size)
        if num_blocks:
            if num_blocks > self.num_free:
                raise KVCacheError(f"request {req.id} needs {num_blocks} blocks, "
                                   f"{self.num_free} free")
            self._held[req.id] = num_blocks
            self.num_free -= num_blocks

    def add_block(self, req_id: int) -> None:
        """Give ``req_id`` one more block (decode fast path: the caller knows one is due)."""
        if self.num_free < 1:
            raise KVCacheError(f"request {req_id} needs 1 block, none free")
        self._held[req_id] += 1
        self.num_free -= 1

    def shrink(self, req_id: int, num_tokens: int) -> int:
        """Give back ``req_id``'s blocks beyond those of its first ``num_tokens`` tokens; return
        how many. Only a decoder's tail blocks go (a speculative step's rejected proposals):
        never registered in a prefix cache (decode blocks are registered when freed), so the
        subclasses share this."""
        if req_id in self._members:
            self._settle(req_id)
        extra = self._held[req_id] + (num_tokens // -self.block_size)
        if extra <= 0:
            return 0
        self._held[req_id] -= extra
        self.num_free += extra
        return extra

    def free(self, req_id: int, num_tokens: int = 0) -> int:
        """Release all of ``req_id``'s blocks; return how many.

        ``num_tokens`` (the tokens whose KV the request computed) matters only to a prefix cache.
        """
        member = self._members.pop(req_id, None)     # leave_group, inlined
        n = self._held.pop(req_id, 0)
        if member is not None:
            n += self._grants[member[0]] - member[1]
        self.num_free += n
        return n

    def num_cached_prefix_tokens(self, req) -> int:
        """Prompt tokens of ``req`` the cache would serve if it were admitted now (none here)."""
        return 0

    def registered(self) -> dict:
        """Request id -> cached blocks referenced: none (no block is shared)."""
        return {}

    def holders(self) -> dict[int, int]:
        """A copy of request id -> blocks held."""
        held = dict(self._held)
        grants = self._grants
        for req_id, (group, counted) in self._members.items():
            held[req_id] += grants[group] - counted
        return held

