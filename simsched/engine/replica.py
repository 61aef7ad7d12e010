"""One replica's GPU as a SimPy process: schedule, time, wait, commit, wake, interrupt.

The GPU process asks the scheduler for a batch, asks the cost model how long it takes, waits that
long, commits the progress and wakes the request processes whose first token or completion it
produced. A preemption (recompute or swap) interrupts the victim's process with a
:class:`~simsched.request.PreemptionCause`. Swap transfers take
``bytes / (cache.swap_bandwidth_gbps * 1e9)`` seconds on top of the cost model's time.

Request processes belong to the cluster (:mod:`simsched.cluster.cluster`), which hands each
admitted request to a replica with :meth:`Replica.add` together with the SimPy handles the replica
fires: the process to interrupt and the first-token and done events.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from simsched.cost import hardware
from simsched.engine.prefix_cache import make_kv_cache
from simsched.engine.log import ITERATION_COLUMNS, PREFIX_COLUMNS, IterationLog
from simsched.engine.scheduler import Scheduler
from simsched.request import Request


class SimulationError(RuntimeError):
    """The engine could not make progress (a scheduler bug, never a user error)."""


class Replica:
    """One serving replica on a shared SimPy clock: scheduler, KV cache, cost model, GPU loop.

    ``on_iteration(replica, batch)``, if given, runs after every committed iteration (the
    invariant checker uses it).
    """

    def __init__(self, env: simpy.Environment, config, cost_model, num_blocks: int,
                 max_model_len: int | None, rng: np.random.Generator, index: int = 0,
                 on_iteration=None) -> None:
        self.env = env
        self.index = index
        self.config = config
        cache = config.cache
        self.kv = make_kv_cache(num_blocks, cache)
        self.scheduler = Scheduler(
            config.scheduler, self.kv, max_model_len, rng,
            kv_bytes_per_block=hardware.kv_bytes_per_token(config.hardware) * cache.block_size,
            swap_space_bytes=cache.swap_space_gib * 2**30)
        self.swap_bytes_per_second = cache.swap_bandwidth_gbps * 1e9
        self.cost_model = cost_model
        self.iteration_rows = IterationLog(ITERATION_COLUMNS + PREFIX_COLUMNS
                                           if self.kv.prefix_caching else ITERATION_COLUMNS)
        self.on_iteration = on_iteration
        self._idle: simpy.Event | None = None
        self._live: dict[int, tuple] = {}    # request id -> (process, first-token, done events)
        env.process(self._gpu())

    def add(self, req: Request, handles: tuple) -> bool:
        """Queue ``req`` here (False if it can never be served: it is then marked rejected).

        ``handles`` is ``(process, first_token_event, done_event)``; the replica keeps them only
        while the request is in flight here.
        """
        if not self.scheduler.add(req, self.env.now):
            return False
        self._live[req.id] = handles
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()
        return True

    def _gpu(self):
        env, sched, cost = self.env, self.scheduler, self.cost_model
        log = self.iteration_rows
        live = self._live
        kv = self.kv
        prefix = kv.prefix_caching
        hits = evictions = cached = last_hits = last_evictions = 0
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
            used = kv.num_used
            waiting = sched.num_waiting
            if prefix:
                # Cumulative counters -> this iteration's admissions' cache hits and evictions.
                hits = sched.num_cached_tokens - last_hits
                evictions = kv.num_evicted_blocks - last_evictions
                last_hits, last_evictions = sched.num_cached_tokens, kv.num_evicted_blocks
                cached = kv.num_evictable
            duration = cost.iteration_time(batch)
            if not duration > 0 or duration == math.inf:
                raise SimulationError(f"cost model returned {duration!r} for {batch!r}")
            swap_time = (batch.swap_out_bytes + batch.swap_in_bytes) / self.swap_bytes_per_second
            duration += swap_time
            yield env.timeout(duration)
            firsts, finished = sched.commit(env.now)
            if prefix:
                log.append((started, duration, batch.num_prefill_tokens, batch.num_decode_seqs,
                            batch.num_seqs, waiting, used, num_preempted, swap_time, hits,
                            evictions, cached))
            else:
                log.append((started, duration, batch.num_prefill_tokens, batch.num_decode_seqs,
                            batch.num_seqs, waiting, used, num_preempted, swap_time))
            for req in firsts:
                live[req.id][1].succeed()
            for req in finished:
                live.pop(req.id)[2].succeed()
            if self.on_iteration is not None:
                self.on_iteration(self, batch)

    def _interrupt_victims(self) -> None:
        for victim, cause in self.scheduler.preempted:
            self._live[victim.id][0].interrupt(cause)
        self.scheduler.preempted = []
