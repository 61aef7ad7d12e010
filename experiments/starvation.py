"""Does shortest-prompt-first starve long prompts? TTFT by prompt-length bucket, SPF vs FCFS.

Runs FCFS, SPF and SPF with aging (if registered) on the default engine with ShareGPT-like
requests near saturation, and prints max and p99 TTFT per prompt-length bucket::

    python -m experiments.starvation [--out out/starvation] [--quick]
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pandas as pd

from experiments.load_sweep import base_config
from simsched.policies import QUEUE_POLICIES
from simsched.analysis.sweep import sweep

BUCKETS = [0, 256, 1024, 2048, 4096]


def main(argv=None) -> pd.DataFrame:
    """Run the study; return TTFT p99/max by policy and prompt bucket."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="out/starvation", help="output directory")
    p.add_argument("--quick", action="store_true", help="short runs")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    policies = [x for x in ("fcfs", "spf", "spf_aging") if x in QUEUE_POLICIES]
    n = 120 if args.quick else 400
    res = sweep(base_config(n).replace(rate=2.25), progress=False, policy=policies)
    req = res.requests.merge(res.runs[["run_id", "policy"]], on="run_id")
    req["prompt_bucket"] = pd.cut(req["num_prompt_tokens"], BUCKETS)
    table = (req.groupby(["prompt_bucket", "policy"], observed=True)["ttft"]
             .agg(p99=lambda s: s.quantile(0.99), max="max").unstack("policy"))
    res.to_csv(Path(args.out))
    table.to_csv(Path(args.out) / "ttft_by_bucket.csv")
    with pd.option_context("display.float_format", "{:.3g}".format, "display.width", 120):
        print("TTFT (s) by prompt length, at 2.25 req/s")
        print(table.to_string())
    print(f"wrote {args.out}/")
    return table


if __name__ == "__main__":
    main()
