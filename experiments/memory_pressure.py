"""KV cache size x policy: preemptions, recomputed tokens and TTFT/ITL tails under memory pressure.

Shrinks the KV cache (``cache.num_blocks``) under FCFS, SPF and SPF with preemption on the default
engine with ShareGPT-like requests at a load the full cache carries; writes the frames and
``config.json`` (every run's resolved config)::

    python -m experiments.memory_pressure [--out out/memory_pressure] [--quick]
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from experiments._common import parser, print_table, write_frames
from experiments.load_sweep import base_config, run_variants
from simsched.analysis.export import write_json

VARIANTS = {"fcfs": {"policy": "fcfs"}, "spf": {"policy": "spf"},
            "spf+preempt": {"policy": "spf", "preemption": True}}
COLUMNS = ["cache.num_blocks", "variant", "num_preemptions", "num_recomputed_tokens",
           "ttft_p99", "itl_p99", "itl_max", "saturation"]


def main(argv=None) -> pd.DataFrame:
    """Run the study; return preemptions and tails by cache size and policy."""
    args = parser("memory_pressure", __doc__, "two cache sizes, 80 requests per run") \
        .parse_args(argv)
    warnings.simplefilter("ignore")
    blocks = [1024, 4096] if args.quick else [768, 1024, 2048, 4096, 7422]
    n = 80 if args.quick else 250
    runs, requests, iterations, configs = run_variants(
        base_config(n).replace(rate=1.0), VARIANTS, progress=not args.quiet,
        **{"cache.num_blocks": blocks})
    table = runs[COLUMNS].sort_values(["cache.num_blocks", "variant"]).reset_index(drop=True)
    print_table(table)
    write_frames(Path(args.out), runs=runs, requests=requests, iterations=iterations)
    write_json(configs, Path(args.out) / "config.json")      # every run's resolved config
    print(f"wrote {args.out}/")
    return table


if __name__ == "__main__":
    main()
