"""Sarathi-Serve's trade-off: a larger per-iteration token budget lowers TTFT, raises the ITL tail.

Sweeps ``max_num_batched_tokens`` (256 ... 8192) under stall-free chunked prefill on the default
engine with ShareGPT-like requests at a moderate load, and prints TTFT and ITL percentiles per
budget::

    python -m experiments.token_budget [--out out/token_budget] [--quick]
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from experiments._common import parser, print_table
from experiments.load_sweep import base_config
from simsched.analysis.sweep import sweep

COLUMNS = ["max_num_batched_tokens", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "itl_max",
           "tpot_p99", "saturation"]


def main(argv=None) -> pd.DataFrame:
    """Run the study; return TTFT/ITL by token budget."""
    args = parser("token_budget", __doc__, "three budgets, 100 requests per run") \
        .parse_args(argv)
    warnings.simplefilter("ignore")
    budgets = [256, 1024, 4096] if args.quick else [256, 512, 1024, 2048, 4096, 8192]
    n = 100 if args.quick else 300
    res = sweep(base_config(n).replace(rate=1.5), progress=not args.quiet,
                max_num_batched_tokens=budgets)
    table = res.runs[COLUMNS]
    print_table(table)
    res.to_csv(Path(args.out))
    print(f"wrote {args.out}/")
    return table


if __name__ == "__main__":
    main()
