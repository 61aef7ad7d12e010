"""The SimPy processes of one run: arrivals, one process per request, and the GPU loop.

This is the only module that imports SimPy. The GPU process asks the scheduler for a batch, asks
the cost model how long it takes, waits that long, commits the progress and wakes the request
processes whose first token or completion it produced. A preemption (recompute or swap)
interrupts the victim's process with a :class:`~simsched.request.PreemptionCause`. Swap transfers
take ``bytes / (cache.swap_bandwidth_gbps * 1e9)`` seconds on top of the cost model's time.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from simsched.cost import hardware
from simsched.engine.invariants import check_invariants
from simsched.engine.kv_cache import KVCacheManager
from simsched.engine.log import IterationLog
from simsched.request import Request
from simsched.engine.scheduler import Scheduler


class SimulationError(RuntimeError):
    """The engine could not make progress (a scheduler bug, never a user error)."""


class Engine:
    """Runs one simulation over a list of requests sorted by arrival time."""

    def __init__(self, config, requests: list[Request], cost_model, num_blocks: int,
                 max_model_len: int | None = None, rng: np.random.Generator | None = None) -> None:
        self.config = config
        self.env = simpy.Environment()
        cache = config.cache
        self.kv = KVCacheManager(num_blocks, cache.block_size, cache.watermark)
        if rng is None:
            # An independent stream derived from the run's seed (not the workload's own stream).
            rng = np.random.default_rng(np.random.SeedSequence(config.seed).spawn(2)[1])
        self.scheduler = Scheduler(
            config.scheduler, self.kv, max_model_len, rng,
            kv_bytes_per_block=hardware.kv_bytes_per_token(config.hardware) * cache.block_size,
            swap_space_bytes=cache.swap_space_gib * 2**30)
        self.swap_bytes_per_second = cache.swap_bandwidth_gbps * 1e9
        self.cost_model = cost_model
        self.requests = requests
        self.iteration_rows = IterationLog()
        self.num_arrived = 0
        self.num_events = 0             # request-process wake-ups, for the events benchmark
        self._idle: simpy.Event | None = None
        self._live: dict[int, tuple] = {}    # request id -> (process, first-token, done events)
        self.env.process(self._arrivals())
        self.env.process(self._gpu())

    def run(self) -> None:
        """Run until every request has finished or ``config.max_sim_time`` is reached."""
        until = self.config.max_sim_time
        self.env.run(until=None if math.isinf(until) else until)
        self.scheduler.close()

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
        self.num_arrived += 1
        if not self.scheduler.add(req, self.env.now):
            return
        waits = (self.env.event(), self.env.event())      # first token, done
        # SimPy handles live in the engine, only while the request is in flight.
        self._live[req.id] = (self.env.active_process, *waits)
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()
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
        del self._live[req.id]

    def _gpu(self):
        env, sched, cost = self.env, self.scheduler, self.cost_model
        log = self.iteration_rows
        check = self.config.check_invariants
        while True:
            if not sched.has_work():
                self._idle = env.event()
                yield self._idle
                self._idle = None
                continue
            batch = sched.schedule(env.now)
            num_preempted = len(sched.preempted)
            if not batch.num_seqs:
                # Everything runnable was just preempted back to the queue: plan again now, and
                # charge any swap transfer of the abandoned plan to the iteration that runs.
                self._interrupt_victims()
                carried = (batch.swap_out_bytes, batch.swap_in_bytes)
                batch = sched.schedule(env.now)
                batch.swap_out_bytes += carried[0]
                batch.swap_in_bytes += carried[1]
                num_preempted += len(sched.preempted)
                if not batch.num_seqs:
                    raise SimulationError(
                        f"no progress at t={env.now:.6f}: {len(sched.running)} running, "
                        f"{sched.num_waiting} waiting, {self.kv.num_free} free KV blocks")
            self._interrupt_victims()
            started = env.now
            used = self.kv.num_used
            waiting = sched.num_waiting
            duration = cost.iteration_time(batch)
            if not duration > 0 or duration == math.inf:
                raise SimulationError(f"cost model returned {duration!r} for {batch!r}")
            swap_time = (batch.swap_out_bytes + batch.swap_in_bytes) / self.swap_bytes_per_second
            duration += swap_time
            yield env.timeout(duration)
            firsts, finished = sched.commit(env.now)
            log.append((started, duration, batch.num_prefill_tokens, batch.num_decode_seqs,
                         batch.num_seqs, waiting, used, num_preempted, swap_time))
            for req in firsts:
                self._live[req.id][1].succeed()
            for req in finished:
                self._live[req.id][2].succeed()
            if check:
                check_invariants(self, batch)

    def _interrupt_victims(self) -> None:
        for victim, cause in self.scheduler.preempted:
            self._live[victim.id][0].interrupt(cause)
        self.scheduler.preempted = []
