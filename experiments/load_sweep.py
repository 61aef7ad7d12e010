"""Where does the engine saturate, and which policy holds the SLO longest?

FCFS, SPF, SPF with preemption and strict priority (three priority classes) on the default engine
(Llama-2-7B on an A100-80GB, calibrated cost model) serving ShareGPT-like requests (prompts
clipped to 3072 tokens so every request fits the 4096-token context), over arrival rates from
light load to well beyond saturation. Prints each policy's saturation rate (the first rate whose
runs are not ``stable``) and its capacity under the SLO target (TTFT p99 <= 2 s and TPOT p99
<= 0.15 s, judged on the mean over seeds), and writes the sweep frames and plots::

    python -m experiments.load_sweep [--out out/load_sweep] [--quick]
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import pandas as pd

from simsched import SimConfig
from simsched.analysis.slo import SLO
from simsched.analysis.capacity import SLOTarget, capacity_search
from simsched.analysis.plots import latency_vs_load, run_timeline, saturation_rate, ttft_cdf
from simsched.analysis.sweep import sweep

VARIANTS = {  # label -> config changes
    "fcfs": {"policy": "fcfs"},
    "spf": {"policy": "spf"},
    "spf+preempt": {"policy": "spf", "preemption": True},
    "priority": {"policy": "priority"},
}
SLO_GOODPUT = SLO(ttft=2.0, tpot=0.15)
TARGET = SLOTarget(limits={"ttft_p99": 2.0, "tpot_p99": 0.15})


def base_config(num_requests: int) -> SimConfig:
    """The default engine serving clipped ShareGPT lengths with three priority classes."""
    return SimConfig().replace(name="sharegpt", num_requests=num_requests,
                               max_prompt_tokens=3072, long_prompt_policy="clip",
                               num_priorities=3)


def run_variants(base: SimConfig, variants: dict, progress: bool = False, **factors):
    """One sweep per variant; returns (runs, requests) with a ``variant`` column, unique run ids."""
    runs, requests, iterations, offset = [], [], [], 0
    for label, changes in variants.items():
        res = sweep(base.replace(**changes), progress=progress, slos=SLO_GOODPUT, **factors)
        r = res.runs.assign(variant=label, run_id=res.runs["run_id"] + offset)
        q = res.requests.assign(variant=label, run_id=res.requests["run_id"] + offset)
        it = res.iterations.assign(variant=label, run_id=res.iterations["run_id"] + offset)
        runs.append(r)
        requests.append(q)
        iterations.append(it)
        offset += len(r)
    return (pd.concat(runs, ignore_index=True), pd.concat(requests, ignore_index=True),
            pd.concat(iterations, ignore_index=True))


def print_table(table: pd.DataFrame, out) -> None:
    """Print an experiment's table with four significant digits and where its files went."""
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 120):
        print(table.to_string(index=False))
    print(f"wrote {out}/")


def write_frames(out: Path, **frames: pd.DataFrame) -> None:
    """Each frame as CSV into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in frames.items():
        frame.to_csv(out / f"{name}.csv", index=False)


def main(argv=None) -> pd.DataFrame:
    """Run the study; return the table of saturation rates and capacities."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="out/load_sweep", help="output directory")
    p.add_argument("--quick", action="store_true", help="a few rates, short runs, one seed")
    args = p.parse_args(argv)
    out = Path(args.out)
    warnings.simplefilter("ignore")          # the clipped-prompt notice, once per run
    t0 = time.time()
    if args.quick:
        rates, seeds, n, tol = [1.0, 2.0, 3.0], [0], 100, 0.25
    else:
        rates, seeds, n, tol = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0], [0, 1], 300, 0.1
    base = base_config(n)
    runs, requests, iterations = run_variants(base, VARIANTS, rate=rates, seed=seeds)
    cap = capacity_search(base, TARGET, policies=VARIANTS, seeds=seeds, low=0.5,
                          tol=tol)
    table = cap[["policy", "capacity", "ci_low", "ci_high"]].copy()
    table.insert(1, "saturation_rate", [saturation_rate(runs[runs["variant"] == v])
                                        for v in table["policy"]])
    busy = runs.groupby(["variant", "rate"])[["goodput", "ttft_p99", "tpot_p99"]].mean()
    table["max_goodput"] = [busy.loc[v, "goodput"].max() for v in table["policy"]]
    write_frames(out, runs=runs, requests=requests, iterations=iterations, capacity=table,
                 capacity_runs=cap.attrs["runs"])
    latency_vs_load(runs, out / "latency_vs_load.png", by=["variant"])
    top = max(r for r in rates if r <= 2.5)
    ttft_cdf(requests, runs, out / f"ttft_cdf_rate{top}.png", by=["variant"],
             where={"rate": top, "seed": seeds[0]})
    one = runs[(runs["variant"] == "fcfs") & (runs["rate"] == top) & (runs["seed"] == seeds[0])]
    run_id = int(one["run_id"].iloc[0])
    run_timeline(iterations[iterations["run_id"] == run_id], 7422, out / "fcfs_timeline.png",
                 title=f"FCFS at {top} req/s")
    with pd.option_context("display.float_format", "{:.3g}".format, "display.width", 120):
        print(f"{len(runs)} sweep runs + {len(cap.attrs['runs'])} capacity runs "
              f"in {time.time() - t0:.0f} s; SLO: TTFT p99 <= 2 s, TPOT p99 <= 0.15 s")
        print(busy.unstack("variant")["ttft_p99"].to_string())
        print(table.to_string(index=False))
    print(f"wrote {out}/")
    return table


if __name__ == "__main__":
    main()
