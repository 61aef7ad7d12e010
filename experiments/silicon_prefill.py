"""Where the silicon rows' TTFT goes: one prefill as vLLM served it against the kernel sums.

    python -m experiments.silicon_prefill [--max-concurrency 4] [--terms neutral|fitted]
                                          [--kernels default|aiconfigurator] [--out DIR]

At the lowest concurrency of the silicon set (C = 4) a request waits for little: the rest of
the decode step in flight, the step already planned (async scheduling), its own prefill step
and the output path. simsched models all of these; the experiment splits each simulated TTFT
into the prefill step (the request's prompt with the other C - 1 requests decoding, timed by
the cost model with its parts) and the rest (``wait``: simulated TTFT minus that step), and
takes the measured TTFT minus the same wait as the prefill step as vLLM served it
(``implied``). The ratio ``implied / simulated`` per (GPU, model, layout) says how much longer
one prefill took than the kernel sums, and the parts say where (GEMMs, routed experts,
attention, all-reduces). Rows of the silicon set only (``experiments.validate_silicon``; the
Blackwell rows are never read). ``--terms neutral`` (default): the kernel sums alone, the
``vllm_v1`` profile (neutral silicon terms); ``--terms fitted``: with the fitted silicon terms
(:mod:`simsched.cost.vllm_silicon`, the default profile's).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.cost import factory, vllm_silicon
from simsched.cost.base import Batch
from experiments import validate_silicon as vs
from experiments._common import print_table
from experiments._common import parser as make_parser


def prefill_step(cm, row) -> dict:
    """The simulated step that prefills a mean prompt of ``row`` (InferenceX's lengths are
    uniform in [0.8, 1] x nominal: 0.9 on average) beside C - 1 decoding requests, in ms by
    part (``experts``: the routed experts' share of ``linear``)."""
    c, n = int(row.concurrency), int(0.9 * row.isl)
    ctx = (c - 1) * int(0.9 * row.isl + 0.45 * row.osl)
    parts = cm.breakdown(Batch([n], [0], c - 1, ctx))
    inner = getattr(cm, "last", cm)          # a ParallelCostModel's stage model
    experts = getattr(inner.kernels, "moe_experts", None)
    tokens = n + c - 1
    return {"step_ms": 1e3 * sum(parts.values()),
            "linear_ms": 1e3 * parts["linear"], "attention_ms": 1e3 * parts["attention"],
            "comm_ms": 1e3 * parts["communication"],
            "experts_ms": 0.0 if experts is None else 1e3 * experts[min(tokens, len(experts) - 1)]}


def table(rows: pd.DataFrame, terms: dict | None, kernels: str = "default") -> pd.DataFrame:
    """One line per row: measured and simulated TTFT, the simulated prefill step and its parts,
    the wait, the implied measured step and the ratio."""
    engine = dataclasses.replace(vs.ENGINES["vllm"], engine_terms=terms)
    out = []
    for row in rows.itertuples():
        sim = vs.simulate_row(row, engine, kernels=kernels)
        if sim["reason"]:
            continue
        cfg, _ = vs.config_of(row, engine, kernels=kernels)
        cm = factory.make_cost_model(cfg.hardware) if terms is None \
            else factory.engine_terms_cost_model(cfg.hardware, terms)
        step = prefill_step(cm, row)
        wait = sim["sim_ttft_ms"] - step["step_ms"]
        out.append({"gpu": row.gpu, "model": row.model, "layout": sim["layout"],
                    "isl": int(row.isl), "osl": int(row.osl), "concurrency": int(row.concurrency),
                    "ttft_ms": row.silicon_ttft_ms, "sim_ttft_ms": sim["sim_ttft_ms"],
                    "wait_ms": wait, **step,
                    "implied_step_ms": row.silicon_ttft_ms - wait,
                    "ratio": (row.silicon_ttft_ms - wait) / step["step_ms"]})
        factory.clear_caches()
    return pd.DataFrame(out)


def by_group(t: pd.DataFrame) -> pd.DataFrame:
    """Median ratio and parts per (GPU, model, layout) and prompt length."""
    return t.groupby(["gpu", "model", "layout", "isl"]).agg(
        rows=("ratio", "size"), ttft_ms=("ttft_ms", "median"),
        sim_ttft_ms=("sim_ttft_ms", "median"), step_ms=("step_ms", "median"),
        implied_step_ms=("implied_step_ms", "median"), ratio=("ratio", "median"),
        linear_ms=("linear_ms", "median"), experts_ms=("experts_ms", "median"),
        attention_ms=("attention_ms", "median"), comm_ms=("comm_ms", "median")).reset_index()


def main(argv=None) -> pd.DataFrame:
    """Print and write the per-row and per-group tables; return the per-group one."""
    parser = make_parser("silicon_prefill", __doc__, "(no effect: the experiment is small)")
    parser.add_argument("--data", default=str(vs.DATA), help="the silicon CSV (hopper.csv)")
    parser.add_argument("--max-concurrency", type=int, default=4)
    parser.add_argument("--terms", choices=("neutral", "fitted"), default="neutral",
                        help="neutral: the kernel sums (vllm_v1); fitted: with the silicon "
                             "terms (the default profile, vllm_silicon)")
    parser.add_argument("--kernels", choices=vs.KERNELS, default="default",
                        help="kernel profile (validate_silicon's --kernels)")
    args = parser.parse_args(argv)
    # One serving pool only: the terms and the prefill split are of aggregated steps.
    rows = vs.one_pool_vllm_rows(args.data, "silicon_prefill")
    if rows is None:
        return pd.DataFrame()
    rows = rows[rows.concurrency <= args.max_concurrency]
    t = table(rows, vllm_silicon.parse(args.terms), args.kernels)
    g = by_group(t)
    print(f"one prefill at C <= {args.max_concurrency}: implied (measured TTFT - simulated wait) "
          f"against the simulated step, ms ({args.terms} terms, {args.kernels} kernels)")
    print_table(g, digits=3)
    model_ratio = g.groupby("model").ratio.median()
    print("\nmedian ratio per model: " + ", ".join(f"{m} {r:.2f}"
                                                   for m, r in model_ratio.items()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t.to_csv(out / "rows.csv", index=False)
    g.to_csv(out / "groups.csv", index=False)
    g.attrs["rows"] = t
    g.attrs["median_ratio"] = float(np.median(t.ratio)) if len(t) else np.nan
    return g


if __name__ == "__main__":
    main()
