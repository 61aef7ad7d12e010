"""Generated blocks of docs/engines.md: each engine's defaults, SGLang parity, the engine study."""

from __future__ import annotations

import json
from pathlib import Path

from tools.docs.doc_format import Drift

ROOT = Path(__file__).resolve().parents[2]


def engines_defaults(runs) -> str:
    """The table of what each engine preset sets (from simsched.config.presets)."""
    from simsched import SimConfig
    from simsched.config.engines import ENGINE_OPTIONS

    rows = ["| field | vllm (`vllm_v1`) | sglang | trtllm |", "|---|---|---|---|"]
    cfgs = [SimConfig.preset(n) for n in ("vllm_v1", "sglang", "trtllm")]
    fields = [("scheduler", "max_num_batched_tokens"), ("scheduler", "max_num_seqs"),
              ("scheduler", "enable_chunked_prefill"), ("cache", "block_size"),
              ("cache", "enable_prefix_caching"), ("hardware", "engine_overhead")]
    for part, name in fields:
        values = [getattr(getattr(c, part), name) for c in cfgs]
        rows.append(f"| `{part}.{name}` | " + " | ".join(f"`{v}`" for v in values) + " |")
    for engine in ("sglang", "trtllm"):
        for name, value in ENGINE_OPTIONS[engine].items():
            cells = ["", "", ""]
            cells[1 if engine == "sglang" else 2] = f"`{value}`"
            rows.append(f"| `engine_options.{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def engines_parity(runs) -> str:
    """The parity sentence, from what benchmarks/engines/parity.py recorded."""
    r = json.loads((ROOT / "benchmarks" / "engines" / "sglang_parity.json").read_text())
    fams = ", ".join(f"{f} {v['identical']:,}/{v['cases']:,}" for f, v in r["families"].items())
    return (f"Against SGLang {r['sglang_version']}'s own classes: {r['identical']:,} of "
            f"{r['cases']:,} seeded cases identical batch for batch ({fams}; "
            f"{r['batches']:,} batches, {r['retractions']:,} retractions).\n")


def engines_choice(runs) -> str:
    """The engine study's table and saturation points (experiments.engine_choice)."""
    table = runs.get("engine_choice")
    from experiments.engine_choice import saturation_points

    points = saturation_points(table)
    lines = ["| engine | rate (req/s) | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | "
             "throughput (req/s) | preemptions | state |", "|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {r.engine} | {r.rate:g} | {r.ttft_p50 * 1e3:.1f} | "
                     f"{r.ttft_p99 * 1e3:.1f} | {r.tpot_p50 * 1e3:.2f} | "
                     f"{r.request_throughput:.2f} | {int(r.num_preemptions)} | {r.saturation} |")
    sat = "; ".join(f"{p.engine} stable up to {p.max_stable_rate:g} req/s, saturated from "
                    f"{p.first_saturated_rate:g} (peak {p.peak_request_throughput:.2f} req/s)"
                    for p in points.itertuples())
    if points.peak_request_throughput.min() <= 0:
        raise Drift("engine_choice: an engine served nothing")
    return "\n".join(lines) + f"\n\nWhere each saturates: {sat}.\n"
