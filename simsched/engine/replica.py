"""One replica's GPU as a SimPy process: schedule, time, wait, commit, wake, interrupt.

The GPU process asks the scheduler for a batch, asks the cost model how long it takes, waits that
long, commits the progress and wakes the request processes whose first token or completion it
produced. A preemption (recompute or swap) interrupts the victim's process with a
:class:`~simsched.request.PreemptionCause`. Swap transfers take
``bytes / (cache.swap_bandwidth_gbps * 1e9)`` seconds on top of the cost model's time.

Batches form after everything else at their instant: the GPU waits for an iteration's end (and,
after idling, for the instant it was woken) with an event of lower priority than SimPy's, so every
arrival at the instant a batch is formed has joined the queue first and is considered for that
batch, whatever the order in which SimPy scheduled the events.

With async scheduling (``scheduler.async_scheduling``, on for the ``vllm_v1`` engine profile) the
scheduler plans ahead by default (``scheduler.plan_ahead``: vLLM's ``AsyncScheduler`` decisions,
:mod:`simsched.engine.scheduler.plan_ahead`). With ``plan_ahead=False`` (the ``classic`` preset)
the replica models vLLM V1's one-step pipeline by its arrival rule instead: the engine plans step k + 1 as step k starts, so the
plan of an iteration sees only the requests that arrived up to the start of the previous one (a
request arriving while step k runs joins step k + 2 at the earliest). Arrivals wait in
``pending`` until an iteration's plan may see them. After idling, or when the planned step would
be empty, the engine plans at once and sees everything that has arrived. Blocks and sequence slots
freed by step k are used from step k + 1 here (vLLM: from k + 2); see docs/vllm_v1.md.

Request processes belong to the cluster (:mod:`simsched.cluster.cluster`), which hands each
admitted request to a replica with :meth:`Replica.add` together with the SimPy handles the replica
fires: the process to interrupt and the first-token and done events.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque

import numpy as np
import simpy

from simsched.config import pipeline
from simsched.cost import hardware
from simsched.cost.speculative import speculative_cost_model
from simsched.engine.engines import make_engine
from simsched.engine.kv.factory import make_kv_cache
# IterationTimeError is re-exported: the loop raises it (simsched.engine.iteration_time).
from simsched.engine.iteration_time import IterationTimeError, checked_duration
from simsched.engine.lora import attach_lora
from simsched.engine.log import ITERATION_COLUMNS, PREFIX_COLUMNS, IterationLog
from simsched.engine.scheduler.quiet import QuietSteps
from simsched.engine import removal
from simsched.engine.abort import AbortedWork, abort_on_replica, restart
from simsched.engine.scheduler.core import Scheduler
from simsched.engine.scheduler.speculative import SpeculativeScheduler
from simsched.engine.simpy_fast import LATE, iteration_clock, late
from simsched.request import Request, Status

__all__ = ["IterationTimeError", "Replica", "SimulationError"]


class SimulationError(RuntimeError):
    """The engine could not make progress (a scheduler bug, never a user error)."""


class Replica:
    """One serving replica on a shared SimPy clock: scheduler, KV cache, cost model, GPU loop.

    ``on_iteration(replica, batch)``, if given, runs after every committed iteration (the
    invariant checker uses it). ``on_kv(index, num_used, num_blocks)``, if set, hears the KV
    blocks in use once per iteration (after scheduling) and when the replica falls idle: a
    router's view of KV use. ``on_first_token(index, request)``, if set, hears each first token
    as its iteration commits (a router's load tracking: the prompt is done). ``on_queue(index)``,
    if set, hears that the waiting count may have changed: at each :meth:`add` and at the top of
    each pass of the GPU loop, which every step of that loop goes through (a router tracking the
    waiting gauges incrementally recounts only the replicas it heard from; the cluster sets it
    only where nothing else reaches a replica's queues).
    """

    def __init__(self, env: simpy.Environment, config, cost_model, num_blocks: int,
                 max_model_len: int | None, rng: np.random.Generator, index: int = 0,
                 on_iteration=None) -> None:
        self.env = env
        self.index = index
        self.config = config
        if not pipeline.pipelined(config, cost_model) and hasattr(cost_model, "synchronous"):
            # Not pipelined: every step also pays the engine's host time (0 in every shipped
            # profile: simsched.cost.host_time).
            cost_model = cost_model.synchronous()
        cache = config.cache
        spec = config.scheduler.speculative
        engine = config.scheduler.engine
        if engine != "vllm":
            # Another engine's KV cache and scheduler (simsched.engine.engines).
            self.kv, make_scheduler = make_engine(engine, num_blocks, cache,
                                                  config.hardware.parallel)
        elif spec is not None and spec.enabled:
            self.kv = make_kv_cache(num_blocks, cache)
            # Speculative decoding: an eager-decode scheduler and the verify + proposer cost.
            make_scheduler = SpeculativeScheduler
            cost_model = speculative_cost_model(cost_model, spec, config.hardware)
        else:
            self.kv = make_kv_cache(num_blocks, cache)
            make_scheduler = Scheduler
        sched_cfg = config.scheduler
        if sched_cfg.plan_ahead is None and pipeline.plan_ahead(config, cost_model):
            # plan_ahead follows the engine profile: the scheduler is told the answer.
            sched_cfg = dataclasses.replace(sched_cfg, plan_ahead=True, async_scheduling=None)
        # What the scheduler is made from (a restart after a failure makes it again).
        self._made = (make_scheduler, sched_cfg, max_model_len, rng,
                      hardware.kv_bytes_per_token(config.hardware) * cache.block_size,
                      cache.swap_space_gib * 2**30)
        self.scheduler = make_scheduler(sched_cfg, self.kv, max_model_len, rng,
                                        kv_bytes_per_block=self._made[4],
                                        swap_space_bytes=self._made[5])
        self.swap_bytes_per_second = cache.swap_bandwidth_gbps * 1e9
        self.cost_model = cost_model
        if getattr(cache, "kv_tiers", None) is not None:
            # Tiered KV cache: the steps that admit tier hits also wait for their loads.
            self.cost_model = self.kv.bind(env, config.hardware, cost_model)
        self.iteration_rows = IterationLog(ITERATION_COLUMNS + PREFIX_COLUMNS
                                           if self.kv.prefix_caching else ITERATION_COLUMNS)
        self.on_iteration = on_iteration
        self.on_kv = None
        self.on_first_token = None
        self.on_queue = None
        # Called as on_idle(replica) when the GPU loop falls idle (a run that ends with its
        # work waits for the iterations in flight: simsched.cluster.work_end).
        self.on_idle = None
        self._idle: simpy.Event | None = None
        self._live: dict[int, tuple] = {}    # request id -> (process, first-token, done events)
        self.kv_waiters: list = []           # events of transfers waiting for free KV blocks
        self.in_flight_aborts: list = []     # see abort()
        # Async scheduling: (arrived at, request) not yet visible to a plan, in arrival order.
        self.async_scheduling = pipeline.arrival_rule(config, cost_model)
        self.pending: deque = deque()
        # LoRA adapters (simsched.engine.lora): a constraint and a cost term, or nothing at all.
        self.lora = attach_lora(self) if config.scheduler.lora is not None else None
        # Quiet decode steps in one clock event (simsched.engine.scheduler.quiet): off unless the cluster
        # allows them; the planner is made when the loop starts, after every hook is attached.
        self.max_quiet_steps = 0
        self.quiet: QuietSteps | None = None
        self.gpu_process = env.process(self._gpu())

    def allow_quiet_steps(self, limit: int) -> None:
        """Let the GPU loop take up to ``limit`` quiet decode steps per clock event where the
        replica's own setup allows it (:mod:`simsched.engine.scheduler.quiet`); the cluster calls this
        before the run when nothing outside reads the replica's state between its events."""
        self.max_quiet_steps = limit

    def add(self, req: Request, handles: tuple, now: float) -> bool:
        """Queue ``req``, arriving at ``now`` (the clock's time), here (False if it can never be
        served: it is then marked rejected).

        ``handles`` is ``(process, first_token_event, done_event)`` (the first-token event may be
        None: nobody waits for it; the done event is a
        :func:`~simsched.engine.simpy_fast.done_event`); the replica keeps them only while the
        request is in flight here.
        """
        quiet = self.quiet
        if quiet is not None and quiet.run is not None:
            quiet.cut(now)              # the run of quiet steps ends where a plan sees req
        if self.on_queue is not None:
            self.on_queue(self.index)
        if self.async_scheduling:
            return self._add_pending(req, handles, now)
        if not self.scheduler.add(req, now):
            return False
        self._live[req.id] = handles
        idle = self._idle                  # self.wake(), inlined: once per request
        if idle is not None:
            self._idle = None
            idle.succeed()
        return True

    def _add_pending(self, req: Request, handles: tuple, now: float) -> bool:
        """:meth:`add` with async scheduling: the request waits in ``pending`` for a plan that
        may see it (rejected at once, as :meth:`add` does, if it can never be served)."""
        sched = self.scheduler
        if req.num_prompt_tokens + req.num_output_tokens > sched._max_total:
            return sched.add(req, now)          # rejects it, with the reason
        req.status = Status.WAITING
        req.queued_at = now
        self.pending.append((now, req))
        self._live[req.id] = handles
        idle = self._idle                  # self.wake(), inlined: once per request
        if idle is not None:
            self._idle = None
            idle.succeed()
        return True

    @property
    def num_waiting(self) -> int:
        """Requests here that arrived and wait to be scheduled: the scheduler's queue, plus,
        with async scheduling, those no plan has seen yet."""
        return self.scheduler.num_waiting + len(self.pending)

    def _release(self, cutoff: float) -> None:
        """Queue the pending requests that arrived at or before ``cutoff``.

        Each gets what ``scheduler.add(req, at)`` would do, without add's checks made again
        (what this replaces: one ``add`` call per request): :meth:`_add_pending` made them
        already (the request is servable, so add would not reject it) and marked the request
        waiting since ``at``, and async scheduling is never on with ``plan_ahead`` (the one
        other branch of add), so what is left of add is the push and its count."""
        pending, sched = self.pending, self.scheduler
        push = sched._queue.push
        num_pushed = sched._num_pushed
        while pending and pending[0][0] <= cutoff:
            at, req = pending.popleft()
            push(req, at)
            num_pushed += 1
        sched._num_pushed = num_pushed

    def wake(self) -> None:
        """Wake the GPU loop if it idles (new work, or KV memory freed by a transfer)."""
        idle = self._idle
        if idle is not None:               # not yet woken: wake it once
            self._idle = None
            idle.succeed()

    def _sleep(self):
        """Idle until :meth:`wake`, then let every arrival of that instant join the batch."""
        self._idle = self.env.event()
        yield self._idle
        yield late(self.env, 0.0)

    def release(self, req: Request) -> None:
        """A handed-off request's KV has left: free its blocks here."""
        self.scheduler.release_held(req)
        del self._live[req.id]
        self.wake()
        self.notify_memory()

    def receive(self, req: Request, handles: tuple) -> None:
        """``req``'s KV has arrived in blocks reserved here: it decodes from the next iteration."""
        self._live[req.id] = handles
        self.scheduler.arrive(req)
        self.wake()

    def recompute(self, req: Request, handles: tuple, cached: int, now: float) -> None:
        """``req``'s KV transfer to here failed and it is recomputed here instead: its
        reservation is freed (a prefix cache keeps the ``cached`` tokens it matched) and it
        queues to prefill its prompt and the tokens it generated (simsched.cluster.links)."""
        self.scheduler.drop_incoming(req, cached)
        if not self.add(req, handles, now):
            raise SimulationError(f"request {req.id}: recomputing a failed KV transfer on replica "
                                  f"{self.index}, which cannot hold it: {req.reject_reason}")
        self.notify_memory()

    def notify_memory(self) -> None:
        """Tell transfers waiting for KV blocks here to try again."""
        waiters, self.kv_waiters = self.kv_waiters, []
        for event in waiters:
            event.succeed()

    def _gpu(self):
        env, sched, cost = self.env, self.scheduler, self.cost_model
        log = self.iteration_rows
        live = self._live
        index = self.index
        kv = self.kv
        num_blocks = kv.num_blocks
        prefix = kv.prefix_caching
        rows, pack = log.values, log.pack    # rows += pack(*row), as the columns: see log.py
        schedule, commit, has_work = sched.schedule, sched.commit, sched.has_work
        # The event heap, the event ids and the iteration-end event this loop schedules again
        # and again (see simpy_fast.iteration_clock).
        push, (queue, eid, ended) = heapq.heappush, iteration_clock(env)
        swap_rate = self.swap_bytes_per_second
        swapping = sched.swapping            # only swap preemption moves KV over the host link
        on_iteration = self.on_iteration
        inf = math.inf
        num_cached_tokens = num_evicted_blocks = kv_blocks_cached = last_hits = last_evictions = 0
        ulp_below = -1.0     # the clock is below this power of two: ulp_floor holds
        ulp_floor = 0.0
        now = env.now        # the clock, kept here: only this loop and its sleeps move it
        asynchronous, pending = self.async_scheduling, self.pending
        plan_at = now               # async: when the plan of the iteration starting now was made
        quiet = self.quiet = QuietSteps.for_replica(self)
        on_queue = self.on_queue
        while True:
            # Each step of this loop (from one yield to the next) passes here: whatever a step
            # changes in the queues, the listener hears of it before another process runs.
            if on_queue is not None:
                on_queue(index)
            if asynchronous:
                if pending:
                    if pending[0][0] <= plan_at:    # most iterations: nothing to release
                        self._release(plan_at)
                    if pending and not sched.running and not has_work():
                        # The planned step is empty: vLLM plans again at once, seeing everything.
                        self._release(now)
                plan_at = now                   # the next iteration is planned as this one starts
            if not sched.running and not has_work():
                if self.on_kv is not None:
                    self.on_kv(self.index, self.kv.num_used, self.kv.num_blocks)
                if self.on_idle is not None:
                    self.on_idle(self)
                yield from self._sleep()
                now = env.now
                continue
            # A request waiting in the queue makes the next step an admission, not quiet.
            if quiet is not None and not pending and not sched._waiting:
                run = quiet.plan(now, ulp_below, ulp_floor)
                if run is not None:
                    # Quiet decode steps, one clock event for all (simsched.engine.scheduler.quiet).
                    end = run.times[-1]         # its last planned step's end
                    if queue and queue[0][0] <= end:
                        yield quiet.wait(run)
                    else:
                        env._now = end
                    now, plan_at, finished = quiet.take(run, log)
                    if finished:
                        self._done(finished)
                    continue
            started_at = now
            batch = schedule(started_at)
            preempted = sched.preempted
            num_preempted = len(preempted) if preempted else 0
            new = batch.prefill_new_tokens
            if not new and not batch.num_decode_seqs:
                # Everything runnable was just preempted back to the queue: plan again now, and
                # charge any swap transfer of the abandoned plan to the iteration that runs.
                self._interrupt_victims()
                carried = (batch.swap_out_bytes, batch.swap_in_bytes)
                batch = schedule(started_at)
                batch.swap_out_bytes += carried[0]
                batch.swap_in_bytes += carried[1]
                num_preempted += len(sched.preempted)
                if not batch.num_seqs and (sched.held or sched.incoming):
                    # KV blocks held for transfers block admissions: wait until one ends.
                    self._interrupt_victims()
                    yield from self._sleep()
                    now = env.now
                    continue
                new = batch.prefill_new_tokens
                if not batch.num_seqs and not has_work():
                    continue        # plan_ahead: only finished requests' blocks were left
                if not batch.num_seqs:
                    raise SimulationError(
                        f"no progress at t={env.now:.6f}: {len(sched.running)} running, "
                        f"{sched.num_waiting} waiting, {self.kv.num_free} free KV blocks")
                preempted = sched.preempted
            if preempted:
                self._interrupt_victims()
            if prefix:
                kv_blocks_used = kv.num_used
                # Cumulative counters -> this iteration's admissions' cache hits and evictions.
                num_cached_tokens = sched.num_cached_tokens - last_hits
                num_evicted_blocks = kv.num_evicted_blocks - last_evictions
                last_hits, last_evictions = sched.num_cached_tokens, kv.num_evicted_blocks
                kv_blocks_cached = kv.num_evictable
            else:
                kv_blocks_used = num_blocks - kv.num_free
            if self.on_kv is not None:
                self.on_kv(self.index, kv_blocks_used, num_blocks)
            # schedule() has re-queued its victims; arrivals no plan has seen yet wait too.
            num_waiting = len(sched._waiting) + len(pending)
            duration = cost.iteration_time(batch)
            # One cheap check per iteration: a float, positive, finite from now on, and large
            # enough that now + duration still resolves it (arrivals near 1e17 s do not). The
            # clock's spacing changes only at powers of two: recompute it when one is crossed.
            if duration.__class__ is not float or started_at >= ulp_below \
                    or not (duration >= ulp_floor and started_at + duration < inf):
                duration, ulp_floor, ulp_below = checked_duration(duration, batch, started_at,
                                                                  cost)
            if swapping:
                swap_time = (batch.swap_out_bytes + batch.swap_in_bytes) / swap_rate
                duration += swap_time
            else:
                swap_time = 0.0
            now = end = started_at + duration
            if queue and queue[0][0] <= end:
                # Another event comes first, or at the same instant (it goes before a batch's
                # end): wait on the clock, on an iteration-end event of this loop's own. Once
                # processed, SimPy holds no reference to it: it is scheduled again, with a
                # fresh callbacks list (SimPy may still be iterating the last one).
                ended.callbacks = []
                push(queue, (end, LATE, next(eid), ended))
                yield ended
            else:
                # Nothing else can happen before this iteration ends: move the clock there
                # ourselves, as SimPy would on processing our timeout (no event to make; the
                # one SimPy internal written outside simpy_fast, see its docstring).
                env._now = end
            firsts, finished = commit(end)
            num_decode_tokens = batch.num_decode_seqs
            num_prefill_tokens = sum(new) if new else 0
            num_seqs = len(new) + num_decode_tokens
            # The row, its values named as the log's columns in their order (see log.py;
            # tests/test_iteration_log.py checks these calls against the columns by name).
            if prefix:
                rows += pack(started_at, duration, num_prefill_tokens, num_decode_tokens,
                             num_seqs, num_waiting, kv_blocks_used, num_preempted, swap_time,
                             num_cached_tokens, num_evicted_blocks, kv_blocks_cached)
            else:
                rows += pack(started_at, duration, num_prefill_tokens, num_decode_tokens,
                             num_seqs, num_waiting, kv_blocks_used, num_preempted, swap_time)
            if firsts:
                on_first_token = self.on_first_token
                for req in firsts:
                    first = live[req.id][1]
                    if first is not None:          # a process waits for it
                        first.succeed()
                    if on_first_token is not None:
                        on_first_token(index, req)
            if finished:
                self._done(finished)
            if self.kv_waiters:
                self.notify_memory()
            if on_iteration is not None:
                on_iteration(self, batch)

    def _done(self, finished: list) -> None:
        """Process the done events of ``finished`` requests here, at once: SimPy would process
        them next, as nothing else is due before them (an iteration ends after every other event
        of its instant), and a scheduled event would only make the next iteration wait on the
        clock for them (simpy_fast.done_event: created triggered)."""
        live = self._live
        for req in finished:
            done = live.pop(req.id)[2]
            callbacks, done.callbacks = done.callbacks, None
            for callback in callbacks:
                callback(done)

    def _interrupt_victims(self) -> None:
        live = self._live
        for victim, cause in self.scheduler.preempted:
            if cause is not None:   # None: finished already (plan_ahead), its process has ended
                live[victim.id][0].interrupt(cause)
        self.scheduler.preempted = []

    def abort(self, req: Request) -> AbortedWork:
        """Abort unfinished ``req`` here now (its client gave up): it leaves the engine
        wherever it is, its KV blocks freed at once; the work it loses
        (:func:`simsched.engine.abort.abort_on_replica`). Its handles are dropped: the caller
        wakes its process."""
        return abort_on_replica(self, req)

    def restart(self) -> None:
        """Start this replica again after a failure: an empty KV cache (its prefix cache
        lost), a new scheduler and GPU loop (:func:`simsched.engine.abort.restart`)."""
        restart(self)
        self.gpu_process = self.env.process(self._gpu())

    def remove_requests(self, step_ends=None) -> list[tuple]:
        """Stop this replica now (it is removed from a fleet): the GPU loop ends (an iteration
        in progress is lost) and every request it holds leaves, stopped as after a recompute
        preemption; ``(request, handles, tokens whose KV was dropped)`` per request (see
        :func:`simsched.engine.removal.remove_requests`)."""
        return removal.remove_requests(self, step_ends)
