"""What a router sees of the replicas: exact load kept incrementally, or a periodic snapshot.

:class:`ReplicaLoad` keeps, per replica, the requests routed there and not yet done
(``outstanding``), their outstanding tokens (``tokens``: prompt tokens until the first token,
plus the output tokens until the end) and the share of KV blocks in use (``kv_use``). The cluster
updates it on routing, first token and completion, and the replicas report their KV use once per
iteration, so every update is O(1), or O(log replicas) for a figure a router needs ordered
(:class:`MinIndex`). :class:`Snapshot` copies those figures every ``refresh_interval`` seconds
(O(replicas) per refresh, never per request), as a gateway scraping engine metrics does; routing
on it herds requests onto whichever replica looked least loaded at the last scrape.

Both are plain objects with the same read-only surface, so routers are tested on hand-built views.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from simsched.engine.kv.prefix_cache import segment_runs

# The load figures a router may ask ``least`` for (routers' ``needs``, power_of_two's metric).
METRICS = ("outstanding", "tokens", "kv_use")


class MinIndex:
    """The index of the smallest of ``n`` values under point updates (ties: lowest index).

    A heap of ``(value, index)`` entries with lazy deletion: :meth:`update` pushes the new entry
    (one C-level heap push), :meth:`argmin` drops entries from the top that are stale (their
    index's value has changed since) until a current one is on top. When stale entries make the
    heap four times as long as ``n``, it is rebuilt from the values, so it holds O(n) entries and
    an update costs O(log n) amortised. (It replaces a tournament tree, whose update replayed a
    leaf's path to the root in Python: most of the routing cost of a 64-replica fleet.)
    """

    __slots__ = ("values", "_heap", "_limit")

    def __init__(self, values) -> None:
        values = list(values)
        if not values:
            raise ValueError("MinIndex needs at least one value")
        self.values = values
        self._limit = 4 * len(values) + 16
        self._rebuild()

    def _rebuild(self) -> None:
        heap = [(value, i) for i, value in enumerate(self.values)]
        heapify(heap)
        self._heap = heap

    def update(self, i: int, value) -> None:
        """Set value ``i``."""
        self.values[i] = value
        heap = self._heap
        heappush(heap, (value, i))
        if len(heap) > self._limit:
            self._rebuild()

    def argmin(self) -> int:
        """The index of the smallest value (the lowest such index on ties)."""
        heap, values = self._heap, self.values
        while True:
            value, i = heap[0]
            current = values[i]
            if current is value or current == value:    # (``is``: a NaN set is still current)
                return i
            heappop(heap)       # stale: that index has another value (and its own entry) now


class ReplicaLoad:
    """Exact per-replica load, updated incrementally (the view of a router with fresh state).

    ``replicas`` are the replica objects (routers ask their KV caches about cached prefixes).
    ``ordered`` names the figures (of :data:`METRICS`) a router needs the minimum of; only those
    keep a :class:`MinIndex`. ``output_tokens`` is the output length counted for each request in
    ``tokens`` (None: its true length, which the simulator knows and a real router estimates).
    """

    def __init__(self, replicas, ordered=(), output_tokens: int | None = None) -> None:
        n = len(replicas)
        self.replicas = replicas
        self.num_replicas = n
        self.outstanding = [0] * n
        self.tokens = [0] * n
        self.kv_use = [0.0] * n
        self.total_outstanding = 0
        self.output_tokens = output_tokens
        self.prefix_holders: PrefixHolders | None = None    # set by a cache-aware cluster
        # The replicas (their indices) whose waiting count may have changed since a router last
        # read them (each replica's ``on_queue`` adds to it): set only in a cluster where nothing
        # but a replica's own loop and its arrivals reach its queues; None: count them all.
        self.queue_changed: set[int] | None = None
        # Called as on_finished(i, req) after a request ends (a router's own in-flight counters).
        self.on_finished = None
        # Called as on_first_token(i, req) at a request's first token (llm-d's latency
        # producer learns TTFTs then).
        self.on_first_token = None
        unknown = set(ordered) - set(METRICS)
        if unknown:
            raise ValueError(f"unknown load figure(s) {sorted(unknown)}; known: {METRICS}")
        self._ordered = tuple(ordered)
        self.reindex()

    def reindex(self) -> None:
        """Build the ordered figures' indexes from the figures as they are (an autoscaled
        fleet's router view sets them in bulk when its routing set changes)."""
        self._index = {name: MinIndex(getattr(self, name)) for name in self._ordered}
        self._outstanding_index = self._index.get("outstanding")
        self._tokens_index = self._index.get("tokens")
        self._kv_index = self._index.get("kv_use")

    def least(self, metric: str) -> int:
        """The replica with the smallest ``metric`` (lowest index on ties)."""
        index = self._index.get(metric)
        if index is not None:
            return index.argmin()
        values = getattr(self, metric)
        return min(range(self.num_replicas), key=values.__getitem__)

    # ------------------------------------------------------------------ updates
    # Called once or twice per request: kept flat (no helper calls) for the cluster's fast path.
    def routed(self, i: int, req) -> None:
        """``req`` was queued at replica ``i``."""
        self.outstanding[i] += 1
        self.total_outstanding += 1
        out = req.num_output_tokens if self.output_tokens is None else self.output_tokens
        self.tokens[i] += req.num_prompt_tokens + out
        if self._outstanding_index is not None:
            self._outstanding_index.update(i, self.outstanding[i])
        if self._tokens_index is not None:
            self._tokens_index.update(i, self.tokens[i])

    def first_token(self, i: int, req) -> None:
        """``req`` finished its prefill at replica ``i``."""
        self.tokens[i] -= req.num_prompt_tokens
        if self._tokens_index is not None:
            self._tokens_index.update(i, self.tokens[i])
        if self.on_first_token is not None:
            self.on_first_token(i, req)

    def finished(self, i: int, req) -> None:
        """``req`` finished at replica ``i``."""
        self.outstanding[i] -= 1
        self.total_outstanding -= 1
        self.tokens[i] -= req.num_output_tokens if self.output_tokens is None \
            else self.output_tokens
        if self._outstanding_index is not None:
            self._outstanding_index.update(i, self.outstanding[i])
        if self._tokens_index is not None:
            self._tokens_index.update(i, self.tokens[i])
        if self.on_finished is not None:
            self.on_finished(i, req)

    def aborted(self, i: int, req) -> None:
        """``req`` left replica ``i`` unfinished (its client gave up, or the replica failed):
        off its figures, its prompt too if its first token never came."""
        if req.first_token_at != req.first_token_at:        # NaN: its prompt was still due
            self.first_token(i, req)
        self.finished(i, req)

    def kv_changed(self, i: int, num_used: int, num_blocks: int) -> None:
        """Replica ``i`` now holds ``num_used`` of its ``num_blocks`` KV blocks."""
        use = num_used / num_blocks
        self.kv_use[i] = use
        if self._kv_index is not None:
            self._kv_index.update(i, use)


class Snapshot:
    """A copy of a :class:`ReplicaLoad` taken at :meth:`refresh` (the stale view of a router).

    Cached-prefix queries still go to the live replicas (``replicas``): only load is scraped.
    ``live`` is the exact view (counters a router keeps at dispatch are never stale); a router
    may set ``scrape``, a callable whose result each refresh stores in ``scraped`` (gauges the
    load figures lack, such as the replicas' waiting queues).
    """

    def __init__(self, load: ReplicaLoad) -> None:
        self._load = load
        self.scrape = None
        self.scraped = None
        self.replicas = load.replicas
        self.prefix_holders = load.prefix_holders      # live, as the caches are
        self.num_replicas = load.num_replicas
        self.taken_at = 0.0
        self.refresh(0.0)

    @property
    def live(self) -> ReplicaLoad:
        """The exact view this snapshot copies."""
        return self._load

    def refresh(self, now: float) -> None:
        """Copy the live figures (O(replicas)); the minima are recomputed once, when asked."""
        load = self._load
        self.outstanding = list(load.outstanding)
        self.tokens = list(load.tokens)
        self.kv_use = list(load.kv_use)
        self.total_outstanding = load.total_outstanding
        if self.scrape is not None:
            self.scraped = self.scrape()
        self.taken_at = now
        self._least: dict[str, int] = {}

    def least(self, metric: str) -> int:
        """The replica with the smallest ``metric`` at the last refresh (lowest index on ties)."""
        i = self._least.get(metric)
        if i is None:
            values = getattr(self, metric)
            i = self._least[metric] = min(range(self.num_replicas), key=values.__getitem__)
        return i


class PrefixHolders:
    """Which replicas cache any block of a segment key, kept from the caches' node events.

    A replica can serve a prefix of a prompt only if it caches blocks of the prompt's first block
    run, so a cache-aware router need only score those replicas (lowest index first): with
    affinity a prefix lives on a few replicas, and routing costs O(prompt segments x holders),
    not O(replicas). Built only when every replica has a prefix cache of one block size.
    """

    def __init__(self, replicas) -> None:
        self.block_size = replicas[0].kv.block_size
        self._holders: dict[int, set[int]] = {}
        for i, replica in enumerate(replicas):
            replica.kv.on_node = self._listener(i)

    @classmethod
    def attach(cls, replicas) -> "PrefixHolders | None":
        """An index over ``replicas``' caches, or None where one cannot be kept."""
        kvs = [replica.kv for replica in replicas]
        if not all(kv.prefix_caching for kv in kvs) \
                or len({kv.block_size for kv in kvs}) != 1:
            return None
        return cls(replicas)

    def _listener(self, i: int):
        holders = self._holders

        def on_node(key: int, cached: bool) -> None:
            if cached:
                holders.setdefault(key, set()).add(i)
            else:
                replicas = holders[key]
                replicas.discard(i)
                if not replicas:
                    del holders[key]
        return on_node

    def candidates(self, req) -> list[int]:
        """The replicas that may hold a cached prefix of ``req``'s prompt, in index order."""
        runs = segment_runs(req.content, self.block_size)
        if runs is None:
            return []
        holders = self._holders.get(runs[1][0])
        return sorted(holders) if holders else []

    def holders(self) -> dict[int, set[int]]:
        """A copy of segment key -> replicas caching blocks of it."""
        return {key: set(replicas) for key, replicas in self._holders.items()}


class TokenBucket:
    """Admission rate limit: ``rate`` tokens/s up to ``burst``; each request takes one token."""

    __slots__ = ("rate", "burst", "tokens", "at")

    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = max(1.0, rate) if burst is None else burst
        self.tokens = self.burst
        self.at = 0.0

    def take(self, now: float) -> bool:
        """Whether a request arriving at ``now`` is admitted (and takes its token)."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
