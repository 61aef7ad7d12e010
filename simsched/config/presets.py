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
