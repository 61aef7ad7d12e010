"""llm-d's approximate prefix cache: ``approx-prefix-cache-producer`` and ``prefix-cache-scorer``.

The producer hashes the prompt into blocks, finds per endpoint how many of the leading blocks
the router's own index says it served, and, when the request is dispatched, records the chosen
endpoint against every block hash in a per-endpoint LRU (capacity: the endpoint's KV blocks with
``autoTune``, else ``lruCapacityPerServer``). The scorer gives matched blocks / total blocks
(absolute, no min-max). Source: ``pkg/epp/framework/plugins/requestcontrol/dataproducer/
approximateprefix`` and ``scheduling/scorer/prefix`` of llm-d/llm-d-inference-scheduler
(commit 520af47896e5f06e43d09aca281a1149187b0ffd).

Characters to blocks: llm-d cuts the prompt's text into blocks of ``blockSizeTokens`` x 4
characters (4 characters a token) and chains xxhash64 hashes from the model name. simsched has no
text: a prompt is segments of tokens with chained keys (:class:`~simsched.request.Content`). At 4
characters a token a block of ``blockSizeTokens`` x 4 characters is ``blockSizeTokens`` tokens,
so block ``b`` covers tokens ``[b x B, (b + 1) x B)`` and its hash is chained from the previous
block's hash, the key of the segment holding the block's last token (which names everything
before it) and ``b``. A last partial block is hashed too (with its length), as Go hashes the
remaining bytes; a prompt shorter than one block has no hashes. Two prompts thus share block
hashes exactly where they share token prefixes, which is what llm-d's character hashes
approximate (its byte count differs from 4 per token by the text's real ratio).
"""

from __future__ import annotations

from collections import OrderedDict
from hashlib import blake2b

from simsched.cluster.epp.plugins import Plugin, _int_param

# Defaults of the Go config (types.go): vLLM's block size, 256 blocks, 31,250 entries a pod.
DEFAULT_BLOCK_SIZE_TOKENS = 16
DEFAULT_MAX_PREFIX_BLOCKS = 256
DEFAULT_LRU_CAPACITY = 31250


def model_seed(model: str) -> int:
    """The first link of the chain: a stable 64-bit hash of the model name (Python's own str
    hash changes between processes, and runs must be reproducible)."""
    return int.from_bytes(blake2b(model.encode(), digest_size=8).digest(), "little")


def block_hashes(content, block_size: int, max_blocks: int, seed: int) -> list[int]:
    """The chained block hashes of a prompt (see the module docstring); [] without content."""
    if content is None or not content.keys or block_size <= 0:
        return []
    keys, ends = content.keys, content.ends
    total = ends[-1]
    if total < block_size:
        return []
    if max_blocks > 0 and total > block_size * max_blocks:
        total = block_size * max_blocks          # Go truncates the input to maxBlocks blocks
    out = []
    prev, seg = seed, 0
    start = 0
    while start < total:
        stop = min(start + block_size, total)
        while ends[seg] < stop:                  # the segment holding token stop - 1
            seg += 1
        prev = hash((prev, keys[seg], start, stop))
        out.append(prev)
        start = stop
    return out


class Indexer:
    """Block hash -> endpoints that served it, with a per-endpoint LRU of block hashes.

    As Go's indexer.Add: the hashes go into the endpoint's LRU first (evicting its oldest, which
    drops the endpoint from those hashes' sets), then every hash's set gains the endpoint."""

    def __init__(self, default_capacity: int) -> None:
        self.default_capacity = default_capacity
        self.hash_to_pods: dict[int, set[int]] = {}
        self.lrus: dict[int, OrderedDict] = {}
        self.capacity: dict[int, int] = {}

    def get(self, h: int):
        """The endpoints that may cache block ``h`` (None if none)."""
        return self.hash_to_pods.get(h)

    def add(self, hashes, pod: int, num_blocks: int = 0) -> None:
        """Record that ``pod`` served ``hashes`` (its LRU sized ``num_blocks`` when first seen,
        else the default capacity)."""
        lru = self.lrus.get(pod)
        if lru is None:
            lru = self.lrus[pod] = OrderedDict()
            self.capacity[pod] = num_blocks if num_blocks > 0 else self.default_capacity
        cap = self.capacity[pod]
        pods = self.hash_to_pods
        new = []
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            new.append(h)
            lru[h] = None
            if len(lru) > cap:
                old, _ = lru.popitem(last=False)
                holders = pods.get(old)
                if holders is not None:
                    holders.discard(pod)
                    if not holders:
                        del pods[old]
        # (Only the hashes new to the LRU: one already in it has ``pod`` in its set, since a
        # pod leaves a hash's set only when its LRU evicts the hash.)
        for h in new:
            holders = pods.get(h)
            if holders is None:
                pods[h] = {pod}
            else:
                holders.add(pod)


class ApproxPrefixCacheProducer(Plugin):
    """``approx-prefix-cache-producer`` (parameters and defaults as in Go; ``blockSize``, the
    deprecated character block size, is refused without ``blockSizeTokens`` as in Go)."""

    TYPE, KIND = "approx-prefix-cache-producer", "producer"
    PARAMETERS = {"autoTune": True, "blockSizeTokens": DEFAULT_BLOCK_SIZE_TOKENS, "blockSize": 0,
                  "maxPrefixBlocksToMatch": DEFAULT_MAX_PREFIX_BLOCKS,
                  "maxPrefixTokensToMatch": 0, "lruCapacityPerServer": DEFAULT_LRU_CAPACITY}

    def __init__(self, name: str = "", model: str = "", **params) -> None:
        super().__init__(name, **params)
        p, t = self.params, self.TYPE
        if not isinstance(p["autoTune"], bool):
            raise ValueError(f"{t} parameter autoTune must be true or false, got {p['autoTune']!r}")
        self.auto_tune = p["autoTune"]
        self.block_size_tokens = _int_param(t, "blockSizeTokens", p["blockSizeTokens"])
        legacy = _int_param(t, "blockSize", p["blockSize"])
        if legacy > 0 and self.block_size_tokens <= 0:
            raise ValueError(f"{t}: blockSize ({legacy}) is deprecated; use blockSizeTokens")
        if not self.auto_tune and self.block_size_tokens <= 0:
            raise ValueError(f"{t}: blockSizeTokens must be > 0 when autoTune is false, "
                             f"got {self.block_size_tokens}")
        self.max_blocks = _int_param(t, "maxPrefixBlocksToMatch", p["maxPrefixBlocksToMatch"])
        self.max_tokens = _int_param(t, "maxPrefixTokensToMatch", p["maxPrefixTokensToMatch"], 0)
        self.lru_capacity = _int_param(t, "lruCapacityPerServer", p["lruCapacityPerServer"])
        self.indexer = Indexer(self.lru_capacity)
        self.seed = model_seed(model)

    def block_size(self, replicas) -> int:
        """Tokens a block: the first endpoint's KV block size with ``autoTune``, else
        ``blockSizeTokens``."""
        if self.auto_tune and replicas:
            size = getattr(getattr(replicas[0], "kv", None), "block_size", 0)
            if size > 0:
                return size
        return self.block_size_tokens

    def produce(self, req, replicas) -> tuple[list[int], dict[int, int], int]:
        """``(hashes, matched blocks per endpoint key, block size)`` of ``req`` (Go's
        Produce)."""
        size = self.block_size(replicas)
        max_blocks = self.max_blocks
        if self.max_tokens > 0 and size > 0:
            max_blocks = self.max_tokens // size
        hashes = block_hashes(getattr(req, "content", None), size, max_blocks, self.seed)
        return hashes, self.match(hashes), size

    def match(self, hashes) -> dict[int, int]:
        """Per endpoint, the leading blocks matched: greedy from the first block, stopping at
        the first block no endpoint holds (Go's matchLongestPrefix)."""
        res: dict[int, int] = {}
        get = self.indexer.hash_to_pods.get
        # Consecutive blocks are mostly held by the same endpoints: count runs of equal sets
        # (compared in C) and add each run once per endpoint.
        prev, run = None, 0
        for h in hashes:
            pods = get(h)
            if not pods:
                break
            if pods == prev:
                run += 1
                continue
            if prev is not None:
                for pod in prev:
                    res[pod] = res.get(pod, 0) + run
            prev, run = pods, 1
        if prev is not None:
            for pod in prev:
                res[pod] = res.get(pod, 0) + run
        return res

    def dispatched(self, hashes, replica) -> None:
        """Record the dispatch of a request with ``hashes`` to ``replica`` (Go's PreRequest;
        the index keys endpoints by ``id(replica)``, as Go keys them by pod name)."""
        if not hashes:
            return
        # As Go's makeserver: the endpoint's KV blocks with autoTune, else the built-in 31,250
        # (lruCapacityPerServer only sizes an LRU whose endpoint reports no block count).
        blocks = DEFAULT_LRU_CAPACITY
        if self.auto_tune:
            blocks = getattr(getattr(replica, "kv", None), "num_blocks", 0) or blocks
        self.indexer.add(hashes, id(replica), blocks)


class PrefixCacheScorer(Plugin):
    """``prefix-cache-scorer``: matched blocks / total blocks (0 without blocks)."""

    TYPE, KIND, CONSUMES = "prefix-cache-scorer", "scorer", ("prefix",)
    # The producer's parameters, in the legacy place llm-d's own sample configs still put them
    # (deploy/config/pd-epp-config.yaml): handed to the injected producer (see the config).
    PARAMETERS = ApproxPrefixCacheProducer.PARAMETERS

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        self.producer_params = dict(params)

    BOUNDED = True

    def zero(self, cycle) -> bool:
        """No blocks to match: every endpoint scores 0."""
        return not cycle.get("prefix", ({}, 0))[1]

    def sparse(self, cycle) -> dict:
        """The endpoints that score above 0, with their scores (the others score 0)."""
        match, total = cycle.get("prefix", ({}, 0))
        return {i: c / total for i, c in match.items()}

    def score(self, m, req, cycle, cands) -> list[float]:
        match, total = cycle.get("prefix", ({}, 0))
        if not total:
            return [0.0] * len(cands)
        return [match.get(i, 0) / total for i in cands]
