"""Replay the Azure 2023 conversation trace under FCFS, SPF and SPF with preemption.

A window of the trace (default its first 600 s) is replayed on the default engine (A100,
Llama-2-7B, calibrated cost model) at several speeds: ``--speedups 0.25,0.5,1,2`` divides the
recorded gaps by each factor (below 1 slows the trace down). The trace was recorded on a cluster:
at 1x (about 4.8 req/s, ~1,070-token prompts) one GPU with the default 16 sequence slots is
already overloaded, so the default speeds include slowed-down replays where queues stay short. Prompts longer than ``--max-prompt-tokens``
are clipped so prompt plus output fits the 4096-token context (the trace's outputs are at most
1000 tokens); the count is printed. Prints TTFT and ITL tables (policy x speed) and writes each
run's per-request frame and a summary to ``--out``::

    python -m experiments.trace_replay [--quick] [--speedups 0.25,0.5,1,2] [--duration 600]
        [--out out/trace_replay]
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import simsched
from experiments._common import parser as make_parser
from experiments._common import print_table
from simsched.workloads.traces import TraceWarning
from simsched.workloads.workload import WorkloadConfig, describe, generate

VARIANTS = {  # label -> SimConfig.replace changes
    "fcfs": {"policy": "fcfs", "preemption": False},
    "spf": {"policy": "spf", "preemption": False},
    "spf+preempt": {"policy": "spf", "preemption": True},
}
METRICS = {  # summary key -> table title (times in seconds)
    "ttft_mean": "TTFT mean (s)", "ttft_p50": "TTFT p50 (s)", "ttft_p99": "TTFT p99 (s)",
    "itl_mean": "ITL mean (s)", "itl_p99": "ITL p99 (s)", "e2el_mean": "E2E latency mean (s)",
    "num_preemptions": "preemptions",
}


def parse_args(argv=None):
    """Command-line options."""
    p = make_parser("trace_replay", __doc__, "a 120 s window at speeds 0.5 and 1")
    p.add_argument("--speedups", default=None,
                   help="comma-separated time compression factors (default 0.25,0.5,1,2; "
                        "quick 0.5,1)")
    p.add_argument("--duration", type=float, default=None,
                   help="trace window length in recorded seconds (default 600, quick 120)")
    p.add_argument("--start", type=float, default=0.0, help="window start, recorded seconds")
    p.add_argument("--trace", default="azure-conv", choices=["azure-conv", "azure-code"])
    p.add_argument("--max-prompt-tokens", type=int, default=3072,
                   help="clip longer prompts to this many tokens (default 3072)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.speedups is None:
        args.speedups = "0.5,1" if args.quick else "0.25,0.5,1,2"
    if args.duration is None:
        args.duration = 120.0 if args.quick else 600.0
    if not args.duration > 0:
        p.error(f"--duration must be > 0, got {args.duration}")
    try:
        args.speedups = [float(s) for s in args.speedups.split(",") if s.strip()]
    except ValueError:
        p.error(f"--speedups must be comma-separated numbers, got {args.speedups!r}")
    if not args.speedups or any(s <= 0 for s in args.speedups):
        p.error("--speedups must be positive")
    return args


def _label(speedup: float) -> str:
    return f"{speedup:g}x"


def run(args) -> pd.DataFrame:
    """Run every (variant, speedup) pair; return one summary row per run."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = WorkloadConfig.preset(args.trace, start=args.start, duration=args.duration,
                                     max_prompt_tokens=args.max_prompt_tokens,
                                     long_prompt_policy="clip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)   # reported below instead
        window = generate(workload, np.random.default_rng(args.seed))
    print(f"{args.trace}, window [{args.start:g}, {args.start + args.duration:g}) s as recorded:")
    print(describe(window))
    print(window.attrs["load_report"])
    base = simsched.SimConfig.preset("classic", workload=workload, seed=args.seed)
    rows = []
    for speedup in args.speedups:
        for label, changes in VARIANTS.items():
            config = base.replace(speedup=speedup, **changes)
            began = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TraceWarning)
                results = simsched.simulate(config)
            wall = time.perf_counter() - began
            name = label.replace("+", "_")
            results.requests.to_csv(out / f"requests_{name}_{_label(speedup)}.csv", index=False)
            summary = dict(results.summary())
            rows.append({"variant": label, "speedup": speedup, "wall_time": wall, **summary})
            print(f"  {label:<12} {_label(speedup):>6}: {summary['num_finished']} finished, "
                  f"TTFT mean {summary['ttft_mean']:.2f} s ({wall:.1f} s wall)", flush=True)
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "summary.csv", index=False)
    return frame


def print_tables(frame: pd.DataFrame) -> None:
    """One policy x speed table per metric."""
    for key, title in METRICS.items():
        table = frame.pivot(index="variant", columns="speedup", values=key)
        table = table.loc[list(VARIANTS)]
        table.columns = [_label(s) for s in table.columns]
        print(f"\n{title}")
        print_table(table, digits=4, index=True)


def main(argv=None) -> pd.DataFrame:
    """Entry point of ``python -m experiments.trace_replay``; returns one row per run."""
    args = parse_args(argv)
    frame = run(args)
    print_tables(frame)
    print(f"\nper-request frames and summary.csv written to {args.out}/")
    return frame


if __name__ == "__main__":
    main()
