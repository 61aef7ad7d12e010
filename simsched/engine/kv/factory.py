"""Pick the KV cache manager a config asks for."""

from __future__ import annotations

from simsched.engine.kv.block_pool import BlockPool
from simsched.engine.kv.cache import KVCacheManager
from simsched.engine.kv.tiers import TieredPrefixCache
from simsched.engine.kv.prefix_cache import PrefixCache


def make_kv_cache(num_blocks: int, cache) -> KVCacheManager:
    """The KV cache manager ``cache`` (a :class:`~simsched.config.CacheConfig`) asks for: private
    blocks, or with ``enable_prefix_caching`` a :class:`~simsched.engine.kv.prefix_cache.PrefixCache`
    (``prefix_cache_model="segments"``) or a :class:`~simsched.engine.kv.block_pool.BlockPool`
    (``"blocks"``); with ``kv_tiers`` a :class:`~simsched.engine.kv.tiers.TieredPrefixCache`
    (the replica binds it to its clock and model)."""
    tiers = getattr(cache, "kv_tiers", None)
    if tiers is not None:       # tiers below the GPU (simsched.engine.kv.tiers); bound later
        kv = TieredPrefixCache(num_blocks, cache.block_size, cache.watermark,
                               cache.prefix_hit_rule, tiers)
    elif getattr(cache, "enable_prefix_caching", False):
        hit_rule = getattr(cache, "prefix_hit_rule", "token")
        model = BlockPool if getattr(cache, "prefix_cache_model", "segments") == "blocks" \
            else PrefixCache
        kv = model(num_blocks, cache.block_size, cache.watermark, hit_rule)
    else:
        kv = KVCacheManager(num_blocks, cache.block_size, cache.watermark)
    if getattr(cache, "watermark_counts_null_block", False):
        # vLLM's pool holds one more block, its reserved null block, and rounds the watermark
        # of that count down.
        kv.watermark_blocks = int(cache.watermark * (num_blocks + 1))
    return kv
