"""Choosing and carrying out preemptions, as methods the scheduler inherits.

Two triggers: a running request that cannot get a KV block (always on, as in vLLM) makes room by
preempting victims chosen by the victim policy; with ``preemption=True`` the best waiting request
that cannot get KV may preempt running requests the queue policy ranks below it (a policy's
``may_preempt(running, waiting)`` hook, where it has one, decides instead: MLFQ and fair share
use it to guard against preemption storms). A request
preempted ``max_num_preemptions`` times is protected while unprotected candidates exist, and when
every running request is protected the newest is evicted, so the oldest always finishes.
"""

from __future__ import annotations

from simsched.engine import swap
from simsched.request import PreemptionCause, Request, Status

WAITING, FINISHED = Status.WAITING, Status.FINISHED


class PreemptionMixin:
    """Preemption triggers and recompute preemption for :class:`~simsched.engine.scheduler.Scheduler`."""

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
            self._preempt(victim, "kv_full", None)
            if victim is req:
                return False
        return True

    def _preempt_for_admission(self, req: Request, need: int, slot: bool = False) -> bool:
        """Preempt requests ranked below ``req`` so it can be admitted; False if impossible.

        Frees ``need`` KV blocks beyond the watermark and, if ``slot``, a sequence slot.
        """
        key = (req.id, need, slot, self.running_version, tuple(self.planned))
        if self._memo_failed and key == self._failed_admission:
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
            below = self._may_preempt or self.queue.ranks_below
            candidates = [r for r in self.running.values()
                          if r.num_preemptions < cap and r.id not in planned and below(r, req)]
        kv = self.kv
        held = kv.num_held
        freeable = sum([held(r.id) for r in candidates])
        if not candidates or kv.num_free - kv.watermark_blocks + freeable < need:
            self._failed_admission = key
            return False  # preempting would not help: keep their work
        while not kv.can_allocate(need, use_watermark=True) or \
                (slot and len(self.running) >= self.cfg.max_num_seqs):
            if not candidates:
                return False    # shared prefix blocks stay held by others: it freed too little
            victim = self.choose_victim(candidates, self)
            candidates.remove(victim)
            self._preempt(victim, "admission", req.id)
        return True

    def _preempt(self, victim: Request, reason: str, by: int | None) -> None:
        """Preempt ``victim``: swap it out if configured and possible, else recompute.

        Recompute frees the victim's blocks and sends it back to the queue.
        """
        if victim.status is FINISHED:
            # plan_ahead: a request that finished in the running batch still holds its blocks
            # (vLLM's async scheduler preempts it, then drops it as finished): release them. It
            # counts as this step's preemption for the admission rule until the plan is made.
            self._release(victim)
            self.preempted.append((victim, None))
            return
        if self.swapping and swap.swap_out(self, victim, reason, by):
            return
        generated = self.num_generated(victim)
        cached = self.num_cached(victim)
        self._stop(victim)
        victim.num_generated = generated
        victim.num_computed = 0
        # Re-prefill the prompt and every token already generated; the next one is new.
        victim.prefill_target = victim.num_prompt_tokens + generated
        victim.status = WAITING
        victim.queued_at = self.now
        victim.num_preemptions += 1
        victim.num_recomputed_tokens += cached
        self._requeue.append(victim)
        self.preempted.append((victim, PreemptionCause(victim.id, reason, by, self.now, cached)))

    def _stop(self, victim: Request) -> None:
        """Take running ``victim`` off the GPU: end its decode run or prefill, free its blocks."""
        cached = self.num_cached(victim) if self.prefix_caching else 0
        if cached and self._plan_ahead and 0 <= victim.run_start_step <= self.step:
            # vLLM's async scheduler caches a decode block only once the token after it is
            # known: the KV of the last step's token is not cached yet.
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
