"""The cheapest deployment for the Azure conversation trace at several request rates.

Candidates: Llama-2-7B on A100-80GB (one GPU per replica, or two with tensor parallelism), on
A100-80GB with a 512-token budget, on A100-80GB behind round robin instead of JSQ, on H100-SXM,
H200, L40S and A100-40GB; each searched from 1 to 48 replicas. The target: p99 TTFT <= 1 s and
p99 TPOT <= 50 ms on a 4,000-request window of the trace, rescaled to each rate. Prices are
:data:`simsched.analysis.plan.GPU_PRICES` (assumed on-demand US$ per GPU-hour). Prints the cheapest
deployment per rate and the full table; writes the table, every probe and the cost-vs-TTFT plot::

    python -m experiments.deployment_search [--out out/deployment_search] [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from experiments.load_sweep import print_table, write_frames
from simsched import SimConfig
from simsched.analysis.capacity import SLOTarget
from simsched.analysis.plan import Candidate, plan
from simsched.workloads.workload import WorkloadConfig

TARGET = SLOTarget(limits={"ttft_p99": 1.0, "tpot_p99": 0.05})
RATES = (5.0, 10.0, 20.0, 40.0)
MAX = 48
CANDIDATES = (
    Candidate("a100-80gb", 1, "jsq", max_replicas=MAX),
    Candidate("a100-80gb", 2, "jsq", max_replicas=MAX),
    Candidate("a100-80gb", 1, "jsq", max_replicas=MAX, settings={"max_num_batched_tokens": 512}),
    Candidate("a100-80gb", 1, "round_robin", max_replicas=MAX),
    Candidate("h100-sxm", 1, "jsq", max_replicas=MAX),
    Candidate("h200", 1, "jsq", max_replicas=MAX),
    Candidate("l40s", 1, "jsq", max_replicas=MAX),
    Candidate("a100-40gb", 1, "jsq", max_replicas=MAX),
)
COLUMNS = ["rate", "label", "status", "num_replicas", "num_gpus", "gpu_hours_per_million",
           "cost_per_million", "ttft_p99", "tpot_p99", "load_imbalance", "pareto"]


def main(argv=None) -> pd.DataFrame:
    """Run the search; return the plan table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="out/deployment_search", help="output directory")
    p.add_argument("--quick", action="store_true", help="1,000 requests, two rates, four GPUs")
    p.add_argument("--executor", default="local", help="local (default), serial or ray")
    p.add_argument("--workers", type=int, help="local worker processes (default: all cores)")
    args = p.parse_args(argv)
    out = Path(args.out)
    t0 = time.time()
    if args.quick:
        num_requests, rates = 1000, RATES[:2]
        candidates = [c for c in CANDIDATES if c.settings == {} and c.router == "jsq"
                      and c.tensor_parallel_size == 1][:4]
    else:
        num_requests, rates, candidates = 4000, RATES, list(CANDIDATES)
    workload = WorkloadConfig.preset("azure-conv", num_requests=num_requests)
    result = plan(workload, TARGET, candidates, rates=rates, base_config=SimConfig(),
                  executor=args.executor, max_workers=args.workers)
    table = result.table
    write_frames(out, plan=table, runs=result.runs)
    result.plot(out / "cost_vs_ttft.png")
    best = pd.DataFrame([result.best(rate) for rate in rates])[COLUMNS]
    print(f"{len(result.runs)} simulations in {time.time() - t0:.0f} s; target p99 TTFT <= 1 s, "
          f"p99 TPOT <= 50 ms; {num_requests} requests of the Azure conversation trace")
    print("\ncheapest deployment per rate")
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 160):
        print(best.to_string(index=False))
    print("\nall candidates")
    print_table(table[COLUMNS], out)
    return table


if __name__ == "__main__":
    main()
