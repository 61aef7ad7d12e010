"""Named engine presets: scheduler and cache settings that reproduce a real engine's decisions.

``vllm_v1`` is vLLM V1's scheduler (checked step for step against vLLM 0.33.0's own
``Scheduler`` by ``benchmarks/vllm_parity.py``; see docs/parity.md): no admission watermark, no
cap on preemptions, no admission in a step that preempted, the newest running request preempted
first (under the ``priority`` policy the least urgent, latest arrival), admission only when the
whole prompt's blocks are free (``reserve_full_isl``), prefix hits rounded down to whole blocks,
the watermark rounded as vLLM's pool does, and the prefix cache modelled block by block as
vLLM's pool keeps it (duplicate copies included). Limits (token budget, sequences, blocks) are not part
of a preset: they stay the config's.
"""

from __future__ import annotations

import sys
from typing import Any

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "vllm_v1": {
        "scheduler": {"style": "stall_free", "preemption": False,
                      "preemption_mode": "recompute", "victim_policy": "newest",
                      "max_num_preemptions": sys.maxsize, "admit_after_preemption": False,
                      "enable_chunked_prefill": True, "max_num_prefills": None,
                      "reserve_full_isl": True},
        "cache": {"watermark": 0.0, "prefix_hit_rule": "block",
                  "watermark_counts_null_block": True, "prefix_cache_model": "blocks"},
    },
}

# The victim vLLM V1 preempts under each of its queue policies (newest otherwise).
_VLLM_VICTIMS = {"priority": "priority_arrival"}


def preset_changes(name: str, changes: dict[str, Any]) -> dict[str, Any]:
    """The dotted field changes of preset ``name`` followed by ``changes`` (which win)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    out = {f"{part}.{k}": v for part, fields in PRESETS[name].items() for k, v in fields.items()}
    bare = {k.split(".", 1)[-1] for k in changes}
    if name == "vllm_v1" and "victim_policy" not in bare:
        policy = next((v for k, v in changes.items() if k.split(".", 1)[-1] == "policy"), "fcfs")
        out["scheduler.victim_policy"] = _VLLM_VICTIMS.get(policy, "newest")
    for key in list(out):
        if key.split(".", 1)[-1] in bare:
            del out[key]
    out.update(changes)
    return out
