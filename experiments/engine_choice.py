"""Which engine: vLLM, SGLang or TensorRT-LLM, each at its defaults, on one model and GPU.

Llama-3.1-8B on one H200 (a configuration in ``../shared/data/real-serving/silicon/hopper.csv``
for SGLang and vLLM), ShareGPT-like requests (prompts clipped to 3,072 tokens) with Poisson
arrivals, swept over the request rate for each engine at its own defaults
(``SimConfig.preset("vllm_v1" | "sglang" | "trtllm")``: limits, KV block size, prefix cache and
engine profile included). Prints TTFT, TPOT and throughput per rate and engine, and where each
saturates (the first rate whose run is not ``stable``); plots them against the rate::

    python -m experiments.engine_choice [--out out/engine_choice] [--quick]

The three engines share simsched's kernel times and differ in their schedulers (docs/engines.md)
and, nominally, in their engine profiles (whose terms are vLLM's, assumed: see
``simsched.cost.engine_profiles``): the differences measured here are the schedulers'.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from experiments._common import parser, print_table, save_plot, write_frames
from simsched import SimConfig
from simsched.analysis.sweep import sweep

ENGINES = {"vllm": "vllm_v1", "sglang": "sglang", "trtllm": "trtllm"}
COLUMNS = ["engine", "rate", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
           "request_throughput", "output_throughput", "num_preemptions", "saturation"]


def base_config(engine: str, num_requests: int) -> SimConfig:
    """The study's config for ``engine`` (before the rate)."""
    return SimConfig.preset(ENGINES[engine], model="llama-3.1-8b", gpu="h200",
                            name="sharegpt", num_requests=num_requests, seed=0,
                            max_prompt_tokens=3072, long_prompt_policy="clip")


def saturation_points(table: pd.DataFrame) -> pd.DataFrame:
    """Per engine: the highest stable rate and the first rate that is not."""
    rows = []
    for engine, g in table.groupby("engine", sort=False):
        g = g.sort_values("rate")
        bad = g[g.saturation != "stable"]
        good = g[g.rate < (bad.rate.min() if len(bad) else float("inf"))]
        rows.append({"engine": engine,
                     "max_stable_rate": good.rate.max() if len(good) else float("nan"),
                     "first_saturated_rate": bad.rate.min() if len(bad) else float("nan"),
                     "peak_request_throughput": g.request_throughput.max()})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame):
    """TTFT p50, TPOT p50 and throughput against the rate, one line per engine."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for engine, g in table.groupby("engine", sort=False):
        g = g.sort_values("rate")
        axes[0].plot(g.rate, g.ttft_p50 * 1e3, marker="o", label=engine)
        axes[1].plot(g.rate, g.tpot_p50 * 1e3, marker="o", label=engine)
        axes[2].plot(g.rate, g.request_throughput, marker="o", label=engine)
    axes[0].set_yscale("log")
    for ax, label in zip(axes, ("TTFT p50 (ms)", "TPOT p50 (ms)", "throughput (req/s)")):
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Llama-3.1-8B on one H200: engine at its defaults")
    fig.tight_layout()
    return fig


def run(quick: bool, progress: bool = False) -> pd.DataFrame:
    """The sweep's rows (one per engine and rate)."""
    rates = [4.0, 10.0, 20.0] if quick else [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0]
    n = 120 if quick else 600
    frames = []
    for engine in ENGINES:
        res = sweep(base_config(engine, n), executor="serial", progress=progress,
                    keep_frames=False, rate=rates)
        runs = res.runs.copy()
        runs.insert(0, "engine", engine)
        frames.append(runs)
    return pd.concat(frames, ignore_index=True)[COLUMNS]


def main(argv=None) -> pd.DataFrame:
    """Run the study; return the table (one row per engine and rate)."""
    args = parser("engine_choice", __doc__, "three rates, 120 requests per run") \
        .parse_args(argv)
    warnings.simplefilter("ignore")
    table = run(args.quick, progress=not args.quiet)
    print_table(table)
    points = saturation_points(table)
    print_table(points)
    out = Path(args.out)
    write_frames(out, engine_choice=table, saturation=points)
    save_plot(out / "engine_choice.png", lambda: plot(table))
    print(f"wrote {out}/")
    return table


if __name__ == "__main__":
    main()
