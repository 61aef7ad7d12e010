"""A fleet over a day: wall time and peak memory of a streamed 64-replica ServeGen day.

``python -m benchmarks.fleet_day [--replicas 64] [--hours 24] [--start-hour 0]
[--utilisation 0.5] [--autoscale] [--out DIR] [--loop both|simsched|floor]``

Llama-2-7B replicas on A100-80GB (calibrated cost model, default engine), prompts uniform in
``--prompt-range``, outputs in ``--output-range``. One replica's capacity on those lengths is
measured first (offered far above it); the ServeGen ``m-large`` day (bundled) is then scaled so
the fleet's mean utilisation is ``--utilisation`` and replayed for ``--hours`` (the day's first
hours, real clock, or ``--hours`` from ``--start-hour``: a busy slice, at the same scale),
streamed to Parquet under ``--out`` (``simulate(..., stream_to=...)``), router
``least_tokens``. ``--autoscale`` adds a threshold autoscaler (running requests per replica at
70 % of capacity, 30 s delay). Prints requests, iterations, wall time, peak RSS, and the rates
per request and per replica-iteration, so a full day can be extrapolated from a shorter run, and
the interpreter that ran it (its build changes the time as much as a code change does).
By default (``--loop both``) the same requests are then replayed in :mod:`benchmarks.floor`'s
bare SimPy loop (one event per iteration, requests dealt round robin, no log or frames: the least
a SimPy simulator does on them) and the ratio of the two wall times is printed, simsched's over
the bare loop's, as :mod:`benchmarks.floor` prints it: the figure this benchmark reports, as it
says how close to a SimPy loop's cost simsched comes on the machine at hand (whose speed, shared
and noisy, moves either time by tens of per cent). ``--loop simsched`` runs simsched alone (what
:mod:`benchmarks.instructions` counts), ``--loop floor`` the bare loop alone. A day within a
fixed wall time is the sharded fleet's target (issue 47), not this loop's.

``--shards N`` runs the fleet sharded (``simulate(..., shards=N)``: N local worker processes, or
Ray actors with ``--shard-workers ray [--ray-address A]``), the router reading a snapshot
refreshed every ``--refresh-interval`` seconds (default 0.05 when sharded: a sharded run needs
one; 0, exact state, otherwise), and first the same config in one process (``--no-baseline``
skips it; ``--loop`` is then not run): wall and CPU times of both, the speed-up, each shard's
busy wall and CPU seconds, windows synchronised and the synchronisation's cost per window (the
coordinator's wait on a window beyond the slowest shard's work in it after it was sent; the work
shards ran ahead of each window while the coordinator routed it), the coordinator's and the
largest worker's peak RSS, and the machine's load (``os.getloadavg``; a shared machine's other
work slows both runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import resource
import shutil
import sys
import tempfile
import time

import numpy as np

from benchmarks.cluster import floor_run
from benchmarks.common import peak_rss_mb
from simsched import SimConfig, simulate
from simsched.config.autoscaling import AutoscalingConfig
from simsched.config.cluster import ClusterConfig
from simsched.workloads import rate_schedule
from simsched.workloads.workload import WorkloadConfig


def lengths(args, **changes) -> WorkloadConfig:
    """The benchmark's request lengths, with ``changes``."""
    return WorkloadConfig(name="custom", lengths="uniform", prompt_range=tuple(args.prompt_range),
                          output_range=tuple(args.output_range), **changes)


def parser() -> argparse.ArgumentParser:
    """The command line (shared with ``benchmarks.bytecodes``, which runs the same slice)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=64)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--start-hour", type=float, default=0.0,
                   help="replay the day from this hour (profile a busy slice)")
    # The scale target: 50-80 % mean utilisation and at least 10 M requests a day. At
    # 50 % the day has 11.7 M requests (65 %, the default before: 15.3 M).
    p.add_argument("--utilisation", type=float, default=0.5)
    p.add_argument("--prompt-range", type=int, nargs=2, default=(128, 2048))
    p.add_argument("--output-range", type=int, nargs=2, default=(64, 512))
    p.add_argument("--autoscale", action="store_true")
    p.add_argument("--refresh-interval", type=float,
                   help="the router's snapshot interval, s (default: 0.05 with --shards, else 0)")
    # Added here, not through benchmarks.common: benchmarks.instructions runs this file in an
    # older checkout, whose common module may not have it.
    p.add_argument("--record", action="store_true",
                   help="write the figures to benchmarks/results/ and re-render "
                        "benchmarks/README.md (the default day only)")
    return p


def fleet_config(args) -> tuple:
    """Calibrate one replica (its capacity on the benchmark's lengths) and build the fleet's
    config: ``(config, capacity in req/s, mean offered rate)``."""
    base = SimConfig(workload=lengths(args))
    sat = simulate(base.replace(workload=lengths(args, rate=40.0, duration=120.0)))
    capacity = sat.summary()["request_throughput"]
    it = sat.iterations
    running = float(np.average(it["num_seqs"], weights=it["duration"])) * 0.7
    day = rate_schedule.read_servegen(model="m-large")
    rate = args.utilisation * args.replicas * capacity
    duration = args.hours * 3600.0
    start = args.start_hour * 3600.0
    workload = lengths(args, arrival="servegen", servegen_model="m-large",
                       rate=rate * rate_schedule.mean_rate(rate_schedule.read_servegen(
                           model="m-large", start=start, duration=duration))
                       / rate_schedule.mean_rate(day),
                       start=start, duration=duration)
    auto = None
    if args.autoscale:
        auto = AutoscalingConfig(policy="threshold", metric="running", target=running,
                                 provisioning_time=20.0, model_load_time=10.0,
                                 max_replicas=args.replicas, price_per_hour=2.0)
    refresh = args.refresh_interval
    if refresh is None:
        refresh = 0.05 if getattr(args, "shards", None) else 0.0
    cfg = dataclasses.replace(base, workload=workload, cluster=ClusterConfig(
        num_replicas=args.replicas, router="least_tokens", autoscaling=auto,
        refresh_interval=refresh))
    return cfg, capacity, rate


def run_simsched(args, cfg, capacity: float, rate: float, shards: int | None = None
                 ) -> tuple:
    """Run the streamed fleet (in ``shards`` shards if given), print its figures and return its
    wall and CPU times (sharded: the coordinator's CPU plus every shard's, then the sharding
    figures, requests and iterations)."""
    out = args.out or tempfile.mkdtemp(prefix="fleet_day_")
    before = peak_rss_mb()
    started, cpu_started = time.perf_counter(), time.process_time()
    children = _children_cpu()
    sharding = {} if shards is None else dict(
        shards=shards, shard_workers=args.shard_workers, ray_address=args.ray_address)
    run = simulate(cfg, stream_to=out, **sharding)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    if shards is not None:
        figures = run.info["sharding"]
        # The coordinator's process (it runs the last local shard) and the shards elsewhere:
        # local workers (children, ended by now) or Ray actors (their CPU in their windows).
        cpu += _children_cpu() - children if args.shard_workers == "process" \
            else sum(figures["shard_cpu_time"])
        print_sharding(figures, wall)
    n = int(run.windows["num_requests"].sum())
    iterations = run.dataset("iterations").count_rows()
    print(f"{args.replicas} replicas, {args.hours:g} h of ServeGen m-large at "
          f"{args.utilisation:.0%} mean utilisation (one replica serves {capacity:.2f} req/s; "
          f"mean offered {rate:.1f} req/s): {n} requests, {iterations} iterations, "
          f"{int(run.windows['num_finished'].sum())} finished")
    print(f"wall {wall:.1f} s ({wall / n * 1e6:.1f} us per request, "
          f"{wall / iterations * 1e6:.2f} us per iteration), CPU {cpu:.1f} s; peak RSS "
          f"{peak_rss_mb():.0f} MiB (before the run: {before:.0f} MiB)")
    if cfg.cluster.autoscaling is not None:
        print(f"fleet cost {run.info['fleet_cost']:.1f} ({run.info['fleet_replica_hours']:.1f} "
              f"replica-hours)")
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)
    if shards is not None:
        return wall, cpu, run.info["sharding"], n, iterations
    if getattr(args, "record", False) and getattr(args, "shards", None) is None:
        from benchmarks.common import record

        record("fleet_day", "full", {"requests": n, "iterations": iterations, "wall_s": wall,
                                     "cpu_s": cpu, "us_per_request": wall / n * 1e6,
                                     "us_per_iteration": wall / iterations * 1e6,
                                     "peak_rss_mib": peak_rss_mb()})
    return wall, cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def print_sharding(figures: dict, wall: float) -> None:
    """Print a sharded run's synchronisation figures."""
    n = figures["num_windows"]
    busy, cpu = figures["shard_busy_time"], figures["shard_cpu_time"]
    print(f"{figures['shards']} shards ({', '.join(f'{b:.1f}' for b in busy)} s busy, "
          f"{', '.join(f'{c:.1f}' for c in cpu)} s CPU in their windows); {n} windows "
          f"synchronised: the slowest shard's work on them {figures['slowest_shard_time']:.1f} s "
          f"(of which {figures['ahead_time']:.1f} s run ahead while the coordinator routed); "
          f"{figures['window_time']:.1f} s waiting on them, synchronisation "
          f"{figures['sync_time_per_window'] * 1e6:.0f} us per window "
          f"({n * figures['sync_time_per_window'] / wall:.0%} of the wall "
          f"time); routing and arrivals {figures['route_time']:.1f} s; shards' peak RSS "
          f"{', '.join(f'{m:.0f}' for m in figures['shard_peak_rss_mib'])} MiB")


def run_floor(cfg, record_it: bool = False) -> tuple[float, float]:
    """Run :mod:`benchmarks.floor`'s bare SimPy loop on ``cfg``'s requests, print its figures and
    return its wall and CPU times."""
    started, cpu_started = time.perf_counter(), time.process_time()
    bare = floor_run(cfg)
    floor_wall = time.perf_counter() - started
    floor_cpu = time.process_time() - cpu_started
    print(f"bare SimPy loop (benchmarks.floor, round robin): wall {floor_wall:.1f} s "
          f"({floor_wall / bare['requests'] * 1e6:.1f} us per request, "
          f"{floor_wall / bare['iterations'] * 1e6:.2f} us per iteration; {bare['requests']} "
          f"requests, {bare['iterations']} iterations), CPU {floor_cpu:.1f} s; peak RSS "
          f"{peak_rss_mb():.0f} MiB")
    if record_it:
        from benchmarks.common import record

        record("fleet_day", "floor", {
            "requests": bare["requests"], "iterations": bare["iterations"], "wall_s": floor_wall,
            "us_per_request": floor_wall / bare["requests"] * 1e6,
            "us_per_iteration": floor_wall / bare["iterations"] * 1e6,
            "peak_rss_mib": peak_rss_mb()})
    return floor_wall, floor_cpu


def main(argv=None) -> None:
    """Calibrate one replica, run the streamed fleet (or the bare loop), print the figures."""
    p = parser()
    p.add_argument("--out", help="stream directory (default: a temporary one, removed)")
    # The least a SimPy simulator with one event per iteration does on the same requests
    # (benchmarks.floor: dealt round robin, KV reserved at admission, no log, no frames).
    p.add_argument("--loop", choices=("both", "simsched", "floor"), default="both",
                   help="both (default): simsched, then benchmarks.floor's bare SimPy loop on the "
                        "same requests, and the ratio of their times; or either alone")
    p.add_argument("--shards", type=int, help="run the fleet in N shards (see above)")
    p.add_argument("--shard-workers", choices=("process", "ray"), default="process")
    p.add_argument("--ray-address", help="with --shard-workers ray: an existing Ray cluster")
    p.add_argument("--no-baseline", action="store_true",
                   help="with --shards: skip the one-process run of the same config")
    p.add_argument("--repeat", type=int, default=1,
                   help="with --shards: run both K times, alternating; keep each one's best")
    args = p.parse_args(argv)
    if args.shards is not None:
        if args.record:
            p.error("--record keeps the one-process day's figures; sharded runs are recorded "
                    "by benchmarks.shards")
        return main_sharded(args)
    if args.record and any(getattr(args, k) != p.get_default(k) for k in
                           ("replicas", "hours", "start_hour", "utilisation", "prompt_range",
                            "output_range", "autoscale")):
        p.error("--record keeps the default day's figures: drop the other options but --loop")
    cfg, capacity, rate = fleet_config(args)
    times = {}
    if args.loop != "floor":
        times["simsched"] = run_simsched(args, cfg, capacity, rate)
    if args.loop != "simsched":
        times["floor"] = run_floor(cfg, args.record)
    if len(times) == 2:
        (wall, cpu), (floor_wall, floor_cpu) = times["simsched"], times["floor"]
        # CPU time as well: on a shared machine wall time also counts other processes' turns.
        print(f"simsched / bare loop: {wall / floor_wall:.2f}x wall, "
              f"{cpu / max(floor_cpu, 1e-9):.2f}x CPU on the same requests")
    # The interpreter's build matters as much as a code change: say which one ran.
    print(f"Python {platform.python_version()} ({sys.executable}; "
          f"{' '.join(platform.python_build())})")


def main_sharded(args) -> None:
    """``--shards N``: the one-process run (unless ``--no-baseline``), then the sharded one,
    ``--repeat`` times (``benchmarks.shards`` records such runs)."""
    cfg, capacity, rate = fleet_config(args)
    load_before = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPUs, load average {load_before:.2f} before")
    best_one, best = compare(args, cfg, capacity, rate)
    load_after = os.getloadavg()[0]
    print(f"load average {load_after:.2f} after")
    if best_one is not None and args.repeat > 1:
        print(f"best of {args.repeat}: {best_one[0] / best[0]:.2f}x wall "
              f"({best_one[0]:.1f} s -> {best[0]:.1f} s)")
    print(f"Python {platform.python_version()} ({sys.executable})")


def compare(args, cfg, capacity: float, rate: float) -> tuple:
    """The one-process run (unless ``--no-baseline``) and the sharded one, alternating
    ``--repeat`` times: the best (least wall time) of each (None: no baseline)."""
    best_one = best = None
    for _ in range(max(1, args.repeat)):
        if not args.no_baseline:
            one = run_simsched(args, cfg, capacity, rate)
            best_one = one if best_one is None or one[0] < best_one[0] else best_one
        sharded = run_simsched(args, cfg, capacity, rate, shards=args.shards)
        best = sharded if best is None or sharded[0] < best[0] else best
        if not args.no_baseline:
            print(f"{args.shards} shards over one process: {one[0] / sharded[0]:.2f}x wall "
                  f"({one[0]:.1f} s -> {sharded[0]:.1f} s), CPU {one[1]:.1f} s -> "
                  f"{sharded[1]:.1f} s in all")
    return best_one, best


if __name__ == "__main__":
    main()
