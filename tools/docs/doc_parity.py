"""The generated block of docs/parity.md: the recorded vLLM decisions replayed through simsched
(see tools.docs.check_docs). Needs no vLLM: the fixtures hold vLLM's side."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tools.docs.doc_format import claim, md_table

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "vllm_parity"


def parity_fixtures(runs) -> str:
    """Cases and steps identical when simsched's vllm_v1 preset replays the fixtures."""
    from benchmarks.parity.cases import Case
    from benchmarks.parity.compare import compare, effects, unpack, unpack_effects
    from benchmarks.parity.sim import run_sim_effects

    rows = []
    for mode in ("sync", "async"):
        data = json.loads((FIXTURES / f"{mode}.json").read_text())
        cases = same = steps = same_steps = preempted = hits = same_effects = 0
        for record in data["cases"]:
            case, vllm_steps = Case.from_json(record["case"]), unpack(record["steps"])
            sim_steps, sim_effects = run_sim_effects(case)
            outcome = compare(vllm_steps, sim_steps)
            agree = not effects(unpack_effects(record["effects"]), sim_effects)
            cases += 1
            same += outcome.identical and agree
            same_effects += agree
            steps += outcome.num_steps
            same_steps += outcome.num_same
            preempted += sum(len(s[2]) for s in vllm_steps)
            hits += sum(1 for s in vllm_steps for _, _, c in s[1] if c)
        rows.append({"vLLM " + data["vllm_version"]: data["scheduler"],
                     "simsched": "vllm_v1" + (" + plan_ahead" if mode == "async" else ""),
                     "cases identical": f"{same:,} of {cases:,}",
                     "steps identical": f"{same_steps:,} of {steps:,}",
                     "effects identical": f"{same_effects:,} of {cases:,}",
                     "preemptions": preempted, "admissions served from the cache": hits})
        claim(same == cases, f"simsched reproduces every recorded {mode} case")
    return md_table(pd.DataFrame(rows)) + "\n"
