"""Cost of a 64-replica cluster against one replica: per iteration, per request, peak memory.

``python -m benchmarks.cluster [--quick] [--router jsq]``

Lesson workload (Poisson arrivals, clipped lognormal lengths), Llama-2-7B on A100-80GB, calibrated
cost model. One replica's capacity is its throughput when overloaded; the cluster (64 replicas)
and the single replica each replay 1,000,000 requests at 80 % of their capacity, so every replica
sees the same load. The cost per simulated iteration is the CPU time of the iteration loop (first
to last cost-model call) over the iterations of all replicas; the cost per request is the CPU time
of the whole ``simulate`` call (workload, simulation and frames) over the requests. CPU time, not
wall time: the machine is shared. Targets: both ratios (cluster / single) <= 1.3, cluster peak
RSS < 1 GB. The cluster runs first, so the peak RSS printed after it is its own.
"""

from __future__ import annotations

import argparse
import time

from benchmarks.common import TimedCostModel, peak_rss_mb
from simsched import SimConfig, simulate
from simsched.cost.factory import make_cost_model


def capacity(base: SimConfig, num_requests: int) -> float:
    """One replica's throughput (requests/s) when requests arrive far faster than it serves."""
    return simulate(base.replace(rate=400.0, num_requests=num_requests)).summary()[
        "request_throughput"]


class CPUTimedCostModel(TimedCostModel):
    """``TimedCostModel`` on this process's CPU clock (other processes' load does not count)."""

    clock = staticmethod(time.process_time)


def timed_run(cfg: SimConfig) -> dict:
    """Run ``cfg`` with a timed cost model; CPU and wall times, iterations, summary figures."""
    timed = CPUTimedCostModel(make_cost_model(cfg.hardware))
    started, cpu = time.perf_counter(), time.process_time()
    res = simulate(cfg, cost_model=timed)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    s = res.summary()
    return {"wall": wall, "cpu": cpu, "loop": timed.last_at - timed.first_at,
            "iterations": timed.num_calls,
            "requests": s["num_requests"], "finished": s["num_finished"],
            "ttft_p99": s["ttft_p99"], "imbalance": s.get("load_imbalance", 1.0)}


def main(argv=None) -> None:
    """Print both runs' costs, their ratios and the cluster's peak RSS."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="8 replicas against one, 50,000 requests each")
    parser.add_argument("--router", default="jsq", help="the cluster's router (default jsq)")
    parser.add_argument("--load", type=float, default=0.8, help="share of capacity (0.8)")
    parser.add_argument("--num-requests", type=int, help="requests per run (default 1,000,000)")
    args = parser.parse_args(argv)
    n_replicas = 8 if args.quick else 64
    n_cluster = n_single = args.num_requests or (50_000 if args.quick else 1_000_000)
    before = peak_rss_mb()
    base = SimConfig().replace(name="lesson")
    cap = capacity(base, 5_000 if args.quick else 20_000)
    rate = args.load * cap
    print(f"one replica's capacity {cap:.2f} req/s; each replica offered {rate:.2f} req/s "
          f"({args.load:.0%}); router {args.router}")
    cluster = timed_run(base.replace(num_replicas=n_replicas, router=args.router,
                                     rate=rate * n_replicas, num_requests=n_cluster))
    peak = peak_rss_mb()
    single = timed_run(base.replace(rate=rate, num_requests=n_single))
    for name, r in ((f"{n_replicas} replicas", cluster), ("1 replica", single)):
        print(f"{name:>12}: {r['requests']:>9,} requests ({r['finished']:,} finished), "
              f"{r['iterations']:>10,} iterations; wall {r['wall']:6.1f} s, CPU {r['cpu']:6.1f} s "
              f"(loop {r['loop']:6.1f} s); {r['loop'] / r['iterations'] * 1e6:5.1f} us/iteration, "
              f"{r['cpu'] / r['requests'] * 1e6:6.1f} us/request; p99 TTFT "
              f"{r['ttft_p99']:.3f} s, load imbalance {r['imbalance']:.3f}")
    per_it = (cluster["loop"] / cluster["iterations"]) / (single["loop"] / single["iterations"])
    per_req = (cluster["cpu"] / cluster["requests"]) / (single["cpu"] / single["requests"])
    print(f"ratio cluster / single: {per_it:.2f}x per iteration, {per_req:.2f}x per request "
          f"(target <= 1.3); cluster peak RSS {peak:.0f} MiB = {peak * 2**20 / 1e9:.2f} GB "
          f"(target < 1 GB; interpreter and imports {before:.0f} MiB)")


if __name__ == "__main__":
    main()
