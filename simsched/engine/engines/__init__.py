"""The engines other than vLLM: their schedulers and KV caches, registered by name.

``scheduler.engine`` (:mod:`simsched.config.engines`) names one; the replica
(:class:`simsched.engine.replica.Replica`) asks :func:`make_engine` for its KV cache and
scheduler class. vLLM's scheduler is :mod:`simsched.engine.scheduler` (the replica builds it
itself, unchanged). Each engine here subclasses the vLLM :class:`~simsched.engine.scheduler.core.Scheduler`
for the state every engine shares (request progress, lazy decode runs, growth of decode KV,
commit and recording) and replaces its decisions: SGLang's in
:mod:`~simsched.engine.engines.sglang` (with :mod:`.sglang_policy` and :mod:`.radix_cache`),
TensorRT-LLM's in :mod:`~simsched.engine.engines.trtllm`. Adding an engine is one module and
an entry in :data:`ENGINES`.
"""

from __future__ import annotations

import functools


def _sglang(num_blocks: int, cache, parallel):
    from simsched.engine.engines.radix_cache import RadixCache
    from simsched.engine.engines.sglang import SGLangScheduler

    if cache.block_size != 1:
        raise ValueError(f"scheduler.engine='sglang' models SGLang's default page size 1: "
                         f"set cache.block_size=1 (got {cache.block_size}; "
                         "SimConfig.preset('sglang') does)")
    return RadixCache(num_blocks, disable=not cache.enable_prefix_caching), SGLangScheduler


def _trtllm(num_blocks: int, cache, parallel):
    from simsched.engine.engines.trtllm import TRTLLMScheduler
    from simsched.engine.kv.factory import make_kv_cache

    # Each attention-DP rank is one of TensorRT-LLM's executors (its context balancing).
    ranks = parallel.data_parallel_size if parallel is not None else 1
    return make_kv_cache(num_blocks, cache), functools.partial(TRTLLMScheduler,
                                                               attention_dp_size=ranks)


# name -> factory(num_blocks, cache config, parallel layout or None) -> (KV cache manager,
# scheduler class or factory)
ENGINES = {"sglang": _sglang, "trtllm": _trtllm}


def make_engine(engine: str, num_blocks: int, cache, parallel=None):
    """``(kv cache, scheduler class or factory)`` of ``engine`` (not ``"vllm"``) for a replica
    laid out as ``parallel`` (``hardware.parallel``; None: tensor parallelism alone)."""
    try:
        factory = ENGINES[engine]
    except KeyError:
        raise ValueError(f"scheduler.engine {engine!r} has no scheduler here; known: "
                         f"{['vllm', *sorted(ENGINES)]}") from None
    return factory(num_blocks, cache, parallel)
