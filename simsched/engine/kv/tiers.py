"""A tiered KV cache: prefix blocks evicted from the GPU kept in CPU memory, on disk or in a
(cluster-shared) remote store, and loaded back on a hit instead of being recomputed.

Built only when ``cache.kv_tiers`` is set (:func:`~simsched.engine.kv.factory.make_kv_cache`
picks :class:`TieredPrefixCache`); without it nothing here runs and results are bit-identical.

The model (docs/kv_tiers.md says why):

* **Residency.** A :class:`Tier` keeps, per prompt segment key of the GPU's prefix cache
  (:mod:`simsched.engine.kv.prefix_cache`), one run of block positions ``[lo, hi)``: a block is in
  at most one place per tier. Tiers are inclusive: a block loaded back stays in its tier.
  Evictions take whole keys' runs from their tail, least recently used key first (``lru``: a
  store or a hit makes a key recent; ``fifo``: only a store).
* **Write-down.** Every block the GPU evicts is offered to every tier; a tier writes the blocks
  it does not hold yet (a store over its link, asynchronous: it delays no step, but occupies the
  link, so a load queued behind it waits). A stored block is usable at once: any later load on
  that link queues behind the store, so it cannot overtake it.
* **Hits.** Admission matches the GPU's cached blocks first, then continues the prefix block by
  block in the tiers (fastest first). The GPU blocks are referenced as before; the tier blocks
  get GPU blocks of their own (counted in the admission's need) and are registered as computed.
* **Loads are charged to the step that admits the request** (as LMCache's synchronous and
  layer-wise modes do, and as swap-ins are here): each tier's load takes
  ``latency + bytes / read bandwidth`` after the link's earlier transfers; the step waits for its
  slowest load, before the forward (``overlap_layers=False``) or overlapped layer by layer
  (the step lasts ``max(W + C / L, W / L + C)`` for load time ``W``, compute ``C``, ``L`` layers).
  Charging the step keeps one clock for the GPU loop; an asynchronous load that lets other
  requests run meanwhile (vLLM's offloading connector) is not modelled.

Byte counts are per GPU (a tensor-parallel replica's GPUs load their shares over their own links
at once); tier capacities are per replica (all its GPUs' shares).
"""

from __future__ import annotations

from simsched.cost import hardware
from simsched.engine.kv.tier import Tier
from simsched.engine.kv.prefix_cache import PrefixCache, segment_runs

_NO_HIT = (0, 0, 0)


class TieredPrefixCache(PrefixCache):
    """A :class:`~simsched.engine.kv.prefix_cache.PrefixCache` whose evicted blocks go down to
    :class:`~simsched.engine.kv.tier.Tier` objects and come back on a hit (see the module
    docstring).

    Usable once :meth:`bind` has built the tiers (the replica does it). ``load_time_of`` maps a
    request id to the step time its loads added (its TTFT's loading part).
    """

    __slots__ = ("config", "tiers", "env", "bytes_per_block", "gpus", "_memo", "_pending",
                 "load_time_of", "exposed_load_time", "num_offered_blocks", "link_faults")

    def __init__(self, num_blocks: int, block_size: int, watermark: float, hit_rule: str,
                 config) -> None:
        super().__init__(num_blocks, block_size, watermark, hit_rule)
        self.config = config
        self.tiers: list[Tier] = []
        self.env = None
        self.bytes_per_block = 0.0
        self.gpus = 1
        self._memo = None           # the last match with tier blocks: (req, hit, loads, cut)
        self._pending: list = []    # (request, seconds until its loads are done), this step
        self.load_time_of: dict[int, float] = {}
        self.exposed_load_time = 0.0
        self.num_offered_blocks = 0
        self.link_faults = False    # a tier's link may be down (simsched.cluster.links)

    def bind(self, env, hw, cost_model):
        """Build the tiers for ``hw``'s KV bytes and return ``cost_model`` wrapped so that each
        step also takes its loads' time (:class:`LoadCharge`)."""
        self.env = env
        self.bytes_per_block = float(hardware.kv_bytes_per_token(hw) * self.block_size)
        self.gpus = hw.tensor_parallel_size
        self.tiers = [Tier(t, self.bytes_per_block, self.gpus) for t in self.config.tiers]
        return LoadCharge(cost_model, self, hardware.model_spec(hw).num_layers,
                          self.config.overlap_layers)

    # ------------------------------------------------------------------ hits
    def match(self, req) -> tuple[int, int, int]:
        """As :meth:`PrefixCache.match`, the hit continued in the tiers: ``cached_tokens``
        counts GPU and tier blocks, ``hit_blocks`` and ``evictable_hit_blocks`` the GPU's
        leading run only (tier blocks need GPU blocks of their own). No side effects beyond
        remembering the tier part for :meth:`acquire`."""
        self._memo = None
        content = req.content
        if content is None:
            return _NO_HIT
        runs = segment_runs(content, self.block_size)
        if runs is None:
            return _NO_HIT
        target = req.prefill_target
        if self.whole_block_hits:
            limit = (target - 1) // self.block_size
        else:
            limit = min(target // self.block_size, -(-(target - 1) // self.block_size))
        nodes, tiers = self._nodes, self.tiers
        if self.link_faults:        # a tier whose link is down serves no hit: recomputed
            now = self.env.now
            tiers = [t for t in tiers if t.timeline is None or not t.timeline.down_at(now)]
        hit = evictable = total = 0
        on_gpu = True               # still in the GPU's leading run
        loads = None                # tier -> [blocks, keys]
        last = None                 # the tier holding the last hit block (None: the GPU)
        for key, lo, hi in zip(runs[1], runs[2], runs[3]):
            if lo >= limit:
                break
            node = nodes.get(key)
            cap = (hi if hi < limit else limit) - lo
            got = 0
            if node is not None:
                got = node.num_cached if node.num_cached < cap else cap
                if got:
                    last = None
            if on_gpu:
                if node is not None:
                    if got > node.max_reach:
                        evictable += got - node.max_reach
                    hit = lo + got
                if got == cap:
                    total = hit
                    continue
                on_gpu = False
            reach = got
            for tier in tiers:
                top = tier.covering(key, reach)
                if top > reach:
                    if top > cap:
                        top = cap
                    if loads is None:
                        loads = {}
                    entry = loads.setdefault(tier, [0, []])
                    entry[0] += top - reach
                    entry[1].append(key)
                    reach, last = top, tier
                    if reach == cap:
                        break
            total = lo + reach
            if reach < cap:
                break
        if not total:
            return _NO_HIT
        cached = total * self.block_size
        if cached >= target:
            cached = target - 1
        if loads is not None:
            self._memo = (req, hit, loads, last, total * self.block_size - cached)
        return cached, hit, evictable

    def acquire(self, req, num_hit_blocks: int, num_tokens: int = 0) -> None:
        """As :meth:`PrefixCache.acquire`; a hit that :meth:`match` continued in the tiers
        starts its loads (charged to this step) before its blocks are taken and registered."""
        memo = self._memo
        if memo is not None:
            self._memo = None
            if memo[0] is req and memo[1] == num_hit_blocks:
                self._load(req, memo)
        super().acquire(req, num_hit_blocks, num_tokens)

    def _load(self, req, memo) -> None:
        _, _, loads, last, cut = memo
        now = self.env.now
        wait = 0.0
        for tier, (num_blocks, keys) in loads.items():
            tokens = num_blocks * self.block_size
            if tier is last:
                tokens -= cut       # the hit stops short of its last block's end
            tier.num_hit_tokens += tokens
            for key in keys:
                tier.touch(key)
            done = tier.load(num_blocks, now)
            if done > wait:
                wait = done
        self._pending.append((req, wait))

    # ------------------------------------------------------------------ write-down
    def add_block(self, req_id: int) -> None:
        """As :meth:`PrefixCache.add_block`, the block it evicts (if any) written down."""
        if self.num_free == self.num_evictable and self.num_free >= 1:
            self._evict(1)
        super().add_block(req_id)

    def _evict(self, k: int) -> None:
        """As :meth:`PrefixCache._evict`, each run it will cut offered to every tier first
        (the same walk: the oldest runs, the last one possibly in part, from their tails)."""
        tiers = self.tiers
        now = self.env.now
        left = k
        for run in self._lru:
            size = run.hi - run.lo
            t = left if left < size else size
            for tier in tiers:
                tier.store(run.node.key, run.hi - t, run.hi, now)
            left -= t
            if not left:
                break
        self.num_offered_blocks += k
        super()._evict(k)

    # ------------------------------------------------------------------ inspection
    def tier_stats(self) -> list[dict]:
        """One row of counters per tier (a shared tier's are the whole cluster's)."""
        return [t.stats() for t in self.tiers]

    def tier_inconsistency(self) -> str | None:
        """What is wrong with the tiers' books (None if nothing): each tier's runs and counts,
        and every block the GPU evicted offered to each of this replica's own tiers."""
        for tier in self.tiers:
            problem = tier.inconsistency()
            if problem:
                return problem
        for tier in self.tiers[:len(self.config.tiers)]:
            if tier.num_offered_blocks != self.num_offered_blocks:
                return (f"tier {tier.name}: {tier.num_offered_blocks} blocks offered, the GPU "
                        f"evicted {self.num_offered_blocks}")
        return None


class LoadCharge:
    """A cost model whose step time also waits for the loads of the requests the step admitted
    (:class:`TieredPrefixCache`); everything else is the wrapped model's."""

    def __init__(self, inner, kv: TieredPrefixCache, num_layers: int, overlap: bool) -> None:
        self.inner = inner
        self.kv = kv
        self.num_layers = num_layers
        self.overlap = overlap

    def iteration_time(self, batch) -> float:
        """The wrapped model's time, plus what this step's loads add to it."""
        compute = self.inner.iteration_time(batch)
        pending = self.kv._pending
        if not pending:
            return compute
        wait = max(w for _, w in pending)
        if self.overlap:        # layer i computes while layer i + 1 loads
            n = self.num_layers
            extra = max(wait + compute / n, wait / n + compute) - compute
        else:
            extra = wait
        times = self.kv.load_time_of
        for req, _ in pending:
            times[req.id] = times.get(req.id, 0.0) + extra
        pending.clear()
        self.kv.exposed_load_time += extra
        return compute + extra

    def __getattr__(self, name):
        return getattr(self.inner, name)


def share_remote_tier(caches: list, cfg) -> Tier:
    """One ``remote`` tier (``cfg``, a KVTierConfig) below every cache of ``caches`` (the
    replicas' :class:`TieredPrefixCache`, bound), with one link shared by all; returned."""
    first = caches[0]
    tier = Tier(cfg, first.bytes_per_block, first.gpus) \
        if isinstance(first, TieredPrefixCache) else None
    for kv in caches:
        join_remote_tier(kv, tier)
    return tier


def join_remote_tier(kv, tier: Tier | None) -> None:
    """Put the shared ``tier`` below ``kv`` (a replica's cache, also one an autoscaler adds):
    every replica's cache must be tiered, with the tier's KV bytes per block and GPUs."""
    if tier is None or not isinstance(kv, TieredPrefixCache) \
            or (float(kv.bytes_per_block), kv.gpus) != (tier.bytes_per_block, tier.gpus):
        got = (getattr(kv, "bytes_per_block", None), getattr(kv, "gpus", None))
        raise ValueError("cluster.kv_remote_tier needs every replica to have cache.kv_tiers and "
                         f"the same KV bytes per block and GPUs (got {got})")
    kv.tiers.append(tier)
    if tier.timeline is not None:   # its link degrades (simsched.cluster.links)
        kv.link_faults = True


def tier_summary(caches: list) -> dict:
    """Run totals of the replicas' tiers (a shared tier once) as summary metrics:
    ``kv_{tier}_hit_tokens``, ``_load_bytes``, ``_load_time``, ``_store_bytes``,
    ``_store_time``, ``kv_load_step_time`` (what loads added to step times) and
    ``kv_request_load_time`` (the same, summed over the requests they delayed); empty without
    tiers."""
    tiers = {id(t): t for kv in caches for t in getattr(kv, "tiers", ())}
    out: dict = {}
    for tier in tiers.values():
        for key, value in (("hit_tokens", tier.num_hit_tokens),
                           ("load_bytes", tier.num_load_bytes), ("load_time", tier.load_time),
                           ("store_bytes", tier.num_store_bytes),
                           ("store_time", tier.store_time)):
            name = f"kv_{tier.name}_{key}"
            out[name] = out.get(name, 0) + value
    cached = [kv for kv in caches if isinstance(kv, TieredPrefixCache)]
    if cached:
        out["kv_load_step_time"] = sum(kv.exposed_load_time for kv in cached)
        # Summed over requests (a step's loads delay each request admitted in it).
        out["kv_request_load_time"] = sum(sum(kv.load_time_of.values()) for kv in cached)
    return out

