"""Speculative decoding vs load: TPOT and throughput for K = 0..5 and each proposer on one GPU.

Llama-3.1-8B on one H200 (the default engine, vllm_v1 profile, with room for large batches:
512 sequences, an 8,192-token budget) serves ShareGPT lengths (prompts clipped to 1,024 tokens)
at Poisson rates from light to overload, with speculation off and with EAGLE at K = 1..5
(per-position acceptance 0.73, 0.52, 0.35, ...: vLLM's EAGLE-3 figures), and at K = 3 with each
proposer (n-gram, MTP, a draft model: phi-2's cost, K sequential decode steps of it). Prints
TPOT p50/p99, output throughput and the mean acceptance length per run, and for each variant the
lowest rate at which its median TPOT is no better than without speculation::

    python -m experiments.speculative [--quick] [--out out/speculative]
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from experiments._common import parser, print_table, save_plot, write_frames
from simsched.analysis.runner import simulate
from simsched.analysis.speculative import spec_summary
from simsched.config import SimConfig

MODEL = "llama-3.1-8b"
GPU = "h200"
COLUMNS = ["variant", "method", "k", "rate", "tpot_p50", "tpot_p99", "itl_p50",
           "itl_per_token_p50", "output_throughput", "mean_acceptance_length", "spec_efficiency"]


def variants(quick: bool) -> dict:
    """Label -> ``scheduler.speculative`` (None: off)."""
    out: dict = {"off": None}
    for k in ([3] if quick else [1, 2, 3, 4, 5]):
        out[f"eagle K={k}"] = {"method": "eagle", "num_speculative_tokens": k}
    for method in (["ngram"] if quick else ["ngram", "mtp", "draft_model"]):
        spec = {"method": method, "num_speculative_tokens": 3}
        if method == "draft_model":
            spec["draft_model"] = "phi-2"
        out[f"{method} K=3"] = spec
    return out


def base(num_requests: int) -> SimConfig:
    """The served workload and model (speculation set per variant)."""
    return SimConfig.preset("classic").replace(
        name="sharegpt", num_requests=num_requests, model=MODEL, gpu=GPU, max_prompt_tokens=1024,
        long_prompt_policy="clip", max_num_seqs=512, max_num_batched_tokens=8192)


def run_all(quick: bool, progress: bool = False) -> pd.DataFrame:
    """One row per (variant, rate)."""
    rates = [1.0, 16.0, 128.0] if quick else [1.0, 4.0, 16.0, 32.0, 64.0, 128.0]
    n = 150 if quick else 1200
    rows = []
    for label, spec in variants(quick).items():
        for rate in rates:
            cfg = base(n).replace(rate=rate, speculative=spec)
            res = simulate(cfg)
            s = res.summary()
            row = {"variant": label, "method": spec["method"] if spec else "off",
                   "k": spec["num_speculative_tokens"] if spec else 0, "rate": rate,
                   "tpot_p50": s["tpot_p50"], "tpot_p99": s["tpot_p99"], "itl_p50": s["itl_p50"],
                   "output_throughput": s["output_throughput"]}
            if spec:
                m = spec_summary(res)
                row.update(itl_per_token_p50=m["itl_per_token_p50"],
                           mean_acceptance_length=m["mean_acceptance_length"],
                           spec_efficiency=m["spec_efficiency"])
            else:
                row.update(itl_per_token_p50=s["itl_p50"], mean_acceptance_length=1.0,
                           spec_efficiency=np.nan)
            rows.append(row)
            if progress:
                print(f"  {label} rate {rate}: tpot_p50 {s['tpot_p50']:.4f}", flush=True)
    return pd.DataFrame(rows, columns=COLUMNS)


def crossover(table: pd.DataFrame) -> pd.DataFrame:
    """Per variant: TPOT speed-up at the lowest rate, and the lowest rate at which its median
    TPOT is no better than without speculation (NaN: it pays at every rate run), and its
    throughput relative to off at the highest rate."""
    off = table[table["variant"] == "off"].set_index("rate")
    rows = []
    for label, g in table[table["variant"] != "off"].groupby("variant", sort=False):
        g = g.set_index("rate")
        worse = g.index[g["tpot_p50"] >= off.loc[g.index, "tpot_p50"]]
        top = g.index.max()
        rows.append({"variant": label,
                     "tpot_speedup_low_load": off.loc[g.index.min(), "tpot_p50"]
                     / g.loc[g.index.min(), "tpot_p50"],
                     "mean_acceptance_length": g["mean_acceptance_length"].iloc[0],
                     "stops_paying_at_rate": float(worse.min()) if len(worse) else np.nan,
                     "throughput_vs_off_at_max_rate": g.loc[top, "output_throughput"]
                     / off.loc[top, "output_throughput"]})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame):
    """TPOT p50 and output throughput vs rate, one line per variant."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for label, g in table.groupby("variant", sort=False):
        style = "k-" if label == "off" else "-"
        a.plot(g["rate"], g["tpot_p50"] * 1e3, style, marker="o", ms=3, label=label)
        b.plot(g["rate"], g["output_throughput"], style, marker="o", ms=3, label=label)
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_xlabel("request rate (req/s)")
    a.set_ylabel("TPOT p50 (ms)")
    b.set_ylabel("output throughput (tok/s)")
    a.legend(fontsize=7)
    fig.suptitle(f"Speculative decoding, {MODEL} on one {GPU.upper()}")
    fig.tight_layout()
    return fig


def main(argv=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run the study; return (runs, crossover) tables."""
    args = parser("speculative", __doc__, "three rates, two K=3 variants, 150 requests per run") \
        .parse_args(argv)
    warnings.simplefilter("ignore")
    table = run_all(args.quick, progress=not args.quiet)
    cross = crossover(table)
    print_table(table)
    print()
    print_table(cross)
    out = Path(args.out)
    write_frames(out, runs=table, crossover=cross)
    print(f"wrote {out}/")
    save_plot(out / "speculative.png", lambda: plot(table))
    return table, cross


if __name__ == "__main__":
    main()
