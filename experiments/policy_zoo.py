"""Every queue policy, recompute vs swap preemption, a two-tenant fairness test and the batching
baselines, on the Azure 2023 conversation trace (A100, Llama-2-7B, calibrated cost model).

Three tables:

1. *Policies*: a window of the trace (default 300 s, about 4.8 req/s, prompts clipped to 3072
   tokens) on a KV cache cut to ``--num-blocks`` blocks so that memory runs out and preemption
   happens; every queue policy under recompute and swap preemption (admission preemption off,
   except MLFQ, which preempts lower levels by design). Columns: mean/p99 TTFT,
   p99 ITL, starvation (the largest TTFT among the longest-prompt decile), output throughput,
   preemptions. Priorities: 30% of requests are interactive (priority 0), the rest batch (1).
2. *Fairness*: the same window replayed at ``--tenant-rate`` req/s (overload) by two tenants
   sending 80% and 20% of the requests; each tenant's share of the service (prompt tokens
   prefilled + 2 x output tokens generated, VTC's default weights) until the last arrival, while
   both are backlogged.
3. *Batching*: static batching vs prefill-first (vLLM V0 / Orca) vs stall-free chunked prefill
   (Sarathi-Serve) at equal load, FCFS, full KV cache.

    python -m experiments.policy_zoo [--quick] [--out DIR]
"""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import simsched
from experiments._common import parser as make_parser
from simsched.workloads.traces import TraceWarning
from simsched.workloads.workload import WorkloadConfig, generate

POLICIES = {  # label -> (policy, policy_options, victim_policy)
    "fcfs": ("fcfs", {}, "fewest_generated"),
    "spf": ("spf", {}, "fewest_generated"),
    "spf_aging": ("spf_aging", {}, "fewest_generated"),
    "priority": ("priority", {}, "lowest_priority"),
    "priority_aging": ("priority_aging", {}, "lowest_priority"),
    "edf": ("edf", {"ttft_slo": 10.0, "ttft_slo_by_priority": {0: 1.0}}, "fewest_generated"),
    "sjf_oracle": ("sjf_oracle", {}, "fewest_generated"),
    "predicted_sjf": ("predicted_sjf", {"sigma": 1.0, "max_wait": 30.0}, "fewest_generated"),
    "mlfq": ("mlfq", {}, "policy_worst"),
    "fair": ("fair", {}, "fewest_generated"),
}
QUICK_POLICIES = ("fcfs", "spf", "sjf_oracle", "mlfq", "fair")
TENANT_POLICIES = ("fcfs", "sjf_oracle", "mlfq", "fair")
STYLES = ("static", "prefill_first", "stall_free")


def parse_args(argv=None):
    """Command-line options."""
    p = make_parser("policy_zoo", __doc__, "a 60 s window and five policies")
    p.add_argument("--duration", type=float, default=None,
                   help="trace window in recorded seconds (default 300, quick 60)")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="KV blocks of 16 tokens for the policy table (default 3000 of 7422, "
                        "quick 2000)")
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--tenant-rate", type=float, default=20.0,
                   help="request rate of the two-tenant workload (default 20 req/s)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.duration is None:
        args.duration = 60.0 if args.quick else 300.0
    if args.num_blocks is None:
        args.num_blocks = 2000 if args.quick else 3000
    if not args.duration > 0 or args.num_blocks < 1 or args.max_num_seqs < 1 \
            or not args.tenant_rate > 0:
        p.error("--duration, --num-blocks, --max-num-seqs and --tenant-rate must be positive")
    return args


def _simulate(config: simsched.SimConfig):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)   # clipped prompts are expected here
        return simsched.simulate(config)


def _row(results) -> dict:
    s = results.summary()
    df = results.requests
    served = df[df["first_token_at"].notna()]
    longest = served[served["num_prompt_tokens"] >= served["num_prompt_tokens"].quantile(0.9)]
    return {"ttft_mean": s["ttft_mean"], "ttft_p99": s["ttft_p99"], "e2el_mean": s["e2el_mean"],
            "itl_p99": s["itl_p99"],
            "starve_ttft_max": float(longest["ttft"].max()) if len(longest) else math.nan,
            "output_throughput": s["output_throughput"], "num_finished": s["num_finished"],
            "num_preemptions": s["num_preemptions"],
            "preemptions_per_finished": s["num_preemptions"] / max(s["num_finished"], 1),
            "num_swaps": s["num_swaps"], "swap_time": s["swap_time"]}


def _config(args, workload: WorkloadConfig, label: str, **changes) -> simsched.SimConfig:
    policy, options, victim = POLICIES[label]
    # The classic preset (the defaults before issue 40): the zoo's findings are under its rules.
    return simsched.SimConfig.preset("classic", workload=workload, seed=args.seed).replace(
        policy=policy, policy_options=options, victim_policy=victim,
        max_num_seqs=args.max_num_seqs, **changes)


def _trace(args, **changes) -> WorkloadConfig:
    return WorkloadConfig.preset("azure-conv", duration=args.duration, max_prompt_tokens=3072,
                                 long_prompt_policy="clip", **changes)


def policy_table(args) -> pd.DataFrame:
    """Every queue policy x preemption mode on a memory-pressured cache."""
    workload = _trace(args, num_priorities=2, priority_weights=(0.3, 0.7))
    labels = QUICK_POLICIES if args.quick else tuple(POLICIES)
    rows = []
    for mode in ("recompute", "swap"):
        for label in labels:
            config = _config(args, workload, label, preemption_mode=mode,
                             **{"cache.num_blocks": args.num_blocks})
            rows.append({"policy": label, "mode": mode, **_row(_simulate(config))})
    return pd.DataFrame(rows)


def _service_shares(results, until: float) -> dict:
    """Each tenant's share of weighted tokens served by ``until`` (the run stopped there)."""
    df = results.requests
    prefilled = df["first_token_at"].notna() & (df["first_token_at"] <= until)
    # Weighted as the fair policy counts service: 1 per prompt token, 2 per output token.
    tokens = 2 * df["num_generated_tokens"] + df["num_prompt_tokens"].where(prefilled, 0)
    per = tokens.groupby(df["tenant"]).sum()
    return (per / per.sum()).to_dict()


def tenant_table(args) -> pd.DataFrame:
    """Two tenants (80% / 20% of requests) overloading the engine: service shares."""
    workload = _trace(args, rate=args.tenant_rate, num_tenants=2, tenant_weights=(0.8, 0.2))
    # Both tenants stay backlogged until the arrivals end: measure service up to then.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        until = float(generate(workload, np.random.default_rng(args.seed))["arrival_at"].max())
    rows = []
    for label in TENANT_POLICIES:
        config = _config(args, workload, label)
        full = _row(_simulate(config))
        shares = _service_shares(_simulate(config.replace(max_sim_time=until)), until)
        rows.append({"policy": label, "share_t0": shares.get("t0", 0.0),
                     "share_t1": shares.get("t1", 0.0), **full})
    return pd.DataFrame(rows)


def style_table(args) -> pd.DataFrame:
    """Static vs prefill-first vs stall-free batching, FCFS, full cache, equal load."""
    workload = _trace(args)
    rows = []
    for style in STYLES:
        config = _config(args, workload, "fcfs", style=style)
        rows.append({"style": style, **_row(_simulate(config))})
    return pd.DataFrame(rows)


def _fmt(frame: pd.DataFrame) -> str:
    return frame.to_markdown(index=False, floatfmt=".3g") if _has_tabulate() \
        else frame.to_string(index=False, float_format=lambda v: f"{v:.3g}")


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


COLUMNS = ["ttft_mean", "ttft_p99", "e2el_mean", "itl_p99", "starve_ttft_max",
           "output_throughput", "num_preemptions", "preemptions_per_finished"]


def main(argv=None) -> dict:
    """Entry point of ``python -m experiments.policy_zoo``; returns the three tables."""
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    tables = {"policies": policy_table(args), "tenants": tenant_table(args),
              "styles": style_table(args)}
    for name, frame in tables.items():
        frame.to_csv(out / f"{name}.csv", index=False)
    print(f"Policies: azure-conv {args.duration:g} s window, {args.num_blocks} KV blocks, "
          f"max_num_seqs {args.max_num_seqs}")
    print(_fmt(tables["policies"][["policy", "mode"] + COLUMNS + ["num_swaps", "swap_time"]]))
    print(f"\nFairness: two tenants (80% / 20% of requests) at {args.tenant_rate:g} req/s; "
          "service share until the last arrival")
    print(_fmt(tables["tenants"][["policy", "share_t0", "share_t1"] + COLUMNS]))
    print("\nBatching styles: FCFS, full KV cache, trace at its recorded rate")
    print(_fmt(tables["styles"][["style"] + COLUMNS]))
    print(f"\n{time.perf_counter() - began:.1f} s; CSV tables in {out}/")
    return tables


if __name__ == "__main__":
    main()
