"""Taking every request off a scheduler at once: what removing a replica (autoscaling's
``on_remove="abort"`` or ``"migrate"``) does to the requests it holds.

:func:`take_all` empties a scheduler: running requests (prefilling or decoding, an iteration in
progress included: its work is lost, as the replica stops before it commits), swapped-out ones,
the waiting queue and arrivals no plan has seen yet. Each request is left as a recompute
preemption leaves it (:meth:`~simsched.engine.scheduler.preemption.PreemptionMixin._preempt`): its KV
freed, its decode run closed (the tokens it emitted keep their times), ``num_generated`` exact,
``num_computed_tokens`` 0 and ``prefill_target`` the prompt plus the tokens generated so far, so
another replica can take it as it would take a recomputed request. The tokens whose KV is dropped
are returned, not counted: the caller decides what becomes of the requests
(:mod:`simsched.cluster.removal`), and only one that goes on elsewhere recomputes them.

:func:`runs_as_gaps` turns a request's decode runs, which index the decode steps of the replica
it leaves, into explicit token gaps, so its token times survive its move to another replica.
"""

from __future__ import annotations

import numpy as np

from simsched.engine.log import log_step_ends
from simsched.request import Request, Status

WAITING, SWAPPED, FINISHED = Status.WAITING, Status.SWAPPED, Status.FINISHED


def take_all(sched) -> list[tuple[Request, int]]:
    """Stop and remove every unfinished request ``sched`` holds; ``(request, tokens whose KV
    was dropped)`` for each, in the order running, swapped out, waiting."""
    out: list[tuple[Request, int]] = []
    for req in list(sched.running.values()):
        if req.status is FINISHED:
            # plan_ahead: finished in the last batch, its blocks held until the next plan.
            sched._release(req)
            continue
        generated = sched.num_generated(req)
        cached = sched.num_cached(req)
        sched._stop(req, cached)
        out.append((req, _reset(req, generated, cached)))
    sched._zombies = []
    swap = sched.swap
    for req in list(swap.swapped.values()) + swap._new:
        cached = req.num_computed_tokens
        swap.used_bytes -= sched.kv.blocks_for(cached) * swap.bytes_per_block
        out.append((req, _reset(req, req.num_generated, cached)))
    swap.swapped.clear()
    swap._new.clear()
    # Waiting requests hold no KV: new, or already reset by a recompute preemption.
    queue, waiting = sched._queue, sched._waiting
    while len(waiting):
        out.append((queue.pop(), 0))
    for pending in (sched._requeue, sched._unseen):
        out.extend((req, 0) for req in pending)
        pending.clear()
    sched.planned = {}
    sched.planned_tokens = 0
    sched.preempted = []
    sched.running_version += 1
    sched._blocked = None
    return out


def _reset(req: Request, generated: int, cached: int) -> int:
    """Leave stopped ``req`` as a recompute preemption does (without counting a preemption, and
    without counting ``cached`` as recomputed: an aborted request recomputes nothing)."""
    req.num_generated = generated
    req.num_computed_tokens = 0
    req.prefill_target = req.num_prompt_tokens + generated
    req.status = WAITING
    return cached


def runs_as_gaps(req: Request, step_ends: np.ndarray, first_step: int = 0) -> None:
    """Replace ``req``'s decode runs (steps of the replica whose ``step_ends`` are given, the
    first of them step ``first_step``) by the gaps before each of their tokens, the first
    measured from the token before the run."""
    runs = req.runs
    if not runs:
        return
    gaps = list(req.gaps)
    for k in range(0, len(runs), 3):
        prev, a, b = runs[k], runs[k + 1] - first_step, runs[k + 2] - first_step
        gaps.append(float(step_ends[a] - prev))
        gaps.extend(np.diff(step_ends[a:b + 1]).tolist())
    req.gaps = gaps
    req.runs = ()


def remove_requests(replica, step_ends=None) -> list[tuple]:
    """Stop ``replica`` now (it is removed from a fleet): its GPU loop ends (an iteration in
    progress is lost) and every request it holds leaves, stopped as after a recompute preemption
    (:func:`take_all`).

    Returns ``(request, handles, tokens whose KV was dropped)`` per request, ``handles`` as
    :meth:`~simsched.engine.replica.Replica.add` took them; a request's decode runs there are
    turned into token gaps, so its token times stay right wherever it goes next. The decode
    steps' end times come from the replica's iteration log
    (:func:`~simsched.engine.log.log_step_ends`), or are ``step_ends``, ``(first step, its end
    and the later ones' as an array)``, where a streamed run has written part of the log out
    already.
    """
    taken = replica.scheduler.take_all()
    taken += [(req, 0) for _, req in replica.pending]
    replica.pending.clear()
    first, ends = step_ends if step_ends is not None \
        else (0, log_step_ends(replica.iteration_rows))
    out = []
    for req, lost in taken:
        runs_as_gaps(req, ends, first)
        out.append((req, replica._live.pop(req.id), lost))
    if replica.on_kv is not None:
        replica.on_kv(replica.index, replica.kv.num_used, replica.kv.num_blocks)
    gpu = replica.gpu_process
    if gpu.is_alive:
        gpu.callbacks.append(_ended_quietly)
        gpu.interrupt("replica removed")
    replica.notify_memory()
    return out


def _ended_quietly(process) -> None:
    """A removed replica's GPU loop ended by its interrupt: not a failure of the run."""
    process.defused = True
