"""One shard of a sharded run: some of a cluster's replicas on a clock of their own.

A sharded run (:mod:`simsched.cluster.shards`) splits a cluster's replicas across shards; a
coordinator keeps the arrivals, the router and its snapshot of the replicas' load, and advances
every shard window by window. A :class:`Shard` is the SimPy side of one: its replicas (the same
:class:`~simsched.engine.replica.Replica` objects, each with the random stream it has in the
one-process run) and their requests' processes, on its own ``simpy.Environment``.

Why a shard replays its replicas exactly as the one-process run does:

* A replica's events depend only on its own requests (their times and sizes) and its own random
  stream; what it shares with other replicas in one process (the load counters, the request
  records) is only added to, in any order. Events of different replicas at one instant touch
  disjoint state, so the order SimPy gives them does not matter (the same argument makes quiet
  decode steps exact: :mod:`simsched.engine.scheduler.quiet`).
* The GPU loop moves the clock itself only when no event is due before its iteration ends; a
  shard's heap always holds every event of its replicas up to the window's end (the arrivals of
  the window, and a barrier at its end), so a loop never moves past an arrival it will receive.
* In the one-process run the router's snapshot is taken by a NORMAL-priority timeout at
  ``t_k``: after every event before ``t_k`` and the arrivals at ``t_k`` processed before it,
  before every iteration end at ``t_k`` (LATE priority: :mod:`simsched.engine.simpy_fast`). A
  replica's load changes only in its arrivals (routing) and in LATE events (first tokens,
  completions, KV use), so the shard stops at a barrier of priority between NORMAL and LATE at
  ``t_k`` and reports its load there: the figures the snapshot copied. Arrivals at ``t_k``
  routed after the snapshot come with the next window and are started at once (URGENT at
  ``t_k``), still before the instant's LATE events, as in one process.
"""

from __future__ import annotations

import math
import sys
import time
from array import array

import simpy

from simsched.cluster.lazy import LazyRequests
from simsched.cluster.records import RequestRecords
from simsched.cluster.specs import replica_rng
from simsched.cluster.state import ReplicaLoad
from simsched.engine.replica import Replica
from simsched.engine.scheduler.quiet import MAX_QUIET_STEPS
from simsched.engine.simpy_fast import Arrivals, draw_event_id, event_at, request_starter
from simsched.engine.simpy_fast import run as run_events
from simsched.engine.simpy_fast import run_until
from simsched.request import Request

__all__ = ["BARRIER", "STOP", "Shard"]

# A window's end: after every URGENT (0) and NORMAL (1) event of its instant, before LATE (2).
BARRIER = 1.5
# The end of a run with a time limit: before every event of its instant, as the stop event of
# ``env.run(until=...)`` (URGENT, scheduled before any other event at that time).
STOP = -1


class _Records(LazyRequests):
    """A shard's request store: the requests it served, recorded by id into arrays sized for
    the whole run (:class:`~simsched.cluster.lazy.LazyRequests`' batching, no workload columns:
    requests come window by window)."""

    def __init__(self, n: int) -> None:         # (LazyRequests' columns are the coordinator's)
        self.n = n
        self.live: dict[int, Request] = {}
        self._done: list[Request] = []
        self.records = RequestRecords(n)


def _peak_rss_mib() -> float:
    """This process's peak resident memory, MiB (0 where the platform does not say)."""
    try:
        import resource
    except ImportError:             # not on every platform
        return 0.0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


class Shard:
    """Replicas ``indices`` (a ``range``) of ``config``'s cluster on a clock of their own.

    ``specs`` are the replicas' :class:`~simsched.cluster.specs.ReplicaSpec` (by index);
    ``num_requests`` the run's request count (records are kept by request id); ``reads_kv``
    and ``output_tokens`` mirror the run's router (the replicas report KV use only if it reads
    it; the load counts that many output tokens per request, None: the true length).
    """

    def __init__(self, config, indices, specs: dict, num_requests: int, reads_kv: bool,
                 output_tokens: int | None, store=None) -> None:
        self.env = env = simpy.Environment()
        self.indices = list(indices)
        # Where its replicas' figures sit among the cluster's (every ``step``-th from ``start``).
        self._mine = slice(indices.start, indices.stop, indices.step)
        self.replicas = {
            i: Replica(env, specs[i].config, specs[i].cost_model, specs[i].num_blocks,
                       specs[i].max_model_len, replica_rng(config.seed, i), index=i)
            for i in self.indices}
        n = max(self.indices) + 1
        self.load = ReplicaLoad([None] * n, (), output_tokens)
        for replica in self.replicas.values():
            replica.on_first_token = self.load.first_token
            if reads_kv:
                replica.on_kv = self.load.kv_changed
            if math.isinf(config.max_sim_time):
                # As in one process: nothing outside a replica reads it between its events.
                replica.allow_quiet_steps(MAX_QUIET_STEPS)
        # Where ended requests go: arrays returned at the end, or a stream's parts (``store``:
        # a simsched.analysis.shard_workers.ShardStream, bound to this shard, which then keeps
        # each request's replica, as a streamed run's frames need it).
        self.store = store if store is not None else _Records(num_requests)
        self.replica_of = array("i", [-1]) * num_requests if store is not None else None
        self.served = array("q")            # request ids sent here (kept only to export them)
        self._to: dict[int, Replica] = {}
        self._start = request_starter(env, self._request, self.store.record)
        self.num_events = 0
        self.busy_time = 0.0        # wall seconds spent running windows
        self.cpu_time = 0.0         # and this process's CPU seconds meanwhile
        self._arrivals_eid = None   # drawn by :meth:`advance` for the window's arrivals
        self._ahead_time = 0.0      # wall seconds :meth:`advance` ran of the coming window

    def advance(self, at: float) -> None:
        """Run the coming window up to ``at`` (every event before it, none at it) before its
        requests come: ``at`` is the window's first arrival, so nothing before it needs them,
        and a worker does this while the coordinator routes. The event id the window's arrival
        event would have drawn at the window's start is drawn here, where the window starts, so
        that event is ordered among the instant's events as without the head start."""
        started = time.perf_counter()
        cpu_started = time.process_time()
        env = self.env
        self._arrivals_eid = draw_event_id(env)
        run_until(env, event_at(env, at, STOP))
        elapsed = time.perf_counter() - started
        self._ahead_time += elapsed
        self.busy_time += elapsed
        self.cpu_time += time.process_time() - cpu_started

    def window(self, until: float | None, batch, last: bool = False) -> tuple:
        """Start ``batch``'s requests at their times and run to the barrier at ``until`` (None:
        to the end of the work; ``last``: ``until`` is the run's time limit); the load of each
        replica there, as lists in ``indices`` order: requests outstanding, tokens outstanding,
        KV use;

        ``batch`` is ``(ids, arrival times, prompt, output, priority, tenant, replica)`` lists,
        in arrival order (ids ascending within an instant), all at or after the clock (after
        :meth:`advance`, at or after its ``at``); then the wall seconds of the window and of its
        head start (:meth:`advance`)."""
        started, cpu_started = time.perf_counter(), time.process_time()
        env = self.env
        ids = batch[0]
        if ids:
            replicas, to, live = self.replicas, self._to, self.store.live
            reqs = []
            for rid, a, p, o, pr, t, i in zip(*batch):
                req = live[rid] = Request(rid, a, p, o, pr, t)
                reqs.append(req)
                to[rid] = replicas[i]
            if self.replica_of is None:
                self.served.extend(ids)
            else:
                owners = self.replica_of
                for rid, i in zip(ids, batch[6]):
                    owners[rid] = i
            Arrivals(env, reqs, self._start, self._arrivals_eid)
        if until is None:
            run_events(env)
        else:
            # Absolute time, as the coordinator's refresh times are (now + delay can miss it).
            run_until(env, event_at(env, until, STOP if last else BARRIER))
        self._arrivals_eid = None
        load = self.load
        mine = self._mine
        elapsed = time.perf_counter() - started
        self.busy_time += elapsed
        self.cpu_time += time.process_time() - cpu_started
        ahead, self._ahead_time = self._ahead_time, 0.0
        return load.outstanding[mine], load.tokens[mine], load.kv_use[mine], elapsed, ahead

    def _request(self, req: Request, record, process, done, now):
        """A request's life on its replica (``Cluster._request`` after routing)."""
        replica = self._to.pop(req.id)
        i = replica.index
        if replica.add(req, (process, None, done), now):
            self.load.routed(i, req)
            while True:
                try:
                    yield done
                    break
                except simpy.Interrupt as interrupt:
                    req.note_preemption(interrupt.cause)
                    self.num_events += 1
            self.num_events += 1
            self.load.finished(i, req)
        record(req)

    def finish(self) -> dict:
        """After the last window: close the replicas and hand over what the run's frames need
        (request records by id, each replica's iteration log and end state)."""
        for i in self.indices:
            self.replicas[i].scheduler.close()
        if self.replica_of is not None:
            self.store.finish()         # the requests in flight as they stand, the logs left
        replicas = []
        for i in self.indices:
            replica = self.replicas[i]
            log = replica.iteration_rows
            stats = getattr(replica.scheduler, "spec_stats", None)
            replicas.append({
                "index": i, "log": (log.columns, bytes(log.values), bytes(log.runs),
                                    log.num_run_rows),
                "num_waiting": replica.num_waiting, "num_running": len(replica.scheduler.running),
                "kv_used": replica.kv.num_used,
                "spec_stats": stats.as_dict() if stats is not None else None})
            replica.iteration_rows = None
        store = self.store
        out = {"now": self.env.now, "num_events": self.num_events, "replicas": replicas,
               "busy_time": self.busy_time, "cpu_time": self.cpu_time,
               "peak_rss_mib": _peak_rss_mib()}
        if self.replica_of is not None:
            out["windows"] = store.windows
            return out
        store._flush(final=True)
        store._done.extend(store.live.values())
        store._flush(final=True)
        out["records"] = store.records.export(sorted(self.served))
        return out
