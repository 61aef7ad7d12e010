"""Aborting one request in its engine, as vLLM aborts a request whose client went away.

:func:`abort_request` takes an unfinished request off a scheduler wherever it is: running
(prefilling or decoding, also when it is part of the iteration in flight), swapped out, in the
waiting queue, among the victims or arrivals the next plan will queue. Its KV blocks are freed
at once (a prefix cache keeps the full blocks it computed, as vLLM's
``free`` keeps them cached), its decode run is closed (the tokens it emitted keep their times)
and ``num_generated`` is exact. It recomputes nothing.

It returns the work the request made the GPU do that is now lost, as an :class:`AbortedWork`:
the tokens whose KV it held (``num_kv_tokens``, the figure the result checks balance, as for an
autoscaler's abort), of which ``num_prefill_tokens`` came from prefill chunks and
``num_decode_tokens`` from decode steps, the in-flight iteration's share included (that
iteration still runs and is logged: the GPU computes the token, its result is thrown away).
Tokens served from the prefix cache at its first admission are not counted as prefill work.

:func:`abort_on_replica` and :func:`restart` are a replica's side of an abort and of a restart
after a failure (:mod:`simsched.cluster.failures`).
"""

from __future__ import annotations

from simsched.engine.kv.factory import make_kv_cache
from simsched.request import Request, Status

RUNNING, SWAPPED, WAITING = Status.RUNNING, Status.SWAPPED, Status.WAITING


class AbortedWork:
    """What an aborted request had computed (see the module docstring)."""

    __slots__ = ("num_kv_tokens", "num_prefill_tokens", "num_decode_tokens", "in_flight",
                 "in_flight_decode")

    def __init__(self, num_kv_tokens: int = 0, num_prefill_tokens: int = 0,
                 num_decode_tokens: int = 0, in_flight: int = 0,
                 in_flight_decode: bool = False) -> None:
        self.num_kv_tokens = num_kv_tokens
        self.num_prefill_tokens = num_prefill_tokens
        self.num_decode_tokens = num_decode_tokens
        # Of them, the tokens of the iteration in flight (a decode token, or a prefill chunk).
        self.in_flight = in_flight
        self.in_flight_decode = in_flight_decode

    def take_back_in_flight(self) -> int:
        """The iteration in flight was lost after all (its replica failed before it ended, so
        it is never logged): its tokens were not computed. Returns them."""
        n, self.in_flight = self.in_flight, 0
        self.num_kv_tokens -= n
        if self.in_flight_decode:
            self.num_decode_tokens -= n
        else:
            self.num_prefill_tokens = max(0, self.num_prefill_tokens - n)
        return n

    def __repr__(self) -> str:
        return (f"AbortedWork(kv={self.num_kv_tokens}, prefill={self.num_prefill_tokens}, "
                f"decode={self.num_decode_tokens})")


NOTHING = AbortedWork()


def abort_request(sched, req: Request) -> AbortedWork:
    """Remove unfinished ``req`` from ``sched`` now; the work it loses (see the module
    docstring). A request the scheduler does not hold is left as it is (:data:`NOTHING`)."""
    rid = req.id
    if rid in sched.running and req.status is RUNNING:
        work = _stop_running(sched, req)
    elif req.status is SWAPPED:
        work = _drop_swapped(sched, req)
    elif req.status is WAITING and _unqueue(sched, req):
        work = NOTHING
    else:
        return NOTHING
    # Memos of refused admissions may name it (the head of the queue): ask again.
    sched.running_version += 1
    sched._blocked = None
    return work


def _stop_running(sched, req: Request) -> AbortedWork:
    generated = sched.num_generated(req)
    cached = sched.num_cached(req)
    decoding = req.run_start_step >= 0
    # The iteration in flight (scheduled, not yet committed) computes a token or a chunk of it.
    in_flight = 0
    entry = sched.planned.get(req.id)
    if entry is not None:
        in_flight = entry[1]
    elif decoding and sched.decode_step > sched.step and req.run_start_step <= sched.decode_step:
        in_flight = 1
    if decoding:
        num_decode = cached - req.prefill_target + in_flight
    else:
        num_decode = 0
    sched._stop(req, cached)
    req.num_generated = generated
    req.num_computed_tokens = 0
    kv_tokens = cached + in_flight
    # Prefix-cache hits of its first admission were served, not computed; a request admitted
    # again after a preemption (whose hits are not kept) counts its whole re-prefill.
    hits = req.num_cached_tokens if req.num_preemptions == 0 else 0
    return AbortedWork(kv_tokens, max(0, kv_tokens - num_decode - hits), num_decode, in_flight,
                       decoding)


def _drop_swapped(sched, req: Request) -> AbortedWork:
    swap = sched.swap
    cached = req.num_computed_tokens
    if req.id in swap.swapped:
        del swap.swapped[req.id]
    elif req in swap._new:
        swap._new.remove(req)
    else:
        return NOTHING
    swap.used_bytes -= sched.kv.blocks_for(cached) * swap.bytes_per_block
    req.num_computed_tokens = 0
    # Its KV (in CPU memory) was computed on the GPU and is thrown away.
    hits = req.num_cached_tokens if req.num_preemptions <= 1 else 0
    return AbortedWork(cached, max(0, cached - hits), 0)


def _unqueue(sched, req: Request) -> bool:
    """Take waiting ``req`` out of the queue or the lists feeding it; False if not there."""
    for pending in (sched._requeue, sched._unseen):
        if req in pending:
            pending.remove(req)
            return True
    queue = sched._queue
    if queue.remove(req):
        return True
    return False


def abort_on_replica(replica, req: Request) -> AbortedWork:
    """:meth:`simsched.engine.replica.Replica.abort`: ``req`` leaves ``replica`` now, from the
    arrivals its next plan has not seen yet or from its scheduler."""
    pending = replica.pending      # (the GPU loop holds this deque: changed in place)
    entry = next((e for e in pending if e[1] is req), None) \
        if pending and req.status is WAITING else None
    if entry is not None:
        pending.remove(entry)
        work = NOTHING
    else:
        work = abort_request(replica.scheduler, req)
    replica._live.pop(req.id, None)
    if work.in_flight:
        # Counted as computed by the iteration in flight, which a failure may yet lose:
        # (log length now, the work) lets the failure take it back (cluster.failures).
        logged, claims = len(replica.iteration_rows.values), replica.in_flight_aborts
        if claims and claims[-1][0] != logged:
            claims.clear()          # their iterations were logged: settled
        claims.append((logged, work))
    if work.num_kv_tokens:
        replica.notify_memory()
    return work


def restart(replica) -> None:
    """A failed ``replica``'s engine made again (:meth:`~simsched.engine.replica.Replica.
    restart` then starts its GPU loop): an empty KV cache, prefix cache included, and a new
    scheduler whose decode steps go on from the old one's (the iteration log stays one log)."""
    old = replica.scheduler
    if replica.gpu_process.is_alive or old.has_work() or replica._live:
        raise RuntimeError(f"replica {replica.index} restarted while it still runs")
    make, sched_cfg, max_model_len, rng, kv_bytes, swap_bytes = replica._made
    replica.kv = make_kv_cache(replica.kv.num_blocks, replica.config.cache)
    sched = make(sched_cfg, replica.kv, max_model_len, rng, kv_bytes_per_block=kv_bytes,
                 swap_space_bytes=swap_bytes)
    sched.step = sched._grown_step = old.step
    sched.step_ended_at = old.step_ended_at
    replica.scheduler = sched
    # The new loop counts cache hits from 0: the log rows before this are the old one's.
    replica.restart_row = len(replica.iteration_rows.values)
    replica._idle = None
