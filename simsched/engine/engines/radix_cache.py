"""SGLang's prefix cache: a token-granular radix tree whose unlocked leaves are evicted LRU first.

Written after SGLang 0.5.9's ``python/sglang/srt/mem_cache/radix_cache.py`` (``RadixCache``:
``match_prefix`` / ``_match_prefix_helper``, ``_split_node``, ``insert`` / ``_insert_helper``,
``evict``, ``inc_lock_ref`` / ``dec_lock_ref``, ``cache_unfinished_req``,
``cache_finished_req``) and ``mem_cache/common.py`` (``evict_from_tree_cache``,
``alloc_token_slots``), page size 1 (SGLang's default):

* A node holds a run of tokens (its ``key``); a child is found by its first token. A match
  that ends inside a node splits it there (as SGLang's does, even for a request that is then not
  admitted), and every node on the path gets the access time. simsched has no token ids: a
  token is named by the prompt segment that holds it and its position
  (:class:`~simsched.request.Content`'s chained keys), so a key is a tuple of pieces
  ``(segment key, first position, end position)``; equal names are equal tokens.
* Memory is SGLang's token pool: ``available`` tokens, tokens a request holds privately (just
  prefilled or decoded, not yet in the tree) and tree tokens, *protected* while a request locks
  their node (``inc_lock_ref`` up to the root) and *evictable* otherwise. ``evict(n)`` frees
  unlocked leaves, least recently accessed first (ties: the older node), until ``n`` tokens are
  freed; a parent left childless and unlocked becomes a leaf in turn.
* After a prefill chunk the request's tokens go into the tree (``cache_unfinished_req``:
  duplicates of tokens another request inserted meanwhile are freed, the lock moves to the new
  node); a finished request inserts its prompt and output but the last token
  (``cache_finished_req``); a retracted one inserts nothing and frees what it holds privately
  (``is_insert=False``), so only its prefilled tokens stay cached.

As a :class:`~simsched.engine.kv.cache.KVManager` (blocks are tokens): ``num_free`` counts
available and evictable tokens, ``num_held`` a request's locked prefix plus its private tokens.
A request without content gets names of its own: its tokens enter the tree and take memory as
SGLang's do, but nobody else matches them. With ``disable=True`` (``--disable-radix-cache``)
nothing is ever matched or inserted: SGLang's ``ChunkCache``.
"""

from __future__ import annotations

import heapq

from simsched.engine.kv.cache import KVCacheError, KVCacheManager


class TreeNode:
    """A radix-tree node: ``key`` (pieces), children by first-token name, lock count, last
    access (a tick: SGLang's ``time.monotonic()``) and creation order (for ties)."""

    __slots__ = ("parent", "children", "key", "lock_ref", "last_access_time", "id")

    def __init__(self, key: tuple, parent, tick: int, node_id: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict = {}
        self.lock_ref = 0
        self.last_access_time = tick
        self.id = node_id

    def __len__(self) -> int:
        return self.key[-1][2] - self.key[0][1] if self.key else 0


def cut(pieces, start: int, end: int) -> tuple:
    """The pieces of a token stream covering positions ``[start, end)``."""
    out = []
    for seg, lo, hi in pieces:
        if hi <= start:
            continue
        if lo >= end:
            break
        out.append((seg, max(lo, start), min(hi, end)))
    return tuple(out)


def _first(key: tuple) -> tuple:
    """A key's first-token name: SGLang's ``get_child_key_fn`` at page size 1."""
    return key[0][0], key[0][1]


def _common(key: tuple, pieces: tuple) -> int:
    """Tokens ``key`` shares with ``pieces`` (both start at the same position)."""
    n = 0
    j = 0
    for seg, lo, hi in key:
        while j < len(pieces) and pieces[j][2] <= lo:
            j += 1
        if j == len(pieces) or pieces[j][0] != seg or pieces[j][1] > lo:
            return n
        end = min(hi, pieces[j][2])
        n += end - lo
        if end < hi:
            return n
    return n


class RadixCache(KVCacheManager):
    """SGLang's ``RadixCache`` over a token pool of ``num_tokens`` (module docstring)."""

    prefix_caching = True

    def __init__(self, num_tokens: int, disable: bool = False) -> None:
        super().__init__(num_tokens, 1, 0.0)
        self.disable = disable
        self.prefix_caching = not disable
        self._ids = 0
        self._tick = 0
        self.root_node = TreeNode((), None, 0, 0)
        self.root_node.lock_ref = 1
        self.num_evictable = 0          # SGLang's evictable_size_
        self.protected_size_ = 0
        self.num_evicted_blocks = 0
        self._leaves: set = set()       # unlocked childless nodes (evictable_leaves)
        self._locks: dict[int, tuple] = {}      # request id -> (locked node, its tokens)
        self._streams: dict[int, tuple] = {}    # request id -> its prompt pieces

    # ------------------------------------------------------------------ token names
    def stream(self, req, num_tokens: int) -> tuple:
        """The pieces naming ``req``'s first ``num_tokens`` tokens (prompt, then output)."""
        prompt = self._streams.get(req.id)
        if prompt is None:
            content = req.content
            if content is not None and content.keys:
                starts = (0,) + tuple(content.ends[:-1])
                prompt = tuple(zip(content.keys, starts, content.ends))
                out = content.output_key
            else:
                prompt = ((("prompt", req.id), 0, req.num_prompt_tokens),)
                out = ("output", req.id)
            prompt = prompt + ((out, req.num_prompt_tokens,
                                req.num_prompt_tokens + req.num_output_tokens),)
            self._streams[req.id] = prompt
        return cut(prompt, 0, num_tokens)

    def _new_node(self, key: tuple, parent) -> TreeNode:
        self._ids += 1
        self._tick += 1
        return TreeNode(key, parent, self._tick, self._ids)

    def _leaf_status(self, node: TreeNode) -> None:
        if node is self.root_node:
            return
        if not node.children and node.lock_ref == 0:
            self._leaves.add(node)
        else:
            self._leaves.discard(node)

    # ------------------------------------------------------------------ the tree
    def match_prefix(self, pieces: tuple) -> tuple[int, TreeNode]:
        """``(matched tokens, last node)`` of the stream ``pieces``; splits the node where the
        match ends inside one and stamps the path's access time (``_match_prefix_helper``)."""
        node = self.root_node
        if self.disable or not pieces:
            return 0, node
        self._tick += 1
        node.last_access_time = self._tick
        pos, end = 0, pieces[-1][2]
        while pos < end:
            rest = cut(pieces, pos, end)
            child = node.children.get(_first(rest))
            if child is None:
                break
            child.last_access_time = self._tick
            m = _common(child.key, rest)
            if m < len(child):
                node = self._split_node(child, m)
                pos += m
                break
            node = child
            pos += m
        return pos, node

    def peek_prefix(self, pieces: tuple) -> int:
        """Tokens of ``pieces`` the tree holds, changing nothing (routers, reports)."""
        if self.disable or not pieces:
            return 0
        node, pos, end = self.root_node, 0, pieces[-1][2]
        while pos < end:
            rest = cut(pieces, pos, end)
            child = node.children.get(_first(rest))
            if child is None:
                break
            m = _common(child.key, rest)
            pos += m
            if m < len(child):
                break
            node = child
        return pos

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """``_split_node``: a new node takes ``child``'s first ``split_len`` tokens (and its
        lock count) and becomes its parent."""
        lo = child.key[0][1]
        new = self._new_node(cut(child.key, lo, lo + split_len), child.parent)
        new.lock_ref = child.lock_ref
        child.key = cut(child.key, lo + split_len, child.key[-1][2])
        new.children = {_first(child.key): child}
        new.parent.children[_first(new.key)] = new
        child.parent = new
        return new

    def insert(self, pieces: tuple) -> int:
        """Insert the stream ``pieces``; return how many of its tokens were already in the tree
        (``_insert_helper``). The new tokens form one unlocked leaf (evictable)."""
        node = self.root_node
        self._tick += 1
        node.last_access_time = self._tick
        if not pieces:
            return 0
        pos, end = 0, pieces[-1][2]
        while pos < end:
            rest = cut(pieces, pos, end)
            child = node.children.get(_first(rest))
            if child is None:
                break
            child.last_access_time = self._tick
            m = _common(child.key, rest)
            pos += m
            node = self._split_node(child, m) if m < len(child) else child
        if pos < end:
            new = self._new_node(cut(pieces, pos, end), node)
            node.children[_first(new.key)] = new
            self.num_evictable += end - pos
            self.num_free += end - pos
            self._leaf_status(node)
            self._leaf_status(new)
        return pos

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction (one more lock each)."""
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.num_evictable -= len(node)
                self.protected_size_ += len(node)
                self.num_free -= len(node)
            node.lock_ref += 1
            self._leaf_status(node)
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Release one lock of ``node`` and its ancestors."""
        while node is not self.root_node:
            if node.lock_ref == 1:
                self.num_evictable += len(node)
                self.protected_size_ -= len(node)
                self.num_free += len(node)
            node.lock_ref -= 1
            self._leaf_status(node)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free unlocked leaves, least recently accessed first, until ``num_tokens`` tokens are
        freed or none is left (``RadixCache.evict``); return the tokens freed."""
        heap = [(n.last_access_time, n.id, n) for n in self._leaves]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            n = len(x)
            evicted += n
            self.num_evictable -= n         # evictable -> available: num_free unchanged
            parent = x.parent
            del parent.children[_first(x.key)]
            self._leaves.discard(x)
            if parent is not self.root_node and not parent.children and parent.lock_ref == 0:
                self._leaves.add(parent)
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        self.num_evicted_blocks += evicted
        return evicted

    def evictable_size(self) -> int:
        """Tree tokens no request locks."""
        return self.num_evictable

    def available_size(self) -> int:
        """Tokens of the pool nobody holds (the allocator's ``available_size``)."""
        return self.num_free - self.num_evictable

    def evict_from_tree_cache(self, num_tokens: int) -> None:
        """``evict_from_tree_cache``: if fewer than ``num_tokens`` tokens are available, evict
        ``num_tokens`` (not the shortfall: SGLang's rule)."""
        if not self.disable and self.available_size() < num_tokens:
            self.evict(num_tokens)

    # ------------------------------------------------------------------ a request's KV
    def lock(self, rid: int, node: TreeNode, num_tokens: int) -> None:
        """Request ``rid`` (holding nothing) locks ``node``, its matched ``num_tokens``."""
        self.inc_lock_ref(node)
        self._locks[rid] = (node, num_tokens)

    def alloc(self, rid: int, num_tokens: int) -> None:
        """``alloc_token_slots``: ``num_tokens`` private tokens for ``rid``, evicting first."""
        self.evict_from_tree_cache(num_tokens)
        if num_tokens > self.available_size():
            raise KVCacheError(f"request {rid} needs {num_tokens} tokens, "
                               f"{self.available_size()} available")
        if rid in self._members:
            self._settle(rid)
        self._held[rid] = self._held.get(rid, 0) + num_tokens
        self.num_free -= num_tokens

    def protected_len(self, rid: int) -> int:
        """Tokens of ``rid`` held through its tree lock (SGLang's ``cache_protected_len``)."""
        entry = self._locks.get(rid)
        return entry[1] if entry else 0

    def _drop_private(self, rid: int, num_tokens: int) -> None:
        if rid in self._members:
            self._settle(rid)
        left = self._held.get(rid, 0) - num_tokens
        if left < 0:
            raise KVCacheError(f"request {rid}: frees {num_tokens} private tokens, holds "
                               f"{left + num_tokens}")
        self._held[rid] = left
        if not left and rid not in self._members:
            del self._held[rid]

    def cache_unfinished_req(self, req, num_tokens: int) -> None:
        """After a prefill chunk: insert ``req``'s first ``num_tokens`` tokens, free the
        duplicates, move its lock to the node that now ends them."""
        if self.disable:
            return
        rid = req.id
        pieces = self.stream(req, num_tokens)
        protected = self.protected_len(rid)
        private = num_tokens - protected
        new_prefix_len = self.insert(pieces)
        # Tokens [protected, new_prefix_len) were inserted by others meanwhile: free ours;
        # the rest moved into the tree (insert counted them as free and evictable).
        self._drop_private(rid, private)
        self.num_free += max(0, new_prefix_len - protected)
        matched, node = self.match_prefix(pieces)
        old = self._locks.pop(rid, None)
        self.inc_lock_ref(node)
        if old is not None:
            self.dec_lock_ref(old[0])
        self._locks[rid] = (node, matched)

    def cache_finished_req(self, req, num_tokens: int, is_insert: bool = True) -> None:
        """``req`` stops holding KV: with ``is_insert`` its first ``num_tokens`` tokens go into
        the tree (duplicates and the rest freed); without, its private tokens are freed and
        only its locked prefix stays cached (retraction)."""
        rid = req.id
        protected = self.protected_len(rid)
        private = self.num_held(rid) - protected
        if self.disable or not is_insert:
            self._drop_private(rid, private)
            self.num_free += private
        else:
            pieces = self.stream(req, num_tokens)
            new_prefix_len = self.insert(pieces)
            self._drop_private(rid, private)
            # Inserted tokens came from the private ones; duplicates and any tail are freed.
            inserted = max(0, num_tokens - max(new_prefix_len, protected))
            self.num_free += private - inserted
        self.leave_group(rid)
        self._held.pop(rid, None)
        entry = self._locks.pop(rid, None)
        if entry is not None:
            self.dec_lock_ref(entry[0])

    def forget(self, rid: int) -> None:
        """``rid`` has finished: its memo of token names goes."""
        self._streams.pop(rid, None)

    # ------------------------------------------------------------------ KVManager views
    def num_held(self, req_id: int) -> int:
        return super().num_held(req_id) + self.protected_len(req_id)

    def holders(self) -> dict[int, int]:
        held = {rid: n for rid, n in super().holders().items() if n}
        for rid, (_, n) in self._locks.items():
            held[rid] = held.get(rid, 0) + n
        return {rid: n for rid, n in held.items() if n}

    def registered(self) -> dict:
        return {rid: n for rid, (_, n) in self._locks.items()}

    def match(self, req) -> tuple[int, int, int]:
        """``(cached tokens, 0, 0)`` of ``req``'s prompt (all but its last token), unchanged."""
        n = self.peek_prefix(self.stream(req, max(0, req.prefill_target - 1)))
        return n, 0, 0

    def num_cached_prefix_tokens(self, req) -> int:
        return self.match(req)[0]

    def inconsistency(self, held: dict) -> str:
        """What breaks the books (empty if nothing): tree sizes, locks, token conservation."""
        evictable = protected = 0
        locks: dict = {}
        for node, _ in self._locks.values():
            while node is not self.root_node:
                locks[node] = locks.get(node, 0) + 1
                node = node.parent
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.lock_ref != locks.get(node, 0):
                return f"node {node.id}: lock_ref {node.lock_ref}, {locks.get(node, 0)} locks"
            if node.lock_ref:
                protected += len(node)
            else:
                evictable += len(node)
        if evictable != self.num_evictable or protected != self.protected_size_:
            return (f"tree: {evictable} evictable / {protected} protected, counted "
                    f"{self.num_evictable} / {self.protected_size_}")
        private = sum(held.values()) - sum(n for _, n in self._locks.values())
        available = self.available_size()
        if available < 0 or available + evictable + protected + private != self.num_blocks:
            return (f"tokens: {available} available + {evictable} evictable + {protected} "
                    f"protected + {private} private != {self.num_blocks}")
        return ""
