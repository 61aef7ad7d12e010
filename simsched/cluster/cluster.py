"""The SimPy side of a run: one clock, arrivals, one process per request, replicas.

Each request's process starts at its arrival time (:class:`simsched.engine.simpy_fast.Arrivals`),
hands the
request to a replica and then sleeps until its completion, receiving preemption interrupts from
the replica's GPU loop (:mod:`simsched.engine.replica`) in between. Its first token wakes
nobody: the replica tells the router's load tracking directly.

With several replicas (or admission control) the request process first passes the router's
admission control (a token bucket, then the chosen replica's queue cap; a shed request is
rejected with a ``shed: ...`` reason), asks the router (:mod:`simsched.cluster.routers`) for a
replica, and keeps the per-replica load (:mod:`simsched.cluster.state`) up to date on routing
and completion (the replica reports first tokens). A cluster of one replica without admission
control runs exactly the single-engine code path, so its results are bit-identical to a single
engine's.

Arrival times are kept exactly as given: each arrival is scheduled at its absolute time (the
clock lands on ``arrival_at`` itself, never one ulp off), so requests given the same time are
simultaneous and queue in request-id order. A replica forms a batch only after every event of
that instant, so an arrival at the instant a batch is formed joins it (see
:mod:`simsched.engine.replica`).
"""

from __future__ import annotations

import gc
import math
from array import array
from contextlib import contextmanager

import numpy as np
import simpy

from simsched.cluster import fleet
from simsched.cluster.autoscaler import Autoscaler
from simsched.cluster.disagg import Disagg, disagg_request
from simsched.cluster.flow import FlowGate
from simsched.cluster.routers import make_router
# The replicas' specs and random streams live in simsched.cluster.specs (no SimPy there); they
# are re-exported here, where callers have always imported them.
from simsched.cluster.specs import ReplicaSpec, replica_rng, replica_specs, router_rng
from simsched.cluster.state import PrefixHolders, ReplicaLoad, Snapshot, TokenBucket
from simsched.engine.invariants import check_invariants
from simsched.engine.kv.tiers import share_remote_tier
from simsched.cluster.clients import run_client
from simsched.cluster.disagg_failures import DisaggFailures
from simsched.cluster.failures import Failures
from simsched.cluster.links import LinkFaults
from simsched.cluster.retries import Clients
from simsched.cluster.sessions import run_sessions
from simsched.cluster.work_end import WorkEnd
from simsched.engine.scheduler.quiet import MAX_QUIET_STEPS
from simsched.engine.replica import Replica, SimulationError
from simsched.engine.simpy_fast import Arrivals, done_event, request_starter
from simsched.engine.simpy_fast import run as run_events
from simsched.request import Request, Status

__all__ = ["Cluster", "ReplicaSpec", "SimulationError", "replica_rng", "replica_specs"]


class _Views:
    """Several snapshots refreshed together (a disaggregated cluster's two pools)."""

    def __init__(self, views) -> None:
        self.views = views

    def refresh(self, now: float) -> None:
        for view in self.views:
            view.refresh(now)


class Cluster:
    """Runs one simulation over a list of requests sorted by arrival time (ids 0..n-1).

    ``specs`` (see :func:`replica_specs`) describe the replicas. Without them
    ``replica_specs(config, cost_model, num_blocks, max_model_len)`` builds them (here
    ``max_model_len`` defaults to None: no limit). ``rng``, if given, is replica 0's Generator.
    ``replica_of[request id]`` is the replica a request was routed to (-1: shed), or None when
    a single replica served everything. ``sessions``
    (:class:`~simsched.cluster.sessions.SessionPlan` list) adds closed-loop sessions: their
    turns are created as they arrive and appended to ``requests``. ``client``
    (:class:`~simsched.cluster.clients.ClientPlan`) adds a benchmark client: it creates its
    requests as it sends them and appends them to ``requests`` (which then starts empty).
    """

    def __init__(self, config, requests: list[Request], cost_model=None,
                 num_blocks: int | None = None, max_model_len: int | None = None,
                 rng: np.random.Generator | None = None,
                 specs: list[ReplicaSpec] | None = None, sessions: list | None = None,
                 client=None) -> None:
        self.config = config
        self.env = simpy.Environment()
        if specs is None:
            specs = replica_specs(config, cost_model, num_blocks, max_model_len)
        self.specs = specs      # an autoscaled fleet appends its new replicas' specs
        if config.cluster.autoscaling is not None:
            limit = None if specs[0].max_model_len is None else "hardware"
            pools, pool_of = fleet.prepare(
                config, specs, lambda rcfg: replica_specs(rcfg, None, None, limit)[0])
        self.on_iteration = check = self._check if config.check_invariants else None
        self.replicas = [
            Replica(self.env, spec.config, spec.cost_model, spec.num_blocks, spec.max_model_len,
                    rng if i == 0 and rng is not None else replica_rng(config.seed, i),
                    index=i, on_iteration=check)
            for i, spec in enumerate(specs)]
        self.remote_tier = None         # a KV store all replicas share (replicas added later too)
        if config.cluster.kv_remote_tier is not None:
            self.remote_tier = share_remote_tier([r.kv for r in self.replicas],
                                                 config.cluster.kv_remote_tier)
        self.requests = requests
        self.num_arrived = 0
        self.num_events = 0             # request-process wake-ups, for the events benchmark
        self.num_shed = 0
        self.replica_of: array | None = None
        self.load: ReplicaLoad | None = None     # per-replica load, when requests are routed
        self.router = None              # set with routing (a fleet sets its own)
        self._admit = None              # a router's own admission control (set with routing)
        self.flow = None                # llm-d's flow control (simsched.cluster.flow)
        cl = config.cluster
        self.disagg = self.fleet = self.autoscaler = self.work_end = None
        # Client deadlines, cancellations, retries (simsched.cluster.retries): they replace
        # each request's life, before anything wraps it.
        faults = config.faults
        # (In a disaggregated pool replicas fail without clients: simsched.cluster.
        # disagg_failures.)
        self.clients = Clients(self, faults, config.seed) \
            if faults.clients or (faults.replicas and not cl.disaggregated) else None
        # Called with each replica an autoscaled fleet adds, before its GPU loop first runs
        # (a step recorder must wrap its scheduler by then: simsched.engine.steps).
        self.on_replica_added = None
        if cl.autoscaling is not None:
            self.fleet = fleet.Fleet(self, pools, pool_of, router_rng(config.seed),
                                     np.random.default_rng(
                                         np.random.SeedSequence(config.seed, spawn_key=(4,))))
            self.autoscaler = Autoscaler(self.fleet)
            # The run, its bill and its timeline end with the work, not with a provisioning
            # timer or the autoscaler's next sample (simsched.cluster.work_end).
            self.work_end = WorkEnd(self, self.autoscaler.close)
        elif faults.replicas and not cl.disaggregated:
            # Failing replicas leave and rejoin the routing set: a fleet's (no autoscaler).
            self.fleet = fleet.fixed_fleet(self, router_rng(config.seed))
        elif cl.disaggregated:
            self._setup_disagg(cl)
        elif len(self.replicas) > 1 or cl.max_num_queued_per_replica is not None \
                or cl.rate_limit is not None:
            self._setup_routing(cl)
        self.failures = None
        if faults.replicas and self.disagg is not None:
            self.failures = DisaggFailures(self, faults, config.seed)
        elif faults.replicas:
            self.failures = self.fleet.failures = Failures(self, self.fleet, self.clients,
                                                           faults, config.seed)
        # Degraded links (simsched.cluster.links): the disaggregated links and the remote tier.
        self.link_faults = LinkFaults(self, faults, config.seed) if faults.links else None
        if (self.link_faults is not None or self.failures is not None) \
                and self.work_end is None:
            self.work_end = WorkEnd(self)   # drawn events go on: end with the work
        if self.clients is not None and self.work_end is None:
            # Timers of attempts that ended early stay on the clock: the run ends with the
            # work (simsched.cluster.work_end), not when the last stale timer fires.
            self.work_end = WorkEnd(self, settle=True)
        if self.clients is not None:
            self.work_end.settle = True
            for replica in self.replicas:
                replica.on_idle = self.work_end.idle
        # Requests created at arrival (simsched.cluster.lazy) are recorded when done. (Retries
        # are appended to the request list as they are sent: arrivals walk a copy.)
        Arrivals(self.env, self.requests if self.clients is None else list(self.requests),
                 request_starter(
            self.env, self._request, getattr(self.requests, "record", None)))
        if sessions:
            if self.work_end is not None:
                self.work_end.sessions_left = len(sessions)
            self.env.process(run_sessions(self, sessions))
        self.client = client
        if client is not None:
            self.env.process(run_client(self, client))
        # Only a replica's loop and arrivals reach its queues (no fleet, P/D, tier, client, fault).
        alone = self.fleet is None and self.disagg is None and client is None \
            and self.remote_tier is None and not faults.enabled
        if alone and not sessions and math.isinf(config.max_sim_time):
            # Nothing outside a replica reads its state or reaches it between arrivals: quiet
            # decode steps may share one clock event (simsched.engine.scheduler.quiet).
            for replica in self.replicas:
                replica.allow_quiet_steps(MAX_QUIET_STEPS)
        if alone and getattr(self.router, "watches_queues", False) and self.view is self.load:
            # A router reading the waiting gauges live recounts only the replicas that report
            # a change (epp.gauges).
            changed = self.load.queue_changed = set(range(len(self.replicas)))
            for replica in self.replicas:
                replica.on_queue = changed.add
            self.router.verify_queues = config.check_invariants

    def replica_rng(self, index: int) -> np.random.Generator:
        """Replica ``index``'s Generator (a replica added during the run asks for its own)."""
        return replica_rng(self.config.seed, index)

    def _setup_routing(self, cl) -> None:
        n = len(self.replicas)
        self.replica_of = array("i", [-1]) * len(self.requests)
        self.router = make_router(cl.router, cl.router_options, n, router_rng(self.config.seed)) \
            if n > 1 else None
        if getattr(self.router, "handler", None) is not None:
            raise ValueError(f"router_options.config: llm-d's {self.router.handler.TYPE} needs a "
                             "disaggregated cluster (cluster.roles or num_prefill_replicas)")
        needs = self.router.needs if self.router is not None else ()
        self.load = ReplicaLoad(self.replicas, needs,
                                getattr(self.router, "output_tokens", None))
        if getattr(self.router, "uses_prefix_index", False):
            self.load.prefix_holders = PrefixHolders.attach(self.replicas)
        if self.router is not None and self.router.reads_kv:
            for replica in self.replicas:
                replica.on_kv = self.load.kv_changed
        for replica in self.replicas:
            replica.on_first_token = self.load.first_token
        self.view = self.load
        if n > 1 and cl.refresh_interval > 0:
            self.view = Snapshot(self.load)
            self.env.process(self._refresh(cl.refresh_interval))
        self._choose = self.router.choose if self.router is not None else _first
        # A router that sheds requests itself (llm-d's admission control).
        self._admit = getattr(self.router, "admit", None)
        # (It looks only at requests below this priority: the others skip the call.)
        self._admit_below = getattr(self.router, "admits_below_priority", math.inf)
        if getattr(self.router, "flow_control", None) is not None:
            self.flow = FlowGate(self, self.router)
        self.bucket = TokenBucket(cl.rate_limit, cl.burst) if cl.rate_limit is not None else None
        self.queue_cap = cl.max_num_queued_per_replica

    def _setup_disagg(self, cl) -> None:
        self.replica_of = array("i", [-1]) * len(self.requests)
        self.disagg = Disagg(self, cl, router_rng(self.config.seed))
        self.bucket = TokenBucket(cl.rate_limit, cl.burst) if cl.rate_limit is not None else None
        self.queue_cap = cl.max_num_queued_per_replica
        views = self.disagg.views()
        if views:
            self.view = _Views(views)
            self.env.process(self._refresh(cl.refresh_interval))
        self._request = self._disagg_request

    def _disagg_request(self, req: Request, record=None, process=None, done=None, now=None):
        yield from disagg_request(self, req, process, done)
        if record is not None:
            record(req)

    # A cluster of one answers for its replica, as the single engine did.
    @property
    def scheduler(self):
        """The first replica's scheduler."""
        return self.replicas[0].scheduler

    @property
    def kv(self):
        """The first replica's KV cache."""
        return self.replicas[0].kv

    def run(self) -> None:
        """Run until every request has finished or ``config.max_sim_time`` is reached."""
        until = self.config.max_sim_time
        with _long_lived_requests():
            if self.work_end is not None:
                self.work_end.run(until)
            elif math.isinf(until):
                run_events(self.env)
            else:
                self.env.run(until=until)
        for replica in self.replicas:
            replica.scheduler.close()

    def _check(self, replica: Replica, batch) -> None:
        check_invariants(self, replica, batch)

    # ------------------------------------------------------------------ processes
    def _refresh(self, interval: float):
        """Scrape the replicas' load every ``interval`` seconds while requests still arrive."""
        env, view = self.env, self.view
        # A client creates its requests as it sends them: count what it will send.
        total = len(self.requests) if self.client is None else self.client.num_requests
        # With retries requests are sent until the work ends (the run stops there).
        # (Flow control's queued requests need the gauges until they are dispatched.)
        while self.num_arrived < total or self.clients is not None \
                or (self.flow is not None and self.flow.busy):
            yield env.timeout(interval)
            view.refresh(env.now)

    def preempted(self, req: Request, interrupt: simpy.Interrupt) -> None:
        """A request process's wait was interrupted by a recompute preemption: the scheduler
        already sent ``req`` back to the queue; keep the cause (the process waits again)."""
        req.note_preemption(interrupt.cause)
        self.num_events += 1

    def reject(self, req: Request, reason: str) -> None:
        """Reject ``req`` at arrival for ``reason`` (no replica can ever serve it, or shed)."""
        req.status = Status.REJECTED
        req.reject_reason = reason

    def _shed(self, req: Request, reason: str) -> None:
        self.reject(req, reason)
        self.num_shed += 1

    def rate_limited(self, req: Request) -> bool:
        """Admission control's token bucket: True (``req`` is then shed) if it is empty."""
        if self.bucket is not None and not self.bucket.take(self.env.now):
            self._shed(req, f"shed: rate limit of {self.bucket.rate:g} requests/s exceeded")
            return True
        return False

    def queue_full(self, req: Request, i: int) -> bool:
        """Admission control's queue cap: True (``req`` is then shed) if replica ``i``'s waiting
        queue is at the cap."""
        cap = self.queue_cap
        if cap is not None and self.replicas[i].num_waiting >= cap:
            self._shed(req, f"shed: replica {i} already has {cap} requests waiting")
            return True
        return False

    def _route(self, req: Request) -> int:
        """Admission control, then the router's choice: ``req``'s replica, or -1 if shed."""
        # (Each check called only where its admission control is on: once per request.)
        if self.bucket is not None and self.rate_limited(req):
            return -1
        if self._admit is not None and req.priority < self._admit_below:
            why = self._admit(self.view, req)
            if why is not None:
                self._shed(req, why)
                return -1
        i = self._choose(self.view, req)
        if self.queue_cap is not None and self.queue_full(req, i):
            return -1
        owners = self.replica_of
        if req.id >= len(owners):        # a session turn created after the run started
            owners.extend([-1] * (req.id + 1 - len(owners)))
        owners[req.id] = i
        return i

    def _request(self, req: Request, record=None, process=None, done=None, now=None):
        """A request's life: routing (with several replicas or admission control), queueing (or
        rejection), then waiting for completion; ``record(req)``, if given, at the end.

        ``process``, ``done`` and ``now`` (this process, its done event and the arrival time)
        come from :func:`~simsched.engine.simpy_fast.request_starter`; a session's turn, started
        with ``env.process``, leaves them None. One generator for the whole life, woken once at
        completion and once per recompute preemption. Its first token needs no wake-up: the
        replica tells the router's load tracking itself (:attr:`Replica.on_first_token`).
        """
        load = self.load
        if done is None:
            env = self.env
            process, done, now = env.active_process, done_event(env), env.now
        self.num_arrived += 1
        if load is None:
            i = 0
        elif self.flow is None:
            i = self._route(req)
        else:                           # queued by llm-d's flow control first
            i = yield from self.flow.route(req)
        if i >= 0:
            # The replica's handles on us: this process, no first-token event, the done event.
            if self.replicas[i].add(req, (process, None, done), now):
                if load is not None:
                    load.routed(i, req)
                while True:
                    try:
                        yield done
                        break
                    except simpy.Interrupt as interrupt:
                        self.preempted(req, interrupt)
                self.num_events += 1
                if load is not None:
                    load.finished(i, req)
        if record is not None:
            record(req)


@contextmanager
def _long_lived_requests():
    """Keep the cyclic garbage collector off the run's long-lived objects while it runs.

    The request objects (a million in a big run) live for the whole run and form no garbage
    cycles, yet every full collection scans them; in-flight SimPy objects, many more in a large
    cluster, keep triggering such collections. Freezing what exists at the start and collecting
    the young generation less often cut a 64-replica, 1 M-request run's time by a third. Both are
    undone afterwards; nothing is done if the caller disabled or froze the collector.
    """
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(threshold[0], 50_000), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _first(view, req) -> int:
    """The router of a cluster of one."""
    return 0
