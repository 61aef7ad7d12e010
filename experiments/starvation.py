"""Does shortest-prompt-first starve long prompts? TTFT by prompt-length bucket, SPF vs FCFS.

Runs FCFS, SPF and SPF with aging (if registered) on the default engine with ShareGPT-like
requests near saturation, and prints max and p99 TTFT per prompt-length bucket::

    python -m experiments.starvation [--out out/starvation] [--quick]
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from experiments._common import parser, print_table
from experiments.load_sweep import base_config
from simsched.analysis.sweep import sweep
from simsched.policies import QUEUE_POLICIES

BUCKETS = [0, 256, 1024, 2048, 4096]
RATE = 2.25


def main(argv=None) -> pd.DataFrame:
    """Run the study; return TTFT p99/max by policy and prompt bucket."""
    args = parser("starvation", __doc__, "120 requests per run").parse_args(argv)
    warnings.simplefilter("ignore")
    policies = [x for x in ("fcfs", "spf", "spf_aging") if x in QUEUE_POLICIES]
    n = 120 if args.quick else 400
    res = sweep(base_config(n).replace(rate=RATE), progress=not args.quiet, policy=policies)
    req = res.requests          # carries the varied field (policy) as a column
    req = req.assign(prompt_bucket=pd.cut(req["num_prompt_tokens"], BUCKETS))
    table = (req.groupby(["prompt_bucket", "policy"], observed=True)["ttft"]
             .agg(p99=lambda s: s.quantile(0.99), max="max").unstack("policy"))
    print(f"TTFT (s) by prompt length, at {RATE} req/s")
    print_table(table, digits=3, index=True)
    res.to_csv(Path(args.out))
    table.to_csv(Path(args.out) / "ttft_by_bucket.csv")
    print(f"wrote {args.out}/")
    return table


if __name__ == "__main__":
    main()
