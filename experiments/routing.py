"""Which router keeps p99 TTFT down on a cluster, and what stale load information costs.

Eight replicas of Llama-2-7B, each on one A100-80GB (calibrated cost model, default engine
settings), serve the Azure 2023 conversation trace, its arrival times rescaled to 70, 80 and 90 %
of the cluster's capacity. Capacity is eight times one replica's saturated throughput on the same
trace (measured first: the trace replayed far above what one replica serves). Every router runs
with exact state; the load-aware ones also with a snapshot refreshed every 50 ms and 500 ms, as a
gateway scraping engine metrics sees them. Prints the tables, writes the runs (CSV) and plots::

    python -m experiments.routing [--out out/routing] [--quick]

A third part, load balance against cache affinity with prefix caching on, needs the prefix cache
(``PREFIX_CHANGES`` names its config); it is skipped, saying so, when this build lacks it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

import simsched
from experiments.load_sweep import print_table, write_frames
from simsched import SimConfig
from simsched.analysis.plots import _pyplot
from simsched.analysis.sweep import sweep
from simsched.workloads.workload import WorkloadConfig

NUM_REPLICAS = 8
ROUTERS = ("round_robin", "random", "power_of_two", "jsq", "least_tokens", "least_kv",
           "weighted")
STALE_ROUTERS = ("power_of_two", "jsq", "least_tokens", "least_kv", "weighted")
LOADS = (0.7, 0.8, 0.9, 0.95)
REFRESH = (0.0, 0.05, 0.5)
COLUMNS = ["ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "queue_time_p99", "e2el_p99",
           "load_imbalance", "load_cv"]
# Prefix caching and a shared-prefix workload (from the prefix-cache work): the config changes
# that switch them on. The study is skipped when these fields do not exist in this build.
PREFIX_CHANGES = {"enable_prefix_caching": True, "name": "shared-prefix"}
PREFIX_ROUTERS = ("round_robin", "jsq", "prefix_affinity", "session_affinity", "weighted")


def base_config(num_requests: int | None) -> SimConfig:
    """Eight default replicas (Llama-2-7B, A100-80GB) on the Azure conversation trace."""
    workload = WorkloadConfig.preset("azure-conv", num_requests=num_requests)
    return SimConfig(workload=workload).replace(num_replicas=NUM_REPLICAS)


def replica_capacity(base: SimConfig, num_requests: int) -> float:
    """One replica's saturated throughput (requests/s): the trace at 10 req/s, far above it."""
    cfg = base.replace(num_replicas=1, rate=10.0, **{"workload.num_requests": num_requests})
    return simsched.simulate(cfg).summary()["request_throughput"]


def _plot_vs_load(runs: pd.DataFrame, path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for router, rows in runs.groupby("router", sort=False):
        rows = rows.sort_values("load")
        axes[0].plot(rows["load"] * 100, rows["ttft_p99"], marker="o", label=router)
        axes[1].plot(rows["load"] * 100, rows["tpot_p99"] * 1000, marker="o", label=router)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("p99 TTFT (s)")
    axes[1].set_ylabel("p99 TPOT (ms)")
    for ax in axes:
        ax.set_xlabel("load (% of cluster capacity)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{NUM_REPLICAS} x Llama-2-7B / A100-80GB, Azure conversation trace",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_staleness(table: pd.DataFrame, path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    routers = list(dict.fromkeys(table["router"]))
    width = 0.8 / len(REFRESH)
    for k, refresh in enumerate(REFRESH):
        rows = table[table["refresh_interval"] == refresh].set_index("router").loc[routers]
        x = [i + k * width for i in range(len(routers))]
        label = "exact" if refresh == 0 else f"{refresh * 1000:g} ms"
        axes[0].bar(x, rows["ttft_p99"], width, label=label)
        axes[1].bar(x, rows["queue_time_p99"], width, label=label)
    for ax, name in zip(axes, ("p99 TTFT (s)", "p99 queue time (s)")):
        ax.set_xticks([i + width for i in range(len(routers))], routers, fontsize=7)
        ax.set_ylabel(name)
        ax.set_yscale("log")
    axes[0].legend(fontsize=7, title="router state")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_timelines(iterations: dict[str, pd.DataFrame], path: Path, start: float,
                    seconds: float = 20.0) -> None:
    """Requests in each replica (waiting + running) over ``seconds`` from ``start``."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(iterations), figsize=(5 * len(iterations), 3.4),
                             sharey=True, squeeze=False)
    for ax, (label, it) in zip(axes[0], iterations.items()):
        window = it[(it["started_at"] >= start) & (it["started_at"] < start + seconds)]
        for replica, rows in window.groupby("replica"):
            ax.step(rows["started_at"] - start, rows["num_waiting"] + rows["num_seqs"],
                    where="post", linewidth=0.8, label=f"replica {replica}")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(f"seconds after t={start:.0f} s")
    axes[0][0].set_ylabel("requests in replica (waiting + running)")
    axes[0][-1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def prefix_study(base: SimConfig, rate: float, out: Path) -> pd.DataFrame | None:
    """Hit rate and TTFT per router with prefix caching on (None if this build lacks it)."""
    try:
        cfg = base.replace(**PREFIX_CHANGES, rate=rate)
    except ValueError as exc:
        print(f"prefix-cache study skipped: this build has no prefix caching ({exc})"[:200])
        return None
    runs = sweep(cfg, router=list(PREFIX_ROUTERS), keep_frames=False, progress=False).runs
    cols = [c for c in ("router", "prefix_hit_rate", *COLUMNS) if c in runs.columns]
    write_frames(out, prefix=runs)
    return runs[cols]


def main(argv=None) -> pd.DataFrame:
    """Run the study; return the table of routers at 80 % load."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="out/routing", help="output directory")
    p.add_argument("--quick", action="store_true", help="3,000 requests, fewer routers")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    num_requests = 3000 if args.quick else None          # None: the whole trace (19,366)
    base = base_config(num_requests)
    cap1 = replica_capacity(base, 3000 if args.quick else 6000)
    capacity = NUM_REPLICAS * cap1
    routers = ROUTERS if not args.quick else ("round_robin", "power_of_two", "jsq", "least_kv")
    stale = STALE_ROUTERS if not args.quick else ("jsq", "least_kv")
    rates = {round(load * capacity, 3): load for load in LOADS}
    by_load = sweep(base, router=list(routers), rate=list(rates), keep_frames=False,
                    progress=False).runs
    by_load["load"] = by_load["rate"].map(rates)
    rate80 = next(r for r, load in rates.items() if load == 0.8)
    by_refresh = sweep(base.replace(rate=rate80), router=list(stale),
                       refresh_interval=[r for r in REFRESH if r > 0], keep_frames=False,
                       progress=False).runs
    fresh = by_load[(by_load["load"] == 0.8) & by_load["router"].isin(stale)]
    staleness = pd.concat([fresh.assign(refresh_interval=0.0), by_refresh], ignore_index=True)
    replicas, iterations = {}, {}
    for label, changes in (("jsq, exact", {"router": "jsq"}),
                           ("jsq, 500 ms snapshot", {"router": "jsq", "refresh_interval": 0.5}),
                           ("round_robin", {"router": "round_robin"})):
        res = simsched.simulate(base.replace(rate=rate80, **changes))
        replicas[label], iterations[label] = res.replicas, res.iterations
    per_replica = pd.concat([f.assign(variant=k) for k, f in replicas.items()], ignore_index=True)
    write_frames(out, by_load=by_load, staleness=staleness, replicas=per_replica)
    _plot_vs_load(by_load, out / "ttft_vs_load.png")
    _plot_staleness(staleness, out / "staleness.png")
    middle = float(iterations["round_robin"]["started_at"].median())
    _plot_timelines({k: iterations[k] for k in list(iterations)[:2]}, out / "herding.png",
                    start=middle)
    prefix = prefix_study(base, rate80, out)
    # Pooling: one replica alone at 90 % of its own capacity, against the cluster at 90 %.
    alone = simsched.simulate(base.replace(num_replicas=1, rate=0.9 * cap1)).summary()

    print(f"one replica saturates at {cap1:.3f} req/s on this trace; cluster capacity "
          f"{capacity:.2f} req/s; 80 % load = {rate80:g} req/s; "
          f"{len(by_load) + len(by_refresh) + len(replicas)} runs in {time.time() - t0:.0f} s")
    pooled = by_load[(by_load["load"] == 0.9) & (by_load["router"] == "jsq")]["ttft_p99"]
    print(f"one replica alone at 90 % of its capacity: p99 TTFT {alone['ttft_p99']:.3f} s; "
          f"the {NUM_REPLICAS}-replica cluster at 90 % with jsq: {pooled.iloc[0]:.3f} s")
    at80 = by_load[by_load["load"] == 0.8][["router", *COLUMNS]]
    print("\nrouters at 80 % load, exact state")
    print_table(at80, out)
    print("\np99 TTFT (s) by load")
    print(by_load.pivot(index="router", columns="load", values="ttft_p99")
          .loc[list(routers)].to_string(float_format="{:.3g}".format))
    print("\nstale state at 80 % load: p99 TTFT (s) and load imbalance")
    print(staleness.pivot(index="router", columns="refresh_interval",
                          values=["ttft_p99", "load_imbalance"]).loc[list(stale)]
          .to_string(float_format="{:.3g}".format))
    print("\nper replica at 80 % load: tokens computed (millions) and most requests waiting")
    per_replica["num_tokens"] = per_replica["num_tokens"] / 1e6
    print(per_replica.pivot(index="replica", columns="variant",
                            values=["num_tokens", "num_waiting_max"])
          .to_string(float_format="{:.3f}".format))
    if prefix is not None:
        print("\nprefix caching on: hit rate and TTFT per router")
        print_table(prefix, out)
    return at80


if __name__ == "__main__":
    main()
