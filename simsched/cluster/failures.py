"""Replica failures: scheduled (``faults.replica_failures``) or drawn (``faults.mtbf``).

A run with failures routes through a :class:`~simsched.cluster.fleet.Fleet` (an autoscaled run's,
or, for a fixed cluster, one without an autoscaler), whose routing set is what the routers see:
a failed replica leaves it at the failure instant and comes back when restarted, each change
rebuilding the routers' view as a scale event does (a stale snapshot is refreshed then, as a
gateway's health check drops an endpoint).

At a failure of replica ``g`` (:meth:`Failures.fail`):

* its GPU loop stops, the iteration in flight is lost, and every request it holds (running,
  swapped, queued, not yet seen by a plan) ends at once with status ``failed`` and a reason
  naming the replica and the instant; the KV they had computed is wasted work (by replica in
  :attr:`~simsched.cluster.retries.Clients.lost`), their clients see the failure and may retry
  (:mod:`simsched.cluster.retries`);
* its lifecycle (a unit of the fleet's bill) ends; the next unit bills from the failure with
  ``bill_while_down`` (the GPUs stay reserved), else from the end of ``restart_time`` (a new
  machine is taken);
* ``restart_time`` plus ``model_load_time`` later it is back with an empty KV cache (the prefix
  cache lost with the rest, :meth:`~simsched.engine.replica.Replica.restart`) and routable again.

A replica that is draining when it fails (autoscaling removed it) is not restarted; one that is
already down or stopped cannot fail. While every replica is down, attempts fail at once.
"""

from __future__ import annotations

import bisect

import numpy as np

from simsched.cluster.removal import fire
from simsched.config.lifetimes import draw_lifetime, for_pool
from simsched.engine.abort import AbortedWork
from simsched.request import Status
from simsched.workloads.sessions import draw

FAILED = Status.FAILED
DEFAULT_MODEL_LOAD_TIME = ("fixed", 60.0)       # the autoscaler's default
DEFAULT_RESTART_TIME = ("fixed", 30.0)          # a pool a per-pool restart_time does not name
FAILURE_STREAM = 8


def _lost_admissions(replica) -> tuple[set, int]:
    """The requests of the iteration in flight on ``replica`` (lost if it fails now) and the
    prefix-cache hits its admissions counted, which its lost log row would have held."""
    sched = replica.scheduler
    if not replica.kv.prefix_caching or not sched.planned:
        return set(), 0
    log = replica.iteration_rows
    # Rows since the GPU loop last started (a restart counts hits from 0 again).
    rows = memoryview(log.values)[getattr(replica, "restart_row", 0):]
    logged = int(np.frombuffer(rows, dtype=log.dtype)["num_cached_tokens"].sum()) \
        if len(rows) else 0
    return set(sched.planned), max(0, sched.num_cached_tokens - logged)


def scheduled(env, plan, fail):
    """A process failing replica ``g`` (``fail(g)``) at each ``(at, g)`` of ``plan``."""
    for at, g in plan:
        if at > env.now:
            yield env.timeout(at - env.now)
        fail(g)


def failures_frame(rows):
    """One row per failure: replica, when it failed, when it was back (NaN: not within the run)
    and the requests it lost."""
    import pandas as pd

    return pd.DataFrame(rows, columns=["replica", "failed_at", "back_at", "num_failed_requests"])


class Failures:
    """The failures of a run's replicas (see the module docstring); ``fleet`` is the run's
    :class:`~simsched.cluster.fleet.Fleet`, ``clients`` its :class:`~simsched.cluster.retries.
    Clients`."""

    def __init__(self, cluster, fleet, clients, faults, seed: int) -> None:
        self.cluster, self.env, self.fleet, self.clients = cluster, cluster.env, fleet, clients
        self.cfg = faults
        auto = cluster.config.cluster.autoscaling
        self.model_load_time = faults.model_load_time or (
            auto.model_load_time if auto is not None else DEFAULT_MODEL_LOAD_TIME)
        self.rng = np.random.default_rng(np.random.SeedSequence(seed,
                                                                spawn_key=(FAILURE_STREAM,)))
        self.rows: list[tuple] = []         # (replica, failed_at, back_at, num_failed_requests)
        self.restarting: set[int] = set()
        self.back: dict[int, object] = {}   # replica -> event fired when it is back
        if faults.replica_failures:
            self.env.process(scheduled(self.env, faults.replica_failures, self.fail))
        if faults.mtbf is not None:
            for g in range(len(fleet.replicas)):
                self.watch(g)

    def _pool(self, g: int) -> str:
        return self.fleet.pools[self.fleet.pool_of[g]]["name"]

    def watch(self, g: int) -> None:
        """Draw failures of replica ``g`` (with ``mtbf``: its pool's) for the rest of the run."""
        if self.cfg.mtbf is not None:
            mtbf = for_pool(self.cfg.mtbf, self._pool(g))
            if mtbf is not None:        # a pool per-pool mtbf does not name never fails
                self.env.process(self._drawn(g, mtbf))


    def _drawn(self, g: int, mtbf: tuple):
        env, fleet = self.env, self.fleet
        while fleet.state[g] in ("routable", "failed"):
            yield env.timeout(draw_lifetime(mtbf, self.rng))
            back = self.back.get(g)
            if back is not None:
                yield back              # down already (a scheduled failure): wait for it
                continue
            if not self.fail(g):
                return

    # ------------------------------------------------------------------ a failure
    def fail(self, g: int) -> bool:
        """Replica ``g`` fails now; False if it cannot (down, stopped or not yet made)."""
        fleet, env = self.fleet, self.env
        if g >= len(fleet.state) or fleet.state[g] not in ("routable", "draining"):
            return False
        now = env.now
        draining = fleet.state[g] == "draining"
        if not draining:
            old = list(fleet.routable)
            fleet.routable.remove(g)
            if fleet.routable:
                fleet._routing_changed(old)
            else:
                fleet.local[g] = -1         # nobody left to route to: attempts fail at once
        fleet.state[g] = "failed"
        fleet.units[fleet.unit_of[g]][6] = now      # this lifecycle's bill ends
        replica = fleet.replicas[g]
        in_flight, lost_hits = _lost_admissions(replica)
        kept = getattr(self.cluster.requests, "step_ends", None)
        taken = replica.remove_requests(kept(g, replica.iteration_rows) if kept else None)
        fleet.kv_use[g] = 0.0
        clients, reason = self.clients, f"failed: replica {g} failed at t={now:g} s"
        # Aborts during the iteration the failure cut short counted its tokens as computed.
        logged = len(replica.iteration_rows.values)
        for at, work in replica.in_flight_aborts:
            if at == logged:
                clients.took_back(g, work)
        replica.in_flight_aborts.clear()
        for req, handles, dropped in taken:
            if lost_hits and req.id in in_flight:
                # Admitted by the lost iteration: its prefix-cache hits were never logged.
                took = min(lost_hits, dropped)
                dropped -= took
                lost_hits -= took
            decode = min(dropped, max(0, req.num_generated - 1))
            hits = req.num_cached_tokens if req.num_preemptions == 0 else 0
            clients.wasted[req.id] = AbortedWork(dropped, max(0, dropped - decode - hits),
                                                 decode)
            if dropped:
                clients.lost[g] = clients.lost.get(g, 0) + dropped
            req.status = FAILED
            req.reject_reason = reason
            fire(handles[2])
        row = [g, now, np.nan, len(taken)]
        self.rows.append(row)
        if draining:
            fleet.state[g] = "stopped"      # it was being removed: it stays down
            return True
        restart_time = for_pool(self.cfg.restart_time, self._pool(g), DEFAULT_RESTART_TIME)
        restart = float(draw(restart_time, self.rng, 1, False)[0])
        load = float(draw(self.model_load_time, self.rng, 1, False)[0])
        unit = len(fleet.units)
        billed_from = now if self.cfg.bill_while_down else now + restart
        pool = fleet.pool_of[g]
        fleet.units.append([unit, pool, g, billed_from, np.nan, np.nan, np.nan,
                            fleet.pools[pool]["price_per_hour"]])
        fleet.unit_of[g] = unit
        self.restarting.add(g)
        self.back[g] = env.event()
        env.process(self._restart(g, restart + load, row))
        return True

    def _restart(self, g: int, delay: float, row: list):
        yield self.env.timeout(delay)
        fleet, now = self.fleet, self.env.now
        fleet.replicas[g].restart()
        fleet.units[fleet.unit_of[g]][4] = now
        fleet.state[g] = "routable"
        self.restarting.discard(g)
        old = list(fleet.routable)
        bisect.insort(fleet.routable, g)
        fleet._routing_changed(old)
        row[2] = now
        self.back.pop(g).succeed()

    def frame(self):
        """One row per failure (see :func:`failures_frame`)."""
        return failures_frame(self.rows)
