"""A sharded run: one cluster's replicas split across shards, advanced window by window.

``simulate(config, shards=N)`` splits the replicas into ``N`` contiguous groups, each a
:class:`~simsched.cluster.shard.Shard` in a worker process (or a Ray actor, or, for tests, in
this process). :class:`ShardedCluster` is the coordinator: it owns the arrivals, the router
and the router's snapshot of the replicas' load, and replays the one-process run's own order
of arrivals and snapshot refreshes (two chains of NORMAL-priority events: the arrival event
rescheduled at each new arrival time and the refresh timeout every ``refresh_interval``; at a
tie the one scheduled first goes first, as SimPy orders them). Each refresh whose snapshot a
routing decision will read is a synchronisation: every shard gets the requests routed to its
replicas since the last one and runs to the refresh time, then reports its replicas' load there;
the coordinator copies it into the snapshot and routes on. Between two refreshes a router reads
only the snapshot and its own state, so nothing else crosses shards, and the run is the
one-process run, request for request and bit for bit, for any number of shards
(:mod:`simsched.cluster.shard` says why a shard replays its replicas exactly).

What cannot be exact this way is refused by :func:`check_shardable`, naming the field.
"""

from __future__ import annotations

import math
import time
from array import array
from types import SimpleNamespace

from simsched.cluster.cluster import _long_lived_requests
from simsched.cluster.routers import make_router
from simsched.cluster.specs import router_rng
from simsched.cluster.state import ReplicaLoad, Snapshot, TokenBucket
from simsched.engine.log import IterationLog
from simsched.request import Status

__all__ = ["SHARDABLE_ROUTERS", "ShardedCluster", "check_shardable", "partition"]

# Routers whose choice reads only the snapshot's load figures and their own state (True: reads
# the snapshot; False: never, so no window needs a synchronisation). Cache- and session-aware
# routers ask the live replicas' caches, llm-d's picker counts each request's completion.
SHARDABLE_ROUTERS = {"round_robin": False, "random": False, "jsq": True, "least_tokens": True,
                     "least_kv": True, "power_of_two": True, "weighted": True}


def check_shardable(config, shards) -> None:
    """Raise ValueError, naming the field and why, if ``config`` cannot run in ``shards``
    shards with the one-process run's results."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be an integer >= 1, got {shards!r}")
    cl = config.cluster
    if cl.num_replicas < 2:
        raise ValueError(f"shards: a sharded run splits a cluster's replicas; num_replicas is "
                         f"{cl.num_replicas} (needs at least 2)")
    if shards > cl.num_replicas:
        raise ValueError(f"shards={shards} exceeds num_replicas={cl.num_replicas} (each shard "
                         "runs at least one replica)")
    refused = []
    if cl.refresh_interval <= 0:
        refused.append("cluster.refresh_interval is 0: the router reads every replica's exact "
                       "state at each arrival, so shards would have to synchronise at every "
                       "arrival; give a snapshot interval > 0 (the window of a sharded run)")
    if cl.router not in SHARDABLE_ROUTERS:
        refused.append(f"cluster.router {cl.router!r} reads more than the load snapshot (live "
                       "caches, sessions or per-request completions); shardable routers: "
                       f"{sorted(SHARDABLE_ROUTERS)}")
    if cl.max_num_queued_per_replica is not None:
        refused.append("cluster.max_num_queued_per_replica reads each replica's live queue at "
                       "every arrival")
    if cl.disaggregated:
        refused.append("disaggregated prefill/decode (cluster.roles or num_prefill_replicas) "
                       "moves requests between replicas within a window")
    if cl.kv_remote_tier is not None:
        refused.append("cluster.kv_remote_tier is one KV store every replica shares")
    if cl.autoscaling is not None:
        refused.append("cluster.autoscaling changes the replica set from fleet-wide metrics")
    if config.faults.enabled:
        refused.append("faults (timeouts, retries, hedges, replica failures) move requests "
                       "between replicas within a window")
    if getattr(config.cache, "kv_tiers", None) is not None:
        refused.append("cache.kv_tiers is not supported in sharded runs yet")
    if config.check_invariants:
        refused.append("check_invariants reads every replica and request object in one process")
    if not config.client.is_open:
        refused.append("client: a benchmark client's next request waits on earlier ones' "
                       "completions (closed loop)")
    if refused:
        raise ValueError("shards: cannot shard this run exactly: " + "; ".join(refused))


def partition(num_replicas: int, shards: int) -> list[range]:
    """Replicas ``0..num_replicas-1`` dealt to ``shards`` groups in turn (shard ``s`` serves
    ``s, s + shards, ...``): load routers break ties towards low indices, so contiguous groups
    would give the first shard most of an underloaded fleet's work."""
    return [range(s, num_replicas, shards) for s in range(shards)]


class _Stats:
    """A shard's speculation counters, as ``merge_stats`` reads a scheduler's."""

    def __init__(self, values: dict) -> None:
        self.values = values
        self.num_accepted_tokens = values["num_accepted_tokens"]

    def as_dict(self) -> dict:
        return self.values


_NOTHING_LOGGED = SimpleNamespace(iteration_rows=IterationLog())


def _finished_replica(part: dict):
    """What the run's frames read of a replica after its shard ended (its log rebuilt)."""
    columns, values, runs, num_run_rows = part["log"]
    log = IterationLog(columns)
    log.values, log.runs, log.num_run_rows = bytearray(values), bytearray(runs), num_run_rows
    stats = part["spec_stats"]
    return SimpleNamespace(
        index=part["index"], iteration_rows=log, num_waiting=part["num_waiting"],
        scheduler=SimpleNamespace(running=range(part["num_running"]),
                                  spec_stats=_Stats(stats) if stats is not None else None),
        kv=SimpleNamespace(num_used=part["kv_used"]))


class ShardedCluster:
    """The coordinator of a sharded run, with the surface of a finished
    :class:`~simsched.cluster.cluster.Cluster` that :func:`simsched.analysis.runner.run` reads.

    ``requests`` is a :class:`~simsched.cluster.lazy.LazyRequests` (plain requests); ``open_shards
    (groups, reads_kv, output_tokens)`` starts one shard per group of replica indices and returns
    their handles (``advance(at)``, ``send(until, batch)``, ``receive()``, ``finish()``,
    ``close()``; :mod:`simsched.analysis.shard_workers`).
    """

    fleet = disagg = clients = failures = autoscaler = link_faults = None

    def __init__(self, config, requests, shards: int, open_shards, specs: list) -> None:
        check_shardable(config, shards)
        self.config = config
        self.requests = requests
        cl = config.cluster
        n = cl.num_replicas
        # The router and its rng as the one-process run makes them (simsched.cluster.cluster).
        self.router = make_router(cl.router, cl.router_options, n, router_rng(config.seed))
        self.load = ReplicaLoad([None] * n, (), getattr(self.router, "output_tokens", None))
        self.view = Snapshot(self.load)
        self.bucket = TokenBucket(cl.rate_limit, cl.burst) if cl.rate_limit is not None else None
        self.groups = partition(n, shards)
        self.shard_of = [0] * n
        for s, group in enumerate(self.groups):
            for i in group:
                self.shard_of[i] = s
        self.replica_of = array("i", [-1]) * len(requests)
        self.num_arrived = self.num_events = self.num_shed = 0
        self.env = SimpleNamespace(now=0.0)
        self.specs = specs
        # Until the shards hand theirs over, replicas that logged nothing here (a streamed
        # run's store writes the coordinator's shed requests with them).
        self.replicas: list = [_NOTHING_LOGGED] * n
        self.max_routed = -1
        self.handles = open_shards(self.groups, self.router.reads_kv,
                                   getattr(self.router, "output_tokens", None))
        # Figures of the synchronisation (benchmarks.fleet_day prints them).
        self.num_windows = 0
        self.window_time = 0.0          # coordinator wall time from sending a window to its loads
        self.shard_time = 0.0           # the slowest shard's work on each window, summed
        self.shard_window_time = 0.0    # of which after the window was sent (its slowest)
        self.ahead_time = 0.0           # and before, while this routed it (Shard.advance)
        self.route_time = 0.0
        self.shard_busy_time: list[float] = []     # per shard: wall seconds in its windows
        self.shard_cpu_time: list[float] = []      # per shard: CPU seconds in its windows
        self.shard_peak_rss_mib: list[float] = []  # per shard: its process's peak RSS

    def figures(self) -> dict:
        """The synchronisation's figures (``Results.info["sharding"]``): windows synchronised,
        the coordinator's wall seconds waiting on them and routing, the slowest shard's work per
        window summed (a bound on the wall time) and of it the head starts the shards ran while
        the coordinator routed, each shard's busy wall and CPU seconds, and the cost per window
        beyond the slowest shard's work in it after it was sent."""
        return {"shards": len(self.groups), "num_windows": self.num_windows,
                "window_time": self.window_time, "slowest_shard_time": self.shard_time,
                "ahead_time": self.ahead_time,
                "sync_time_per_window": (self.window_time - self.shard_window_time)
                / max(self.num_windows, 1),
                "route_time": self.route_time, "shard_busy_time": self.shard_busy_time,
                "shard_cpu_time": self.shard_cpu_time,
                "shard_peak_rss_mib": self.shard_peak_rss_mib}

    def run(self) -> None:
        """Route every arrival, advance the shards window by window, then collect them."""
        try:
            with _long_lived_requests():        # (a shard may run in this process)
                self._run()
        finally:
            for handle in self.handles:
                handle.close()

    def _run(self) -> None:
        interval = self.config.cluster.refresh_interval
        reads_view = SHARDABLE_ROUTERS[self.config.cluster.router]
        requests = self.requests
        total = len(requests)
        arrivals = iter(requests)
        nxt = next(arrivals, None)
        outbox = [self._empty() for _ in self.handles]
        # The two chains' next events as (time, order scheduled). At time 0 the refresh
        # process starts first (it is made before the arrivals' event) and schedules its
        # first timeout; then the arrival event handles every arrival at or before 0.
        order = 0
        refresh = (interval, order) if total else None
        last_refresh = 0.0
        started = time.perf_counter()
        nxt = self._arrive(0.0, nxt, arrivals, outbox)
        order += 1
        arrival = (nxt.arrival_at, order) if nxt is not None else None
        limit = self.config.max_sim_time
        # (env.run(until=limit) processes every event before the limit, none at it.)
        if arrival is not None and arrival[0] >= limit:
            arrival = None
        while arrival is not None or refresh is not None:
            if refresh is not None and refresh[0] >= limit:
                refresh = None
                continue
            if arrival is not None and (refresh is None or arrival < refresh):
                nxt = self._arrive(arrival[0], nxt, arrivals, outbox)
                order += 1
                arrival = (nxt.arrival_at, order) if nxt is not None \
                    and nxt.arrival_at < limit else None
                continue
            t = refresh[0]
            last_refresh = t
            # The snapshot matters only if an arrival is routed before the next refresh.
            if reads_view and arrival is not None and arrival[0] <= t + interval:
                self.route_time += time.perf_counter() - started
                self._synchronise(t, outbox)
                if arrival[0] > t:
                    # Nothing before the next arrival needs routing: the shards run to it
                    # while this routes the window (Shard.advance).
                    for handle in self.handles:
                        handle.advance(arrival[0])
                started = time.perf_counter()
            if self.num_arrived < total:
                order += 1
                refresh = (t + interval, order)
            else:
                refresh = None
        self.route_time += time.perf_counter() - started
        finite = not math.isinf(limit)
        for handle, batch in zip(self.handles, outbox):
            handle.send(limit if finite else None, batch, finite)
        for handle in self.handles:
            handle.receive()
        now = limit if finite else last_refresh
        replicas = []
        for handle in self.handles:
            part = handle.finish()
            now = max(now, part["now"])
            self.num_events += part["num_events"]
            if "records" in part:
                requests.records.absorb(part["records"])
            else:               # streamed: the shard wrote its requests; its window sums
                for w, sums in part["windows"].items():
                    requests.windows[w] = requests.windows.get(w, 0) + sums
                requests.created(self.max_routed + 1)
            replicas.extend(_finished_replica(r) for r in part["replicas"])
            self.shard_busy_time.append(part["busy_time"])
            self.shard_cpu_time.append(part["cpu_time"])
            self.shard_peak_rss_mib.append(part["peak_rss_mib"])
        self.replicas = sorted(replicas, key=lambda r: r.index)
        self.env.now = now

    @staticmethod
    def _empty() -> tuple:
        return ([], [], [], [], [], [], [])

    def _arrive(self, now: float, req, arrivals, outbox):
        """The arrival event at ``now``: route every request arriving by then (in id order);
        the next request to arrive later."""
        live, record = self.requests.live, self.requests.record
        choose, view, bucket = self.router.choose, self.view, self.bucket
        owners, shard_of = self.replica_of, self.shard_of
        while req is not None and req.arrival_at <= now:
            self.num_arrived += 1
            if bucket is not None and not bucket.take(now):
                self._shed(req, f"shed: rate limit of {bucket.rate:g} requests/s exceeded")
                record(req)
            else:
                i = choose(view, req)
                owners[req.id] = i
                batch = outbox[shard_of[i]]
                batch[0].append(req.id)
                batch[1].append(req.arrival_at)
                batch[2].append(req.num_prompt_tokens)
                batch[3].append(req.num_output_tokens)
                batch[4].append(req.priority)
                batch[5].append(req.tenant)
                batch[6].append(i)
                del live[req.id]            # its shard makes, serves and records it
                self.max_routed = req.id
            req = next(arrivals, None)
        return req

    def _shed(self, req, reason: str) -> None:
        req.status = Status.REJECTED
        req.reject_reason = reason
        self.num_shed += 1

    def _synchronise(self, t: float, outbox: list) -> None:
        """Run every shard to the refresh at ``t`` and copy their load into the snapshot."""
        started = time.perf_counter()
        for s, handle in enumerate(self.handles):
            handle.send(t, outbox[s])
            outbox[s] = self._empty()
        load, slowest, in_window, ahead = self.load, 0.0, 0.0, 0.0
        for group, handle in zip(self.groups, self.handles):
            outstanding, tokens, kv_use, elapsed, head_start = handle.receive()
            slowest = max(slowest, elapsed + head_start)
            in_window = max(in_window, elapsed)
            ahead = max(ahead, head_start)
            where = slice(group.start, group.stop, group.step)
            load.outstanding[where] = outstanding
            load.tokens[where] = tokens
            load.kv_use[where] = kv_use
        load.total_outstanding = sum(load.outstanding)
        self.view.refresh(t)
        self.num_windows += 1
        self.window_time += time.perf_counter() - started
        self.shard_time += slowest
        self.shard_window_time += in_window
        self.ahead_time += ahead
