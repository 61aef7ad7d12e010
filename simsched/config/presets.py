"""Named engine presets: scheduler and cache settings that reproduce an engine's decisions.

``vllm_v1`` is vLLM V1's scheduler (checked step for step against vLLM 0.33.0's own
``Scheduler`` and ``AsyncScheduler`` by ``benchmarks/vllm_parity.py``; see docs/parity.md): no
admission watermark, no cap on preemptions, no admission in a step that preempted, the newest
running request preempted first (under the ``priority`` policy the least urgent, latest
arrival: victim ``"vllm_v1"``), admission only when the whole prompt's blocks are free
(``reserve_full_isl``), prefix hits rounded down to whole blocks, the watermark rounded as
vLLM's pool does, the prefix cache modelled block by block as vLLM's pool keeps it (duplicate
copies included), and an asynchronous engine planning ahead as vLLM's ``AsyncScheduler`` does.
Since issue 40 these are :class:`~simsched.config.SimConfig`'s defaults, so ``vllm_v1`` changes
nothing; it stays a valid name.

``classic`` gives the defaults before issue 40 (simsched's own rules: a 1 % watermark, at most 8
preemptions per iteration, the victim that has generated the fewest tokens, admission on the
first chunk's blocks, hits of all but the last token, one shared copy per cached block, and an
asynchronous engine modelled by its arrival rule only). Limits (token budget, sequences, blocks)
are not part of a preset: they stay the config's.

``sglang`` and ``trtllm`` are the other engines (:mod:`simsched.config.engines`), each at its own
defaults, limits included (they differ from vLLM's): ``sglang`` is SGLang 0.5.9's
``ServerArgs`` on a 60-160 GiB GPU (H100, H200: ``--chunked-prefill-size 8192``; SGLang picks
4096 below 60 GiB and 16384 above 160 GiB), page size 1, the radix cache on, at most 4096 running
requests (SGLang derives its limit from the KV pool below that: see
:mod:`simsched.engine.engines.sglang`) and the ``sglang_silicon`` engine profile; ``trtllm`` is
TensorRT-LLM 1.x's ``LlmArgs`` (``max_batch_size`` 2048, ``max_num_tokens`` 8192, chunked
prefill off, ``tokens_per_block`` 32, block reuse on, the ``GUARANTEED_NO_EVICT`` capacity
policy) and the ``trtllm`` engine profile. Both engines take ``hardware.all_reduce="auto"``
(measured all-reduces where the GPU has them): their own custom all-reduce kernels are not the
vLLM 0.15 one that the fitted latency term describes.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "vllm_v1": {"scheduler": {}, "cache": {}},     # the defaults (simsched.config.parts)
    "classic": {
        "scheduler": {"victim_policy": "fewest_generated", "max_num_preemptions": 8,
                      "reserve_full_isl": False, "plan_ahead": False},
        "cache": {"watermark": 0.01, "prefix_hit_rule": "token",
                  "watermark_counts_null_block": False, "prefix_cache_model": "segments"},
    },
    "sglang": {
        "scheduler": {"engine": "sglang", "max_num_batched_tokens": 8192, "max_num_seqs": 4096,
                      "enable_chunked_prefill": True},
        "cache": {"block_size": 1, "enable_prefix_caching": True, "watermark": 0.0},
        "hardware": {"engine_overhead": "sglang_silicon", "all_reduce": "auto"},
    },
    "trtllm": {
        "scheduler": {"engine": "trtllm", "max_num_batched_tokens": 8192, "max_num_seqs": 2048,
                      "enable_chunked_prefill": False},
        "cache": {"block_size": 32, "enable_prefix_caching": True, "watermark": 0.0},
        "hardware": {"engine_overhead": "trtllm", "all_reduce": "auto"},
    },
}


def preset_changes(name: str, changes: dict[str, Any]) -> dict[str, Any]:
    """The dotted field changes of preset ``name`` followed by ``changes`` (which win; a flat or
    dotted name in ``changes`` replaces the preset's value of that field)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    out = {f"{part}.{k}": v for part, fields in PRESETS[name].items() for k, v in fields.items()}
    bare = {k.split(".", 1)[-1] for k in changes}
    for key in list(out):
        if key.split(".", 1)[-1] in bare:
            del out[key]
    out.update(changes)
    return out
