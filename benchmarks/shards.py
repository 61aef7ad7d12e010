"""Sharded fleets: speed-up over one process, the synchronisation's cost, a day's projection.

``python -m benchmarks.shards [--replicas 64 256 1024] [--shards 2 4] [--hours 0.02]
[--start-hour 14] [--workers process|ray] [--ray-address A] [--repeat K] [--record]``;
``--round-trip`` only times a small message's round trip to a forked process (a window's floor),
over a blocking pipe and over the polled channel sharded runs use where each process has a CPU.

For each fleet size and shard count: :mod:`benchmarks.fleet_day`'s fleet (Llama-2-7B / A100-80GB
replicas, ServeGen ``m-large`` at 50 % mean utilisation, ``least_tokens`` on a snapshot
refreshed every 50 ms), a ``--hours`` slice from ``--start-hour``, streamed, run in one process
and in N shards (``simulate(..., shards=N)``; local worker processes, or Ray actors), alternating
``--repeat`` times, the best of each kept. Prints wall and CPU times, the speed-up, windows
synchronised and the cost per window beyond the slowest shard's work, each shard's CPU and peak
RSS, and the machine's load (a shared machine's other work slows both runs, the sharded one more:
each window waits for every shard to be scheduled). Then projects a 1,000-replica day on 16 Ray
nodes (one shard each) from the largest fleet's figures
(:func:`benchmarks.results_shards.day_projection`). ``--record`` writes variant
``r{replicas}_s{shards}_{workers}`` of ``benchmarks/results/shards.json``.
"""

from __future__ import annotations

import argparse
import os

import multiprocessing
import statistics
import time

from benchmarks.fleet_day import compare, fleet_config
from benchmarks.fleet_day import parser as fleet_parser
from benchmarks.results_shards import day_projection, projection_text
from simsched.analysis.spin_pipe import start_worker, use_spin


def _echo(conn) -> None:
    while (message := conn.recv()) is not None:
        conn.send(message)


def pipe_round_trip(n: int = 5000, polled: bool = False) -> tuple[float, float]:
    """Median and mean seconds of a small message's round trip to a forked process over a pipe
    (a window's floor: the coordinator's send, the worker's wake-up and reply); ``polled``:
    over the sharded runs' polled channel (:mod:`simsched.analysis.spin_pipe`), no wake-up."""
    ctx = multiprocessing.get_context("fork")
    if polled:
        worker, conn = start_worker(_echo)
    else:
        conn, child = ctx.Pipe()
        worker = ctx.Process(target=_echo, args=(child,), daemon=True)
        worker.start()
    message = (0.05, ([1, 2], [0.1, 0.2], [10, 20], [5, 6], [0, 0], [None, None], [0, 1]), False)
    times = []
    for _ in range(n):
        started = time.perf_counter()
        conn.send(message)
        conn.recv()
        times.append(time.perf_counter() - started)
    conn.send(None)
    worker.join()
    conn.close()
    return statistics.median(times), statistics.fmean(times)


def main(argv=None) -> None:
    """Run the matrix, print each comparison and the projection; record with ``--record``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[64])
    p.add_argument("--shards", type=int, nargs="+", default=[2])
    p.add_argument("--hours", type=float, default=0.02)
    p.add_argument("--start-hour", type=float, default=14.0)
    p.add_argument("--workers", choices=("process", "ray"), default="process")
    p.add_argument("--ray-address")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--record", action="store_true")
    p.add_argument("--round-trip", action="store_true",
                   help="only measure a pipe round trip to a forked process (median, mean)")
    args = p.parse_args(argv)
    if args.round_trip:
        for polled, what in ((False, "blocking pipe"), (True, "polled channel")):
            median, mean = pipe_round_trip(polled=polled)
            print(f"{what} round trip to a forked process: median {median * 1e6:.0f} us, mean "
                  f"{mean * 1e6:.0f} us (5,000 trips; load average {os.getloadavg()[0]:.1f})")
        return
    last = None
    for replicas in args.replicas:
        for shards in args.shards:
            fleet_args = fleet_parser().parse_args([
                "--replicas", str(replicas), "--hours", str(args.hours), "--start-hour",
                str(args.start_hour)])
            fleet_args.out, fleet_args.shards = None, shards
            fleet_args.shard_workers, fleet_args.ray_address = args.workers, args.ray_address
            fleet_args.repeat, fleet_args.no_baseline = args.repeat, False
            cfg, capacity, rate = fleet_config(fleet_args)
            load_before = os.getloadavg()[0]
            (one_wall, one_cpu), (wall, cpu, figures, n, iterations) = compare(
                fleet_args, cfg, capacity, rate)
            load_after = os.getloadavg()[0]
            row = {
                "replicas": replicas, "hours": args.hours, "start_hour": args.start_hour,
                "refresh_interval": cfg.cluster.refresh_interval, "shards": shards,
                "workers": args.workers, "repeat": args.repeat, "requests": n,
                "polled": args.workers == "process" and use_spin(shards),
                "iterations": iterations, "one_wall_s": round(one_wall, 2),
                "one_cpu_s": round(one_cpu, 2), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                "speedup": round(one_wall / wall, 3), "num_windows": figures["num_windows"],
                "sync_us_per_window": round(figures["sync_time_per_window"] * 1e6, 1),
                "slowest_shard_s": round(figures["slowest_shard_time"], 2),
                "ahead_s": round(figures["ahead_time"], 2),
                "route_s": round(figures["route_time"], 3),
                "shard_cpu_s": [round(c, 2) for c in figures["shard_cpu_time"]],
                "shard_peak_rss_mib": [round(m) for m in figures["shard_peak_rss_mib"]],
                "load_before": round(load_before, 2), "load_after": round(load_after, 2)}
            print(f"== {replicas} replicas, {shards} shards ({args.workers}): best of "
                  f"{args.repeat} {row['speedup']:.2f}x ({one_wall:.1f} s -> {wall:.1f} s); "
                  f"load {load_before:.1f} -> {load_after:.1f}")
            if args.record:
                from benchmarks.common import record

                record("shards", f"r{replicas}_s{shards}_{args.workers}", row)
            last = row
    if last is not None:
        print(projection_text(day_projection(last)))


if __name__ == "__main__":
    main()
