"""The cheapest deployment for the Azure conversation trace at several request rates.

Candidates: Llama-2-7B on A100-80GB (one GPU per replica, or two with tensor parallelism), on
A100-80GB with a 512-token budget, on A100-80GB behind round robin instead of JSQ, on H100-SXM,
H200, L40S and A100-40GB; each searched from 1 to 48 replicas. The target: p99 TTFT <= 1 s and
p99 TPOT <= 50 ms on a 4,000-request window of the trace (prompts clipped to 3,072 tokens so every
request fits the 4,096-token context), rescaled to each rate. Prices are
:data:`simsched.analysis.plan.GPU_PRICES` (assumed on-demand US$ per GPU-hour). Prints the cheapest
deployment per rate and the full table; writes the table, every probe and the cost-vs-TTFT plot::

    python -m experiments.deployment_search [--out out/deployment_search] [--quick] [--quiet]
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pandas as pd

from experiments._common import parser, print_table, save_plot, write_frames
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
COLUMNS = ["rate", "label", "gpu", "status", "num_replicas", "num_gpus", "gpu_hours_per_million",
           "cost_per_million", "ttft_p99", "tpot_p99", "load_imbalance", "pareto"]


def settings(quick: bool) -> dict:
    """Requests, rates and candidates of the full or quick search."""
    if quick:
        return {"num_requests": 1000, "rates": RATES[:2],
                "candidates": [c for c in CANDIDATES if c.settings == {} and c.router == "jsq"
                               and c.tensor_parallel_size == 1][:4]}
    return {"num_requests": 4000, "rates": RATES, "candidates": list(CANDIDATES)}


def main(argv=None) -> pd.DataFrame:
    """Run the search; return the plan table (``attrs["best"]``: the cheapest row per rate,
    ``attrs["runs"]``: every probe)."""
    p = parser("deployment_search", __doc__, "1,000 requests, two rates, four GPUs")
    p.add_argument("--executor", default="local", help="local (default), serial or ray")
    p.add_argument("--workers", type=int, help="local worker processes (default: all cores)")
    args = p.parse_args(argv)
    out = Path(args.out)
    warnings.simplefilter("ignore")    # the clipped-prompt notice, once per simulation
    t0 = time.time()
    cfg = settings(args.quick)
    rates = cfg["rates"]
    workload = WorkloadConfig.preset("azure-conv", num_requests=cfg["num_requests"],
                                     max_prompt_tokens=3072, long_prompt_policy="clip")
    result = plan(workload, TARGET, cfg["candidates"], rates=rates,
                  base_config=SimConfig.preset("classic"), executor=args.executor,
                  max_workers=args.workers, progress=not args.quiet)
    table = result.table
    best = pd.DataFrame([result.best(rate) for rate in rates])[COLUMNS]
    print(f"{len(result.runs)} simulations in {time.time() - t0:.0f} s; target p99 TTFT <= 1 s, "
          f"p99 TPOT <= 50 ms; {cfg['num_requests']} requests of the Azure conversation trace")
    print("\ncheapest deployment per rate")
    print_table(best)
    print("\nall candidates")
    print_table(table[COLUMNS])
    write_frames(out, plan=table, runs=result.runs, best=best)
    print(f"wrote {out}/")
    save_plot(out / "cost_vs_ttft.png", lambda: result.plot())
    table.attrs["best"] = best
    table.attrs["runs"] = result.runs
    return table


if __name__ == "__main__":
    main()
