"""Where does the engine saturate, and which policy holds the SLO longest?

FCFS, SPF, SPF with preemption and strict priority (three priority classes) on the default engine
(Llama-2-7B on an A100-80GB, calibrated cost model) serving ShareGPT-like requests (prompts
clipped to 3072 tokens so every request fits the 4096-token context), over arrival rates from
light load to well beyond saturation. Prints each policy's saturation rate (the first rate whose
runs are not ``stable``) and its capacity under the SLO target (TTFT p99 <= 2 s and TPOT p99
<= 0.15 s; the mean of the per-seed capacities, with a Student-t interval), and writes the sweep
frames, ``config.json`` (every run's resolved config and the capacity search's settings) and
plots::

    python -m experiments.load_sweep [--out out/load_sweep] [--quick]

``--concurrency`` sweeps ``vllm bench serve --max-concurrency C`` instead (C = 1..128 over the
random dataset, next to the old all-at-t=0 stand-in; :mod:`experiments._concurrency`).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pandas as pd

from experiments._common import parser, print_table, save_plot, write_frames
from experiments._concurrency import concurrency_sweep
from simsched import SimConfig
from simsched.analysis import plots
from simsched.analysis.capacity import SLOTarget, capacity_search
from simsched.analysis.export import resolved_config, write_json
from simsched.analysis.slo import SLO
from simsched.analysis.sweep import sweep

__all__ = ["base_config", "run_variants", "print_table", "write_frames", "main"]

VARIANTS = {  # label -> config changes
    "fcfs": {"policy": "fcfs"},
    "spf": {"policy": "spf"},
    "spf+preempt": {"policy": "spf", "preemption": True},
    "priority": {"policy": "priority"},
}
SLO_GOODPUT = SLO(ttft=2.0, tpot=0.15)
TARGET = SLOTarget(limits={"ttft_p99": 2.0, "tpot_p99": 0.15})


def base_config(num_requests: int) -> SimConfig:
    """The default engine serving clipped ShareGPT lengths with three priority classes, under
    the classic preset's rules (the defaults before issue 40, which these findings were made
    with)."""
    return SimConfig.preset("classic").replace(name="sharegpt", num_requests=num_requests,
                               max_prompt_tokens=3072, long_prompt_policy="clip",
                               num_priorities=3)


def run_variants(base: SimConfig, variants: dict, progress: bool = True, **factors):
    """One sweep per variant; returns (runs, requests, iterations, configs) with a ``variant``
    column and unique run ids. ``configs`` is what ``config.json`` holds: the factors and each
    run's resolved config (as ``SweepResult.to_csv`` writes them), with its variant."""
    runs, requests, iterations, resolved, offset = [], [], [], [], 0
    for label, changes in variants.items():
        res = sweep(base.replace(**changes), progress=progress, slos=SLO_GOODPUT, **factors)
        r = res.runs.assign(variant=label, run_id=res.runs["run_id"] + offset)
        q = res.requests.assign(variant=label, run_id=res.requests["run_id"] + offset)
        it = res.iterations.assign(variant=label, run_id=res.iterations["run_id"] + offset)
        runs.append(r)
        requests.append(q)
        iterations.append(it)
        resolved += [{**run, "run_id": run["run_id"] + offset, "variant": label}
                     for run in res.resolved_configs()["runs"]]
        offset += len(r)
    configs = {"variants": variants, "factors": factors, "runs": resolved}
    return (pd.concat(runs, ignore_index=True), pd.concat(requests, ignore_index=True),
            pd.concat(iterations, ignore_index=True), configs)


def settings(quick: bool) -> dict:
    """Rates, seeds, requests per run and capacity tolerance of the full or quick study."""
    if quick:
        return {"rates": [1.0, 2.0, 3.0], "seeds": [0], "num_requests": 100, "tol": 0.25}
    return {"rates": [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0], "seeds": [0, 1],
            "num_requests": 300, "tol": 0.1}


def main(argv=None) -> pd.DataFrame:
    """Run the study; return the table of saturation rates and capacities.

    ``table.attrs`` also holds ``runs`` (every sweep run, one row each) and ``by_rate`` (TTFT
    p99, goodput and mean KV use per variant and rate, averaged over seeds).
    """
    p = parser("load_sweep", __doc__, "three rates, 100 requests per run, one seed")
    p.add_argument("--concurrency", action="store_true",
                   help="sweep vllm bench serve's --max-concurrency instead (random dataset, "
                        "1,024 -> 128 tokens; docs/clients.md)")
    args = p.parse_args(argv)
    if args.concurrency:
        return concurrency_sweep(args)
    out = Path(args.out)
    warnings.simplefilter("ignore")          # the clipped-prompt notice, once per run
    t0 = time.time()
    cfg = settings(args.quick)
    rates, seeds = cfg["rates"], cfg["seeds"]
    base = base_config(cfg["num_requests"])
    runs, requests, iterations, configs = run_variants(base, VARIANTS, progress=not args.quiet,
                                                       rate=rates, seed=seeds)
    cap = capacity_search(base, TARGET, policies=VARIANTS, seeds=seeds, low=0.5,
                          tol=cfg["tol"], progress=not args.quiet)
    configs["capacity"] = {"base": resolved_config(base), "target": TARGET,
                           "policies": VARIANTS, "seeds": seeds, "low": 0.5, "tol": cfg["tol"]}
    table = cap[["policy", "capacity", "ci_low", "ci_high"]].copy()
    table.insert(1, "saturation_rate", [plots.saturation_rate(runs[runs["variant"] == v])
                                        for v in table["policy"]])
    by_rate = runs.groupby(["variant", "rate"], sort=False)[
        ["goodput", "ttft_p50", "ttft_p99", "tpot_p99", "kv_usage_mean", "num_preemptions"]
    ].mean().reset_index()
    table["max_goodput"] = [by_rate.loc[by_rate["variant"] == v, "goodput"].max()
                            for v in table["policy"]]
    print(f"{len(runs)} sweep runs + {len(cap.attrs['runs'])} capacity runs "
          f"in {time.time() - t0:.0f} s; SLO: TTFT p99 <= 2 s, TPOT p99 <= 0.15 s")
    print("TTFT p99 (s) by rate and variant:")
    print_table(by_rate.pivot(index="rate", columns="variant", values="ttft_p99")
                [list(VARIANTS)], digits=3, index=True)
    print_table(table, digits=3)
    write_frames(out, runs=runs, requests=requests, iterations=iterations, capacity=table,
                 by_rate=by_rate, capacity_runs=cap.attrs["runs"],
                 seed_capacities=cap.attrs["seed_capacities"])
    write_json(configs, out / "config.json")
    print(f"wrote {out}/")
    top = max(r for r in rates if r <= 2.5)
    save_plot(out / "latency_vs_load.png",
              lambda: plots.latency_vs_load(runs, by=["variant"]))
    save_plot(out / f"ttft_cdf_rate{top}.png",
              lambda: plots.ttft_cdf(requests, runs, by=["variant"],
                                     where={"rate": top, "seed": seeds[0]}))
    one = runs[(runs["variant"] == "fcfs") & (runs["rate"] == top) & (runs["seed"] == seeds[0])]
    run_id = int(one["run_id"].iloc[0])
    save_plot(out / "fcfs_timeline.png",
              lambda: plots.timeline(iterations[iterations["run_id"] == run_id],
                                     num_blocks=int(one["num_blocks"].iloc[0]),
                                     title=f"FCFS at {top} req/s"))
    table.attrs["runs"] = runs
    table.attrs["by_rate"] = by_rate
    return table


if __name__ == "__main__":
    main()
