"""Cost of a 64-replica cluster against one replica: per iteration, per request, peak memory.

``python -m benchmarks.cluster [--quick] [--router jsq] [--instructions] [--no-floor]``

Lesson workload (Poisson arrivals, clipped lognormal lengths), Llama-2-7B on A100-80GB, calibrated
cost model. One replica's capacity is its throughput when overloaded; the cluster (64 replicas)
and the single replica each replay 1,000,000 requests at 80 % of their capacity, so every replica
sees the same load. The cost per simulated iteration is the CPU time of the iteration loop (first
to last cost-model call) over the iterations of all replicas; the cost per request is the CPU time
of the whole ``simulate`` call (workload, simulation and frames) over the requests. CPU time, not
wall time: the machine is shared. Targets: both ratios (cluster / single) <= 1.3, cluster peak
RSS < 1 GB. The cluster runs first, so the peak RSS printed after it is its own.

Then (unless ``--no-floor``) the bare loop of :mod:`benchmarks.floor` replays the same two traces
with one GPU process per replica and requests dealt round robin: no routing, load tracking,
metrics or policies. Its own cluster / single ratios are what a simulator with a SimPy process
per request and per replica pays for many replicas on this machine; simsched's ratios are also
printed over them.

``--instructions`` counts instead of timing (needs valgrind): each run (20,000 requests unless
``--num-requests`` says otherwise) under cachegrind, once and three times, gives one run's
instructions, first-level data-cache misses and mispredicted branches per simulated iteration.
Counts do not depend on the machine's load, so they separate work done from memory stalls.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.common import (TimedCostModel, cachegrind_per_call, peak_rss_mb,
                               print_count_ratios)
from benchmarks.floor import floor_inputs, floor_loop
from benchmarks.common import add_record_option, record, refuse_quick_record
from simsched import SimConfig, simulate
from simsched.cost.factory import make_cost_model
from simsched.workloads.workload import generate


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


def floor_run(cfg: SimConfig) -> dict:
    """The bare loop of :mod:`benchmarks.floor` on ``cfg``'s trace, with ``cfg``'s replicas
    (round robin): CPU time of the whole loop and of its iterations, iterations."""
    table = generate(cfg.workload, np.random.default_rng(cfg.seed))
    args, opts = floor_inputs(cfg, table)
    timed = CPUTimedCostModel(make_cost_model(cfg.hardware))
    cpu = time.process_time()
    floor_loop(*args, timed, *opts, num_replicas=cfg.cluster.num_replicas)
    return {"cpu": time.process_time() - cpu, "loop": timed.last_at - timed.first_at,
            "iterations": timed.num_calls, "requests": len(table)}


def _configs(base: SimConfig, n_replicas: int, rate: float, router: str, num_requests: int):
    """The cluster's and the single replica's configs, each replica offered ``rate``."""
    return {"cluster": base.replace(num_replicas=n_replicas, router=router,
                                    rate=rate * n_replicas, num_requests=num_requests),
            "single": base.replace(rate=rate, num_requests=num_requests)}


def count_instructions(configs: dict, args: list[str], n_replicas: int) -> dict:
    """Print each run's counts per simulated iteration (cachegrind) and their ratios."""
    counts, iters = {}, {}
    for name, cfg in configs.items():
        counts[name] = cachegrind_per_call("benchmarks.cluster", args + ["--only", name])
        iters[name] = simulate(cfg).iterations.shape[0]
    n = configs["single"].workload.num_requests
    print(f"{n_replicas} replicas against one, {n:,} requests each, under cachegrind: counts "
          f"per simulated iteration ({iters['cluster']:,} and {iters['single']:,} iterations)")
    print_count_ratios(counts["single"], counts["cluster"], "single", "cluster",
                       per=(iters["single"], iters["cluster"]))
    print("counts per request")
    print_count_ratios(counts["single"], counts["cluster"], "single", "cluster", per=(n, n))
    return {"num_requests": n,
            "cluster_instructions_per_request": counts["cluster"]["instructions"] / n,
            "single_instructions_per_request": counts["single"]["instructions"] / n,
            "ratio_request": counts["cluster"]["instructions"] / counts["single"]["instructions"],
            "ratio_iteration": (counts["cluster"]["instructions"] / iters["cluster"])
            / (counts["single"]["instructions"] / iters["single"])}


def main(argv=None) -> None:
    """Print both runs' costs, their ratios and the cluster's peak RSS (or count, --instructions)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="8 replicas against one, 50,000 requests each")
    parser.add_argument("--router", default="jsq", help="the cluster's router (default jsq)")
    parser.add_argument("--load", type=float, default=0.8, help="share of capacity (0.8)")
    parser.add_argument("--num-requests", type=int, help="requests per run (default 1,000,000)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions, cache misses and mispredicts (valgrind)")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip the bare loop's runs (benchmarks.floor, round robin)")
    parser.add_argument("--only", choices=("cluster", "single"), help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)   # per replica
    add_record_option(parser)     # variants: full, instructions
    args = parser.parse_args(argv)
    refuse_quick_record(parser, args)
    if args.record and (args.router, args.load, args.no_floor) != ("jsq", 0.8, False):
        parser.error("--record keeps the default run's figures: drop --router/--load/"
                     "--no-floor")
    n_replicas = 8 if args.quick else 64
    default_n = 20_000 if args.instructions or args.only else 50_000 if args.quick else 1_000_000
    num_requests = args.num_requests or default_n
    before = peak_rss_mb()
    base = SimConfig().replace(name="lesson")
    rate = args.rate
    if rate is None:
        cap = capacity(base, 5_000 if args.quick else 20_000)
        rate = args.load * cap
    configs = _configs(base, n_replicas, rate, args.router, num_requests)
    if args.only is not None:     # one run, untimed (what --instructions counts)
        for _ in range(args.calls):
            simulate(configs[args.only])
        return
    if args.instructions:
        passed = (["--quick"] if args.quick else []) + ["--router", args.router, "--rate",
                                                        repr(rate), "--num-requests",
                                                        str(num_requests)]
        counts = count_instructions(configs, passed, n_replicas)
        if args.record:
            record("cluster", "instructions", counts)
        return
    print(f"one replica's capacity {cap:.2f} req/s; each replica offered {rate:.2f} req/s "
          f"({args.load:.0%}); router {args.router}")
    cluster = timed_run(configs["cluster"])
    peak = peak_rss_mb()
    single = timed_run(configs["single"])
    for name, r in ((f"{n_replicas} replicas", cluster), ("1 replica", single)):
        print(f"{name:>12}: {r['requests']:>9,} requests ({r['finished']:,} finished), "
              f"{r['iterations']:>10,} iterations; wall {r['wall']:6.1f} s, CPU {r['cpu']:6.1f} s "
              f"(loop {r['loop']:6.1f} s); {r['loop'] / r['iterations'] * 1e6:5.1f} us/iteration, "
              f"{r['cpu'] / r['requests'] * 1e6:6.1f} us/request; p99 TTFT "
              f"{r['ttft_p99']:.3f} s, load imbalance {r['imbalance']:.3f}")
    per_it, per_req = _ratios(cluster, single)
    print(f"ratio cluster / single: {per_it:.2f}x per iteration, {per_req:.2f}x per request "
          f"(target <= 1.3); cluster peak RSS {peak:.0f} MiB = {peak * 2**20 / 1e9:.2f} GB "
          f"(target < 1 GB; interpreter and imports {before:.0f} MiB)")
    if args.no_floor:
        return
    # The same two runs as a bare SimPy loop (no routing, metrics or policies): how much of the
    # ratio any simulator with a process per request and per replica pays on this machine.
    floors = {name: floor_run(cfg) for name, cfg in configs.items()}
    for name, r in ((f"{n_replicas} replicas", floors["cluster"]), ("1 replica", floors["single"])):
        print(f"{'bare loop':>12}, {name}: {r['iterations']:>10,} iterations; CPU "
              f"{r['cpu']:6.1f} s (loop {r['loop']:6.1f} s); "
              f"{r['loop'] / r['iterations'] * 1e6:5.1f} us/iteration, "
              f"{r['cpu'] / r['requests'] * 1e6:6.1f} us/request")
    floor_it, floor_req = _ratios(floors["cluster"], floors["single"])
    print(f"bare loop cluster / single: {floor_it:.2f}x per iteration, {floor_req:.2f}x per "
          f"request; simsched's ratios over the bare loop's: {per_it / floor_it:.2f}x per "
          f"iteration, {per_req / floor_req:.2f}x per request")
    if args.record:
        us = {name: {"it": r["loop"] / r["iterations"] * 1e6, "req": r["cpu"] / r["requests"] * 1e6}
              for name, r in (("cluster", cluster), ("single", single))}
        record("cluster", "full", {
            "cluster_iterations": cluster["iterations"], "single_iterations": single["iterations"],
            "cluster_us_per_iteration": us["cluster"]["it"],
            "single_us_per_iteration": us["single"]["it"],
            "cluster_us_per_request": us["cluster"]["req"],
            "single_us_per_request": us["single"]["req"],
            "ratio_iteration": per_it, "ratio_request": per_req,
            "floor_ratio_iteration": floor_it, "floor_ratio_request": floor_req,
            **{f"floor_{name}_{k}": v for name, r in floors.items() for k, v in (
                ("iterations", r["iterations"]), ("us_per_iteration",
                                                  r["loop"] / r["iterations"] * 1e6),
                ("us_per_request", r["cpu"] / r["requests"] * 1e6))},
            "peak_rss_mib": peak})


def _ratios(cluster: dict, single: dict) -> tuple[float, float]:
    """Cluster / single CPU time per simulated iteration (loop) and per request (whole run)."""
    per_it = (cluster["loop"] / cluster["iterations"]) / (single["loop"] / single["iterations"])
    per_req = (cluster["cpu"] / cluster["requests"]) / (single["cpu"] / single["requests"])
    return per_it, per_req

if __name__ == "__main__":
    main()
