"""Routing cost per request on the 64-replica cluster benchmark: routers against each other.

``python -m benchmarks.router_cost [--routers jsq llm-d] [--num-requests 30000] [--repeat 3]
[--instructions] [--record]``

:mod:`benchmarks.cluster`'s 64-replica run (lesson workload, Llama-2-7B on A100-80GB, 80 % of
the replicas' capacity, exact state) with each router: the CPU time of the whole ``simulate``
call per request (the best of ``--repeat`` runs, the routers alternating; CPU time, as the
machine is shared), and, from as many runs of their own, the time inside the router's ``choose``
(a CPU-clock probe around each call). With ``--instructions``, each router's run of 5,000
requests under cachegrind (:func:`benchmarks.common.cachegrind_per_call`: one call and three,
the difference over two, so start-up is left out): instructions per request, which do not
depend on the machine's load.
Prints each figure and its ratio to the first router's; ``--record`` writes them to
``benchmarks/results/router_cost.json`` (variants ``cpu`` and ``instructions``), which
docs/llm_d.md's cost table is rendered from.
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks.cluster import _configs, capacity
from benchmarks import results
from benchmarks.common import cachegrind_per_call
from simsched import SimConfig, simulate
from simsched.cluster import cluster as cluster_module

NUM_REPLICAS, LOAD = 64, 0.8


def _probe_choose(spent: list):
    """Wrap each cluster's routing choice in a CPU-clock probe adding to ``spent[0]``; return
    the undo."""
    setup = cluster_module.Cluster._setup_routing

    def probed(self, cl):
        setup(self, cl)
        inner, clock = self._choose, time.process_time

        def choose(view, req):
            started = clock()
            i = inner(view, req)
            spent[0] += clock() - started
            return i
        self._choose = choose
    cluster_module.Cluster._setup_routing = probed
    return lambda: setattr(cluster_module.Cluster, "_setup_routing", setup)


def cpu_per_request(configs: dict, repeat: int) -> dict:
    """Per router: the best CPU µs per request over ``repeat`` alternating runs, and the best
    µs inside ``choose`` over as many runs with the probe (kept apart: the probe costs CPU)."""
    best: dict[str, list[float]] = {r: [float("inf"), float("inf")] for r in configs}
    spent = [0.0]
    for _ in range(repeat):
        for router, cfg in configs.items():
            n = cfg.workload.num_requests
            started = time.process_time()
            simulate(cfg)
            best[router][0] = min(best[router][0], (time.process_time() - started) / n * 1e6)
            spent[0] = 0.0
            undo = _probe_choose(spent)
            try:
                simulate(cfg)
            finally:
                undo()
            best[router][1] = min(best[router][1], spent[0] / n * 1e6)
    return {r: {"us_per_request": round(t, 2), "choose_us_per_request": round(c, 2)}
            for r, (t, c) in best.items()}


def instructions_per_request(routers: list[str], rate: float, n: int = 5000) -> dict:
    """Per router: instructions, first-level data-cache misses and mispredicted branches per
    request of a ``n``-request run (cachegrind)."""
    out = {}
    for router in routers:
        counts = cachegrind_per_call("benchmarks.cluster", [
            "--router", router, "--rate", repr(rate), "--num-requests", str(n),
            "--only", "cluster"])
        out[router] = {name: round(v / n) for name, v in counts.items()}
    return out


def table() -> str:
    """docs/llm_d.md's cost table, from the recorded figures (``--record``)."""
    from benchmarks.results import load

    r = load("router_cost")
    cpu, counts = r["cpu"], r["instructions"]
    routers = list(cpu["routers"])
    first = routers[0]

    def row(what: str, figures: dict, key: str, fmt) -> str:
        base = figures[first][key]
        cells = " | ".join(fmt(figures[x][key]) for x in routers)
        ratio = " | ".join(f"{figures[x][key] / base:.2f}×" for x in routers[1:])
        return f"| {what} | {cells} | {ratio} |"
    head = " | ".join(f"`{x}`" for x in routers)
    ratios = " | ".join(f"`{x}` / `{first}`" for x in routers[1:])
    return "\n".join([
        f"| measure | {head} | {ratios} |", "|---" * (1 + 2 * len(routers) - 1) + "|",
        row(f"CPU µs per request (best of {cpu['repeat']}, {cpu['num_requests']:,} requests, "
            f"load average {cpu['load_average']:.1f})", cpu["routers"], "us_per_request",
            lambda v: f"{v:.1f}"),
        row("CPU µs per request inside `choose` (from probed runs)", cpu["routers"],
            "choose_us_per_request", lambda v: f"{v:.1f}"),
        row(f"instructions per request (cachegrind, {counts['num_requests']:,} requests)",
            counts["routers"], "instructions", lambda v: f"{v / 1e3:.1f}k"),
        "", f"Measured {cpu['measured']} (commit {cpu['commit']}) with `python -m "
            f"benchmarks.router_cost --instructions --record`."])


def main(argv=None) -> None:
    """Measure, print the ratios to the first router, record with ``--record``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--routers", nargs="+", default=["jsq", "llm-d"])
    p.add_argument("--num-requests", type=int, default=30_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--instructions", action="store_true",
                   help="also count instructions under cachegrind (needs valgrind; minutes)")
    p.add_argument("--record", action="store_true")
    args = p.parse_args(argv)
    base = SimConfig().replace(name="lesson")
    rate = LOAD * capacity(base, 20_000)
    configs = {r: _configs(base, NUM_REPLICAS, rate, r, args.num_requests)["cluster"]
               for r in args.routers}
    load_before = os.getloadavg()[0]
    cpu = cpu_per_request(configs, args.repeat)
    first = args.routers[0]
    print(f"{NUM_REPLICAS} replicas, {args.num_requests:,} requests, best of {args.repeat} "
          f"(load average {load_before:.1f}):")
    for r, v in cpu.items():
        print(f"  {r:>8}: {v['us_per_request']:6.1f} us/request CPU "
              f"({v['us_per_request'] / cpu[first]['us_per_request']:.2f}x {first}), "
              f"{v['choose_us_per_request']:5.1f} in choose")
    cpu_figures = {"num_replicas": NUM_REPLICAS, "load": LOAD,
                   "num_requests": args.num_requests, "repeat": args.repeat, "routers": cpu,
                   "load_average": round(load_before, 2)}
    counts = None
    if args.instructions:
        counts = instructions_per_request(args.routers, rate)
        for r, v in counts.items():
            print(f"  {r:>8}: {v['instructions'] / 1e3:6.1f}k instructions/request "
                  f"({v['instructions'] / counts[first]['instructions']:.2f}x {first})")
    if args.record:
        # Both variants first, then one rendering of the tables (which read both).
        if counts is not None:
            results.record("router_cost", "instructions",
                           {"num_replicas": NUM_REPLICAS, "load": LOAD, "num_requests": 5000,
                            "routers": counts}, render=False)
        results.record("router_cost", "cpu", cpu_figures)


if __name__ == "__main__":
    main()
