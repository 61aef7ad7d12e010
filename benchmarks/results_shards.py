"""The sharded runs' block of docs/cluster.md: the recorded comparisons (``shards.json``, written
by ``python -m benchmarks.shards --record``) as a table, and the paper projection of a fleet's
day from the largest of them. :mod:`benchmarks.results` renders it with the other blocks."""

from __future__ import annotations

DAY = 86400.0


def shard_bound(row: dict) -> float:
    """A sharded row's speed-up with free synchronisation and routing: the one process's CPU
    time over the slowest shard's work per window, summed."""
    return row["one_cpu_s"] / row["slowest_shard_s"]


def day_projection(v: dict, replicas: int = 1000, nodes: int = 16) -> dict:
    """A paper projection of a ``replicas``-replica day sharded over ``nodes`` Ray nodes (one
    shard each), from one recorded sharded slice ``v`` (a variant of ``shards.json``): the
    one-process CPU per replica and simulated second, the shards' imbalance (slowest over mean
    CPU), the cost per synchronised window and the coordinator's routing per request, each
    scaled to the day; the window is the snapshot interval."""
    seconds = v["hours"] * 3600.0
    per_replica_second = v["one_cpu_s"] / (v["replicas"] * seconds)
    cpu = v["shard_cpu_s"]
    imbalance = max(cpu) / (sum(cpu) / len(cpu))
    one = per_replica_second * replicas * DAY
    work = one / nodes * imbalance
    windows = DAY / v["refresh_interval"]
    sync = windows * v["sync_us_per_window"] * 1e-6
    requests = v["requests"] / seconds * DAY * replicas / v["replicas"]
    routing = v["route_s"] / v["requests"] * requests
    return {"replicas": replicas, "nodes": nodes, "measured": v,
            "cpu_per_replica_second": per_replica_second, "imbalance": imbalance,
            "one_process_s": one, "work_s": work, "windows": windows, "sync_s": sync,
            "requests": requests, "routing_s": routing, "total_s": work + sync + routing,
            # The two levers: a cheaper round trip (1 ms a window), a longer interval (0.5 s).
            "total_1ms_s": work + windows * 1e-3 + routing,
            "total_500ms_s": work + DAY / 0.5 * v["sync_us_per_window"] * 1e-6 + routing}


def projection_text(p: dict) -> str:
    """The projection's paragraph (docs/cluster.md)."""
    v = p["measured"]
    return (
        f"Projection of a {p['replicas']:,}-replica day on a {p['nodes']}-node Ray cluster (one "
        f"shard per node), from the {v['replicas']:,}-replica slice on {v['shards']} "
        f"{v['workers']} shards ({v['hours']:g} h from hour {v['start_hour']:g}, "
        f"{v['requests']:,} requests): one process needs "
        f"{p['cpu_per_replica_second'] * 1e6:.0f} µs of CPU per replica and simulated second, "
        f"so the day is {p['one_process_s'] / 3600:.1f} h on one core; split over "
        f"{p['nodes']} shards with the measured imbalance ({p['imbalance']:.2f}× the mean "
        f"shard) {p['work_s'] / 3600:.2f} h of shard work; {p['windows']:,.0f} windows of "
        f"{v['refresh_interval'] * 1e3:g} ms at {v['sync_us_per_window'] / 1e3:.1f} ms of "
        f"synchronisation each (measured on this shared 2-core machine, load average "
        f"{v['load_before']:.1f}) add {p['sync_s'] / 3600:.2f} h, and the coordinator's "
        f"routing of {p['requests'] / 1e6:.0f} M requests {p['routing_s'] / 3600:.2f} h: "
        f"**{p['total_s'] / 3600:.1f} h** in all, against "
        f"{p['one_process_s'] / 3600:.1f} h in one process. The windows' cost decides: at 1 ms "
        f"a window (a round trip between idle nodes) the day takes "
        f"{p['total_1ms_s'] / 3600:.1f} h, with a 500 ms snapshot at the measured cost "
        f"{p['total_500ms_s'] / 3600:.1f} h.\n")


def render_shards(recorded: dict) -> str:
    """docs/cluster.md's table of sharded runs (``recorded``: ``shards.json``'s variants) and
    the day's projection."""
    r = recorded
    lines = ["| replicas | shards | workers | slice | requests | one process (s) | sharded (s) "
             "| speed-up | over its CPU | bound | windows | sync per window "
             "| CPU: one process, each shard (s) | peak RSS (MiB) | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ordered = sorted(r.values(), key=lambda v: (v["replicas"], v["workers"], v["shards"]))
    for v in ordered:
        lines.append(
            f"| {v['replicas']:,} | {v['shards']} | {v['workers']} | {v['hours']:g} h | "
            f"{v['requests']:,} | {v['one_wall_s']:.1f} | {v['wall_s']:.1f} | "
            f"{v['speedup']:.2f}× | {v['one_cpu_s'] / v['wall_s']:.2f}× | "
            f"{shard_bound(v):.2f}× | "
            f"{v['num_windows']:,} | {v['sync_us_per_window'] / 1e3:.2f} "
            f"ms | {v['one_cpu_s']:.1f}; {', '.join(f'{c:.1f}' for c in v['shard_cpu_s'])} | "
            f"{max(v['shard_peak_rss_mib']):.0f} | {v['load_before']:.1f} |")
    largest = max(ordered, key=lambda v: (v["replicas"], v["workers"] == "ray"))
    return "\n".join(lines) + "\n\n" + projection_text(day_projection(largest))
