"""The generated block of docs/configuration.md (see tools.docs.check_docs): every field of
``SimConfig`` with its default (read from ``SimConfig()``) and, where a catalog names them, the
values it takes."""

from __future__ import annotations

import dataclasses
import math


def _choices() -> dict[tuple[str, str], list[str]]:
    from simsched.cluster.routers import ROUTERS
    from simsched.config import COST_MODELS, LINK_PRESETS, PREEMPTION_MODES, SCHEDULER_STYLES
    from simsched.cost.hardware import GPUS, MODELS
    from simsched.cost.overhead import ENGINE_OVERHEADS
    from simsched.cost.profile_names import ALL_REDUCE_CHOICES
    from simsched.policies import QUEUE_POLICIES, VICTIM_POLICIES
    from simsched.workloads.workload import ARRIVALS, LENGTHS, LONG_PROMPT_POLICIES, WORKLOADS

    return {("scheduler", "style"): SCHEDULER_STYLES, ("scheduler", "policy"): QUEUE_POLICIES,
            ("scheduler", "victim_policy"): VICTIM_POLICIES,
            ("scheduler", "preemption_mode"): PREEMPTION_MODES,
            ("hardware", "model"): MODELS, ("hardware", "gpu"): GPUS,
            ("hardware", "cost_model"): COST_MODELS,
            ("hardware", "engine_overhead"): ENGINE_OVERHEADS,
            ("hardware", "all_reduce"): ALL_REDUCE_CHOICES,
            ("workload", "name"): WORKLOADS, ("workload", "arrival"): ARRIVALS,
            ("workload", "lengths"): LENGTHS,
            ("workload", "long_prompt_policy"): LONG_PROMPT_POLICIES,
            ("cluster", "router"): ROUTERS, ("cluster", "link"): LINK_PRESETS}


def _value(v) -> str:
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    if isinstance(v, str):
        return f"`{v}`"
    if dataclasses.is_dataclass(v):
        return f"`{type(v).__name__}()`"
    return f"`{v!r}`"


def configuration_fields(runs) -> str:
    """docs/configuration.md: one table per part of ``SimConfig()``."""
    from simsched import SimConfig

    cfg = SimConfig()
    choices = _choices()
    out, top = [], []
    for f in dataclasses.fields(cfg):
        part = getattr(cfg, f.name)
        if not dataclasses.is_dataclass(part):
            top.append((f.name, part))
            continue
        out += [f"### `{f.name}` (`{type(part).__name__}`)", "",
                "| field | default | values |", "|---|---|---|"]
        for g in dataclasses.fields(part):
            names = choices.get((f.name, g.name))
            values = ", ".join(f"`{n}`" for n in sorted(names)) if names else ""
            out.append(f"| `{g.name}` | {_value(getattr(part, g.name))} | {values} |")
        out.append("")
    out += ["### The run", "", "| field | default |", "|---|---|"]
    out += [f"| `{name}` | {_value(v)} |" for name, v in top]
    return "\n".join(out) + "\n"
