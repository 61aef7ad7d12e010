"""Which router keeps p99 TTFT down on a cluster, what stale load costs, and cache affinity.

Eight replicas of Llama-2-7B, each on one A100-80GB (calibrated cost model, default engine
settings). Three studies::

    python -m experiments.routing [--out out/routing] [--quick] [--quiet]

1. ``by_load``: the Azure 2023 conversation trace (prompts clipped to 3,072 tokens so that every
   request fits the 4,096-token context), its arrival times rescaled to 70, 80, 90 and
   95 % of the cluster's capacity (eight times one replica's saturated throughput on the same
   trace, measured first by replaying it far above what one replica serves), every router with
   exact state. ``pooling`` adds one replica alone at 90 % of its own capacity.
2. ``staleness``: the load-aware routers at 80 % load with a snapshot refreshed every 50 ms and
   500 ms (as a gateway scraping engine metrics sees them); ``replicas`` holds the per-replica
   frames of three runs and ``herding.png`` the requests in each replica over 20 s.
3. ``affinity``: load balance against cache affinity with prefix caching on: ``shared-prefix``
   (128 groups, each a 2,048-token system prompt, + 128-token questions and outputs; the groups'
   prompts need 16,384 blocks, over twice one replica's 7,422) and ``sessions`` (8-turn
   conversations, each turn's prompt the whole history; think time exponential, mean 5 s), each
   offered 80 % of what the cluster serves with caching off.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pandas as pd

import simsched
from experiments._common import parser, print_table, save_plot, write_frames
from simsched import SimConfig
from simsched.analysis.plots import _figure
from simsched.analysis.sweep import sweep
from simsched.workloads.workload import WorkloadConfig

NUM_REPLICAS = 8
ROUTERS = ("round_robin", "random", "power_of_two", "jsq", "least_tokens", "least_kv",
           "weighted")
STALE_ROUTERS = ("power_of_two", "jsq", "least_tokens", "least_kv", "weighted")
AFFINITY_ROUTERS = ("round_robin", "jsq", "least_tokens", "prefix_affinity", "session_affinity",
                    "weighted")
LOADS = (0.7, 0.8, 0.9, 0.95)
REFRESH = (0.0, 0.05, 0.5)
TURNS = 8                   # turns per session in the affinity study
MAX_PROMPT = 3072           # 1,803 of the trace's 19,366 prompts are longer: clipped
COLUMNS = ["ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "queue_time_p99", "e2el_p99",
           "load_imbalance", "load_cv"]
AFFINITY_COLUMNS = ["prefix_hit_rate", "ttft_p50", "ttft_p99", "tpot_p99", "load_imbalance",
                    "request_throughput"]


def settings(quick: bool) -> dict:
    """Requests per run, routers and sizes of the full or quick study."""
    if quick:
        return {"num_requests": 3000, "capacity_requests": 3000, "routers": (
            "round_robin", "power_of_two", "jsq", "least_kv"), "stale": ("jsq", "least_kv"),
            "affinity_requests": 1200, "sessions": 150}
    return {"num_requests": None, "capacity_requests": 6000, "routers": ROUTERS,
            "stale": STALE_ROUTERS, "affinity_requests": 4000, "sessions": 500}


def base_config(num_requests: int | None) -> SimConfig:
    """Eight default replicas (Llama-2-7B, A100-80GB) on the Azure conversation trace (None:
    all 19,366 requests), prompts clipped to ``MAX_PROMPT`` tokens so every request fits the
    4,096-token context. The study runs under the classic preset (the defaults before issue 40,
    which its findings were made with)."""
    workload = WorkloadConfig.preset("azure-conv", num_requests=num_requests,
                                     max_prompt_tokens=MAX_PROMPT, long_prompt_policy="clip")
    return SimConfig.preset("classic", workload=workload).replace(num_replicas=NUM_REPLICAS)


def saturated_throughput(cfg: SimConfig, rate: float) -> float:
    """One replica's throughput (requests/s) with requests offered at ``rate``, far above it."""
    return simsched.simulate(cfg.replace(num_replicas=1, rate=rate)).summary()[
        "request_throughput"]


def affinity_workloads(cfg: dict) -> dict[str, WorkloadConfig]:
    """The shared-prefix and multi-turn session workloads of the affinity study (rate unset)."""
    return {
        "shared-prefix": WorkloadConfig(name="shared-prefix", system_prompt_len=2048,
                                        num_prefix_groups=128, prompt_len=128, output_len=128,
                                        num_requests=cfg["affinity_requests"]),
        "sessions": WorkloadConfig(name="sessions", num_turns=TURNS, num_requests=cfg["sessions"],
                                   think_time=("exponential", 5.0), lengths="uniform",
                                   prompt_range=(50, 300), output_range=(50, 400)),
    }


def affinity_study(cfg: dict, progress: bool) -> pd.DataFrame:
    """Hit rate and TTFT per router with prefix caching on, and with it off (JSQ)."""
    rows = []
    for name, workload in affinity_workloads(cfg).items():
        base = SimConfig.preset("classic", workload=workload).replace(num_replicas=NUM_REPLICAS)
        # For sessions, rate counts sessions per second; each brings 8 turns.
        per_request = 1.0 / TURNS if name == "sessions" else 1.0
        cap1 = saturated_throughput(base, 40.0 * per_request)
        rate = 0.8 * NUM_REPLICAS * cap1 * per_request
        on = sweep(base.replace(rate=rate, enable_prefix_caching=True),
                   router=list(AFFINITY_ROUTERS), keep_frames=False, progress=progress).runs
        off = sweep(base.replace(rate=rate), router=["jsq"], keep_frames=False,
                    progress=False).runs
        rows.append(on.assign(workload=name, caching="on", rate=rate, replica_capacity=cap1))
        rows.append(off.assign(workload=name, caching="off", rate=rate, replica_capacity=cap1))
    return pd.concat(rows, ignore_index=True)


def _plot_vs_load(runs: pd.DataFrame):
    fig, axes = _figure(None, 2, (10, 3.8))
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
    fig.suptitle(f"{NUM_REPLICAS} x Llama-2-7B / A100-80GB, Azure conversation trace", fontsize=9)
    fig.tight_layout()
    return fig


def _plot_staleness(table: pd.DataFrame):
    fig, axes = _figure(None, 2, (10, 3.6))
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
    return fig


def _plot_timelines(iterations: dict[str, pd.DataFrame], start: float, seconds: float = 20.0):
    """Requests in each replica (waiting + running) over ``seconds`` from ``start``."""
    fig, axes = _figure(None, len(iterations), (5 * len(iterations), 3.4))
    for ax, (label, it) in zip(axes, iterations.items()):
        window = it[(it["started_at"] >= start) & (it["started_at"] < start + seconds)]
        for replica, rows in window.groupby("replica"):
            ax.step(rows["started_at"] - start, rows["num_waiting"] + rows["num_seqs"],
                    where="post", linewidth=0.8, label=f"replica {replica}")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(f"seconds after t={start:.0f} s")
    axes[0].set_ylabel("requests in replica (waiting + running)")
    axes[-1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def _plot_affinity(table: pd.DataFrame):
    on = table[table["caching"] == "on"]
    names = list(dict.fromkeys(on["workload"]))
    fig, axes = _figure(None, 2, (10, 3.6))
    width = 0.8 / len(names)
    routers = list(AFFINITY_ROUTERS)
    for k, name in enumerate(names):
        rows = on[on["workload"] == name].set_index("router").loc[routers]
        x = [i + k * width for i in range(len(routers))]
        axes[0].bar(x, rows["prefix_hit_rate"], width, label=name)
        axes[1].bar(x, rows["ttft_p99"], width, label=name)
    for ax, label in zip(axes, ("prefix hit rate", "p99 TTFT (s)")):
        ax.set_xticks([i + width / 2 for i in range(len(routers))], routers, fontsize=7,
                      rotation=15)
        ax.set_ylabel(label)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> dict[str, pd.DataFrame]:
    """Run the three studies; return their tables (``by_load``, ``pooling``, ``staleness``,
    ``replicas``, ``affinity``) and print them."""
    args = parser("routing", __doc__, "3,000 requests, four routers, shorter affinity runs") \
        .parse_args(argv)
    out = Path(args.out)
    warnings.simplefilter("ignore")
    t0 = time.time()
    cfg = settings(args.quick)
    progress = not args.quiet
    base = base_config(cfg["num_requests"])
    cap1 = saturated_throughput(base.replace(**{"workload.num_requests":
                                                cfg["capacity_requests"]}), 10.0)
    capacity = NUM_REPLICAS * cap1
    rates = {round(load * capacity, 3): load for load in LOADS}
    by_load = sweep(base, router=list(cfg["routers"]), rate=list(rates), keep_frames=False,
                    progress=progress).runs
    by_load["load"] = by_load["rate"].map(rates)
    rate80 = next(r for r, load in rates.items() if load == 0.8)
    by_refresh = sweep(base.replace(rate=rate80), router=list(cfg["stale"]),
                       refresh_interval=[r for r in REFRESH if r > 0], keep_frames=False,
                       progress=progress).runs
    fresh = by_load[(by_load["load"] == 0.8) & by_load["router"].isin(cfg["stale"])]
    staleness = pd.concat([fresh.assign(refresh_interval=0.0), by_refresh], ignore_index=True)
    alone = simsched.simulate(base.replace(num_replicas=1, rate=0.9 * cap1)).summary()
    pooled = by_load[(by_load["load"] == 0.9) & (by_load["router"] == "jsq")].iloc[0]
    pooling = pd.DataFrame([
        {"setup": "1 replica alone, 90 % load", "rate": 0.9 * cap1,
         "ttft_p50": alone["ttft_p50"], "ttft_p99": alone["ttft_p99"]},
        {"setup": f"{NUM_REPLICAS} replicas (jsq), 90 % load", "rate": pooled["rate"],
         "ttft_p50": pooled["ttft_p50"], "ttft_p99": pooled["ttft_p99"]}])
    replicas, iterations = {}, {}
    for label, changes in (("jsq, exact", {"router": "jsq"}),
                           ("jsq, 500 ms snapshot", {"router": "jsq", "refresh_interval": 0.5}),
                           ("round_robin", {"router": "round_robin"})):
        res = simsched.simulate(base.replace(rate=rate80, **changes))
        replicas[label], iterations[label] = res.replicas, res.iterations
    per_replica = pd.concat([f.assign(variant=k) for k, f in replicas.items()], ignore_index=True)
    affinity = affinity_study(cfg, progress)
    by_load.attrs.update(replica_capacity=cap1, capacity=capacity, rate80=rate80)
    tables = {"by_load": by_load, "pooling": pooling, "staleness": staleness,
              "replicas": per_replica, "affinity": affinity}

    print(f"one replica saturates at {cap1:.3f} req/s on this trace; cluster capacity "
          f"{capacity:.2f} req/s; 80 % load = {rate80:g} req/s; {time.time() - t0:.0f} s")
    print("\nrouters at 80 % load, exact state")
    print_table(by_load[by_load["load"] == 0.8][["router", *COLUMNS]])
    print("\np99 TTFT (s) by load")
    print_table(by_load.pivot(index="router", columns="load", values="ttft_p99")
                .loc[list(cfg["routers"])], digits=3, index=True)
    print("\npooling")
    print_table(pooling)
    print("\nstale state at 80 % load: p99 TTFT and queue time (s)")
    print_table(staleness.pivot(index="router", columns="refresh_interval",
                                values=["ttft_p99", "queue_time_p99"]).loc[list(cfg["stale"])],
                digits=3, index=True)
    print("\nper replica at 80 % load: most requests waiting")
    print_table(per_replica.pivot(index="replica", columns="variant", values="num_waiting_max"),
                index=True)
    print("\ncache affinity against load balance (prefix caching on; 'off': caching off, jsq)")
    print_table(affinity[["workload", "caching", "router", "rate", *AFFINITY_COLUMNS]])
    write_frames(out, **tables)
    print(f"wrote {out}/")
    save_plot(out / "ttft_vs_load.png", lambda: _plot_vs_load(by_load))
    save_plot(out / "staleness.png", lambda: _plot_staleness(staleness))
    middle = float(iterations["round_robin"]["started_at"].median())
    save_plot(out / "herding.png", lambda: _plot_timelines(
        {k: iterations[k] for k in list(iterations)[:2]}, start=middle))
    save_plot(out / "affinity.png", lambda: _plot_affinity(affinity))
    return tables


if __name__ == "__main__":
    main()
