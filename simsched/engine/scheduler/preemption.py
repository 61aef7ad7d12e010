"""Choosing and carrying out preemptions, as methods the scheduler inherits.

Two triggers: a running request that cannot get a KV block (always on, as in vLLM) makes room by
preempting victims chosen by the victim policy; with ``preemption=True`` the best waiting request
that cannot get KV may preempt running requests the queue policy ranks below it (a policy's
``may_preempt(running, waiting)`` hook, where it has one, decides instead: MLFQ and fair share
use it to guard against preemption storms). A request
preempted ``max_num_preemptions`` times is protected while unprotected candidates exist, and when
every running request is protected the newest is evicted, so the oldest always finishes.

Decoders that need a block each (their group could not grow at once) take one by one here, as
the first trigger may fire for any of them (``_grow_each``). A victim is stopped (``_stop``: its
decode run closed or its planned chunk dropped, its blocks freed) and then recomputed (back to
the queue) or swapped out (:mod:`simsched.engine.scheduler.swap`).
"""

from __future__ import annotations

from simsched.request import PreemptionCause, Request, Status

WAITING, SWAPPED, FINISHED = Status.WAITING, Status.SWAPPED, Status.FINISHED


class _VictimSearch:
    """The owner of a failed admission preemption in the scheduler's memo of refusals
    (``Scheduler._blocked``, see :mod:`simsched.engine.scheduler.constraints`).

    Its stamp is ``((request id, blocks needed, slot needed, running-set version, planned ids),
    free blocks)``: with ranks that cannot turn against the request (fixed, or only improving),
    the search for victims fails again while the first part is unchanged and no more blocks are
    free (a candidate's growth takes free blocks but adds as many freeable ones; blocks freed
    without the running set changing, as a KV transfer's end frees them, may make it succeed).
    Asked before the admission scan, it cannot tell (the head's need is not known yet).
    """

    __slots__ = ()
    name = "admission_preemption"

    def still_blocked(self, sched, stamp) -> bool:
        return False


VICTIM_SEARCH = _VictimSearch()


def recompute_from_start(req: Request, generated: int, num_lost: int) -> None:
    """Make ``req`` recompute from scratch: prefill its prompt and the ``generated`` tokens it
    had again (the next one is new), ``num_lost`` tokens' KV counted as recomputed.

    The bookkeeping of a recompute preemption, shared with a decode replica's dropped KV
    transfer (:meth:`~simsched.engine.scheduler.handoff.HandoffMixin.drop_incoming`)."""
    req.num_generated = generated
    req.num_computed_tokens = 0
    req.prefill_target = req.num_prompt_tokens + generated
    req.num_recomputed_tokens += num_lost


class PreemptionMixin:
    """Preemption triggers, victims and stopping a request for
    :class:`~simsched.engine.scheduler.core.Scheduler`.

    The scheduler owns the state. This layer reads ``cfg``, ``kv``, ``choose_victim``, ``now``,
    ``step``, ``meter``, ``decoding``, ``swapping``, ``_queue``, ``_plan_ahead`` and the rank flags
    (``_static_ranks``, ``_memo_failed``, ``_may_preempt``); it changes ``running``,
    ``prefilling``, the plan (``planned``, ``planned_tokens``), ``running_version``,
    ``preempted``, ``_requeue``, ``_late``, ``swap_out_bytes``, the memo ``_blocked`` and the
    swap space (``swap``); ``_release`` gives a finished request's slot and blocks back (the
    scheduler's finish, and a finished request preempted under plan-ahead). It calls down into
    decode (``num_generated``, ``num_cached``, ``_close_run``) only.
    """

    __slots__ = ()

    def _make_room(self, req: Request, need: int) -> bool:
        """Preempt victims until ``need`` blocks are free for running ``req``; False if req went."""
        cap = self.cfg.max_num_preemptions
        while self.kv.num_free < need:
            running = list(self.running.values())
            # Requests preempted max_num_preemptions times are protected while others can go.
            candidates = [r for r in running if r.num_preemptions < cap]
            if candidates:
                victim = self.choose_victim(candidates, self)
            else:
                # All protected: evict the newest, so the oldest keeps its blocks and finishes
                # (a policy such as largest_kv would evict the most advanced one forever).
                victim = max(running, key=lambda r: r.admitted_seq)
            # vLLM schedules its running requests in order (admission order, as admitted_seq):
            # one ahead of req was scheduled this step before req asked for blocks (under the
            # priority policy it may be the victim), which cached its blocks of every known token.
            self._preempt(victim, "kv_full", None,
                          scheduled=victim is not req and victim.admitted_seq < req.admitted_seq)
            if victim is req:
                return False
        return True

    def _grow_late(self) -> None:
        """Give decoders that joined after their group's turn this step their block (the
        scheduler grows whole groups itself, once per step)."""
        late, self._late = self._late, []
        # Only runs that still go on (a run stopped and restarted since has its own blocks).
        self._grow_each([req for req, epoch in late if req.epoch == epoch])

    def _grow_each(self, decoders: list) -> None:
        """One block each, in order, preempting (victim policy) when the cache has none free."""
        kv, decoding = self.kv, self.decoding
        for req in decoders:
            if req.id not in decoding:
                continue                        # preempted by an earlier one's need
            if kv.num_free < 1 and not self._make_room(req, 1):
                continue                        # req itself was the victim
            kv.add_block(req.id)

    def _preempt_for_admission(self, req: Request, need: int, slot: bool = False) -> bool:
        """Preempt requests ranked below ``req`` so it can be admitted; False if impossible.

        Frees ``need`` KV blocks beyond the watermark and, if ``slot``, a sequence slot.
        """
        key = (req.id, need, slot, self.running_version, tuple(self.planned))
        blocked = self._blocked
        if self._memo_failed and blocked is not None and blocked[0] is VICTIM_SEARCH \
                and blocked[4][0] == key and self.kv.num_free <= blocked[4][1]:
            return False
        cap = self.cfg.max_num_preemptions
        planned = self.planned
        if self._static_ranks:
            # Hot under memory pressure: compare the fixed heap keys inline.
            key_req = req.sort_key
            candidates = [r for r in self.running.values()
                          if r.sort_key > key_req and r.num_preemptions < cap
                          and r.id not in planned]
        else:
            below = self._may_preempt or self._queue.ranks_below
            candidates = [r for r in self.running.values()
                          if r.num_preemptions < cap and r.id not in planned and below(r, req)]
        kv = self.kv
        held = kv.num_held
        freeable = sum([held(r.id) for r in candidates])
        if not candidates or kv.num_free - kv.watermark_blocks + freeable < need:
            if self._memo_failed:
                self._blocked = (VICTIM_SEARCH, None, None, None, (key, kv.num_free))
            return False  # preempting would not help: keep their work
        while not kv.can_allocate(need, use_watermark=True) or \
                (slot and len(self.running) >= self.cfg.max_num_seqs):
            if not candidates:
                return False    # shared prefix blocks stay held by others: it freed too little
            victim = self.choose_victim(candidates, self)
            candidates.remove(victim)
            self._preempt(victim, "admission", req.id)
        return True

    def _preempt(self, victim: Request, reason: str, by: int | None,
                 scheduled: bool = False) -> None:
        """Preempt ``victim``: swap it out if configured and possible, else recompute.

        Recompute frees the victim's blocks and sends it back to the queue (``scheduled``: the
        victim was scheduled earlier in this step, see :meth:`_stop`).
        """
        if victim.status is FINISHED:
            self._preempt_finished(victim, reason, by)
            return
        if self.swapping and self._swap_out(victim, reason, by):
            return
        generated = self.num_generated(victim)
        cached = self.num_cached(victim)
        self._stop(victim, cached, scheduled)
        # Re-prefill the prompt and every token already generated; the next one is new.
        recompute_from_start(victim, generated, cached)
        victim.status = WAITING
        victim.queued_at = self.now
        victim.num_preemptions += 1
        self._requeue.append(victim)
        self.preempted.append((victim, PreemptionCause(victim.id, reason, by, self.now, cached)))

    def _preempt_finished(self, victim: Request, reason: str, by: int | None) -> None:
        """plan_ahead: preempt ``victim``, which finished in the running batch (its last token is
        still in flight) and holds its blocks and slot until the plan is made.

        vLLM's async scheduler preempts such a request as any running one: it counts the
        preemption (``num_preemptions``, ``vllm:num_preemptions``), reports it in the step, frees
        its blocks (the in-flight token's block uncached, as its KV is not known yet) and stops
        the step's admissions; the batch's output then finishes it from the waiting queue, so it
        recomputes nothing. Its process has already ended: the entry carries no cause, so nobody
        interrupts it (the cause is noted on the request directly, and the request frame's
        stores hold back a finished request until its blocks are released, see
        :func:`simsched.request.awaits_release`)."""
        # A decoder's last token (finish_step set) was planned before the one ahead of it was
        # known, so vLLM cached only the blocks before it; a last token from a prefill was not.
        self._release(victim, in_flight=victim.finish_step >= 0)
        victim.num_preemptions += 1
        victim.note_preemption(PreemptionCause(victim.id, reason, by, self.now, 0))
        self.preempted.append((victim, None))

    def _swap_out(self, victim: Request, reason: str, by: int | None) -> bool:
        """Swap ``victim`` out to the CPU swap space (:mod:`simsched.engine.scheduler.swap`); False
        (nothing done) if it has no KV or the swap space is full."""
        cached = self.num_cached(victim)
        num_blocks = self.kv.blocks_for(cached)
        if cached == 0 or not self.swap.fits(num_blocks):
            return False
        self._stop(victim, cached)
        victim.num_computed_tokens = cached
        victim.status = SWAPPED
        victim.queued_at = self.now
        victim.num_preemptions += 1
        self.swap_out_bytes += self.swap.swap_out(victim, num_blocks)
        self.preempted.append((victim, PreemptionCause(victim.id, reason, by, self.now, 0,
                                                       mode="swap")))
        return True

    def _stop(self, victim: Request, cached: int, scheduled: bool = False) -> None:
        """Take running ``victim``, with ``cached`` tokens' KV, off the GPU: end its decode run
        or prefill, free its blocks (a prefix cache keeps those of its cached tokens).

        vLLM caches a decoder's full blocks when it schedules it, up to the tokens known then
        (``scheduled``: it was scheduled earlier in this step, before it became the victim), and
        otherwise when a step's output arrives, up to the tokens computed."""
        if cached and victim.run_start_step >= 0:
            if scheduled:
                # Every known token: the one the last step sampled too, whose KV is not computed
                # (with plan_ahead that token is still in flight, so the tokens computed).
                if not self._plan_ahead:
                    cached += 1
            elif self._plan_ahead and victim.run_start_step <= self.step:
                # plan_ahead: the last step's output is not in yet, so the KV of its token is
                # not cached.
                cached -= 1
        if victim.run_start_step >= 0:
            self._close_run(victim, self.step)
        else:
            self.prefilling.pop(victim.id, None)
            self._unplan(victim)
        del self.running[victim.id]
        self.running_version += 1
        self.kv.free(victim.id, cached)
        victim.epoch += 1
        victim.finish_step = -1

    def _release(self, req: Request, in_flight: bool = False) -> None:
        """Give a finished request's sequence slot and KV blocks back (``in_flight``: its last
        token's KV is not known yet, so the block it completes is not cached)."""
        del self.running[req.id]
        self.running_version += 1
        content = req.content
        if content is None:         # nothing a prefix cache could keep
            self.kv.free(req.id)
        else:
            # A prefix cache keeps the prompt's and output's blocks (the last token's KV is
            # never written); the content's memo of them is dead weight now.
            self.kv.free(req.id, req.num_prompt_tokens + req.num_output_tokens - 1 - in_flight)
            content.runs = None
        # Scheduling state is dead weight from now on: drop it (small ints are shared objects),
        # which keeps a million finished requests within memory.
        req.sort_key = None
        req.prefill_target = req.num_computed_tokens = req.ctx_base = req.finish_step = 0

    def _unplan(self, req: Request) -> None:
        entry = self.planned.pop(req.id, None)
        if entry is not None:
            self.planned_tokens -= entry[1]
            if self.meter is not None:
                self.meter.prefill(req, -entry[1])
