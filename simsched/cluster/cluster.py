"""The SimPy side of a run: one clock, the arrival process, one process per request, replicas.

The arrival process starts each request's process at its arrival time; the request process hands
the request to a replica (today always replica 0: a single-engine run is a cluster of one) and
then waits for its first token and completion, receiving preemption interrupts from the replica's
GPU loop (:mod:`simsched.engine.replica`) in between.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from simsched.engine.invariants import check_invariants
from simsched.cluster.sessions import run_sessions
from simsched.engine.replica import Replica, SimulationError
from simsched.request import Request

__all__ = ["Cluster", "SimulationError"]


class Cluster:
    """Runs one simulation over a list of requests sorted by arrival time.

    ``sessions`` (:class:`~simsched.cluster.sessions.SessionPlan` list) adds closed-loop
    sessions: their turns are created as they arrive and appended to ``requests``.
    """

    def __init__(self, config, requests: list[Request], cost_model, num_blocks: int,
                 max_model_len: int | None = None, rng: np.random.Generator | None = None,
                 sessions: list | None = None) -> None:
        self.config = config
        self.env = simpy.Environment()
        if rng is None:
            # An independent stream derived from the run's seed (not the workload's own stream).
            rng = np.random.default_rng(np.random.SeedSequence(config.seed).spawn(2)[1])
        check = self._check if config.check_invariants else None
        self.replicas = [Replica(self.env, config, cost_model, num_blocks, max_model_len, rng,
                                 index=0, on_iteration=check)]
        self.requests = requests
        self.num_arrived = 0
        self.num_events = 0             # request-process wake-ups, for the events benchmark
        self.env.process(self._arrivals())
        if sessions:
            self.env.process(run_sessions(self, sessions))

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
        self.env.run(until=None if math.isinf(until) else until)
        for replica in self.replicas:
            replica.scheduler.close()

    def _check(self, replica: Replica, batch) -> None:
        check_invariants(self, replica, batch)

    # ------------------------------------------------------------------ processes
    def _arrivals(self):
        env = self.env
        for req in self.requests:
            delay = req.arrival_at - env.now
            if delay > 0:
                yield env.timeout(delay)
                req.arrival_at = env.now    # now + delay can round one ulp below arrival_at
            env.process(self._request(req))

    def _request(self, req: Request):
        """A request's life: queue (or be rejected), wait for first token, then completion."""
        env = self.env
        self.num_arrived += 1
        waits = (env.event(), env.event())      # first token, done
        if not self.replicas[0].add(req, (env.active_process, *waits)):
            return
        stage = 0
        while stage < 2:
            try:
                yield waits[stage]
                stage += 1
            except simpy.Interrupt as interrupt:
                # Recompute preemption: the scheduler already sent us back to the queue;
                # keep the cause and wait again for re-admission to produce our tokens.
                if not req.causes:
                    req.causes = []
                req.causes.append(interrupt.cause)
            self.num_events += 1
