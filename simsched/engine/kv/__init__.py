"""A replica's KV cache: the manager interface, vLLM's prefix cache and block pool, lower tiers.

:mod:`~simsched.engine.kv.cache` holds the interface and the cache without prefix caching,
:mod:`~simsched.engine.kv.prefix_cache` and :mod:`~simsched.engine.kv.block_pool` vLLM V1's
automatic prefix caching (segments or per-block tables), :mod:`~simsched.engine.kv.tier` and
:mod:`~simsched.engine.kv.tiers` the CPU/disk/remote tiers behind it, and
:mod:`~simsched.engine.kv.factory` builds the one a config asks for.
"""
