"""llm-d's ``precise-prefix-cache-scorer``, fed by the replicas' own KV caches.

In llm-d the scorer keeps an index of the blocks each vLLM instance reports through its KV-cache
events (llm-d-kv-cache) and scores an endpoint by the longest run of the prompt's blocks it
holds from the first, divided by the prompt's blocks and clipped to 1 (``absoluteScoredPods`` in
``pkg/epp/framework/plugins/scheduling/scorer/preciseprefixcache/utils.go`` of
llm-d/llm-d-inference-scheduler, commit 520af47896e5f06e43d09aca281a1149187b0ffd). simsched's
replicas are the event source: an endpoint's run is its cache's cached prefix (what an index
fed by every event would hold) in blocks of the engine's block size, the only block size its
events can carry; GPU blocks weigh 1 and lower-tier blocks 0.8 (llm-d-kv-cache's defaults).
"""

from __future__ import annotations

from typing import Mapping

from simsched.cluster.epp.plugins import Plugin


# llm-d-kv-cache's default device-backend weights: a block on the GPU counts 1, on CPU 0.8.
GPU_WEIGHT, TIER_WEIGHT = 1.0, 0.8


def held_blocks(kv, req, size: int) -> float:
    """The prompt's leading blocks ``kv`` holds, GPU blocks at 1 and lower-tier ones at 0.8.

    The cache's side-effect-free ``match`` gives the GPU's leading run (``hit_blocks``) and the
    cached tokens including the tiers' continuation of it (simsched's KV tiers); a cache
    without ``match`` reports cached tokens only (all counted as GPU blocks)."""
    match = getattr(kv, "match", None)
    if match is None:
        return _cached_tokens_of(kv, req) // size
    cached, hit, _ = match(req)
    tier = max(0, -(-cached // size) - hit) if getattr(kv, "tiers", None) else 0
    return GPU_WEIGHT * hit + TIER_WEIGHT * tier


def _cached_tokens_of(kv, req) -> int:
    return int(kv.num_cached_prefix_tokens(req))


def absolute_scores(raw, total_blocks: int) -> list[float]:
    """Go's absoluteScoredPods: ``raw / total_blocks`` clipped to 1; 0 for no blocks."""
    if total_blocks <= 0:
        return [0.0] * len(raw)
    return [0.0 if r <= 0 else min(1.0, r / total_blocks) for r in raw]


class PrecisePrefixCacheScorer(Plugin):
    """``precise-prefix-cache-scorer``: cached prompt blocks / prompt blocks per endpoint.

    ``tokenProcessorConfig``, ``indexerConfig`` and ``kvEventsConfig`` are accepted as mappings
    (the tokenizer, index backend and event transport have nothing to model: the engine's block
    size is used, and events are applied at once). Only replicas the prefix index names as
    holding the prompt's first blocks are asked; the others score 0. Blocks in a lower KV tier
    (``cache.kv_tiers``) count 0.8, as llm-d-kv-cache's CPU backend weight.
    """

    TYPE, KIND, CONSUMES = "precise-prefix-cache-scorer", "scorer", ("precise",)
    PARAMETERS = {"tokenProcessorConfig": {}, "indexerConfig": {}, "kvEventsConfig": {}}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        for key, value in self.params.items():
            if not isinstance(value, Mapping):
                raise ValueError(f"{self.TYPE} parameter {key} must be a mapping, got {value!r}")

    def score(self, m, req, cycle, cands) -> list[float]:
        replicas = cycle["replicas"]
        if getattr(req, "content", None) is None or not cands:
            return [0.0] * len(cands)
        size = replicas[cands[0]].kv.block_size
        holders = cycle.get("holders")
        raw = [0 if holders is not None and i not in holders
               else held_blocks(replicas[i].kv, req, size) for i in cands]
        return absolute_scores(raw, req.num_prompt_tokens // size)
