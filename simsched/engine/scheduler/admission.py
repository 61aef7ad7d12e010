"""Prefill planning and admission, as methods the scheduler inherits.

Each iteration first continues the partial prefills of running requests (a chunk each while the
token budget lasts), then admits waiting requests in queue order while the admission
constraints (:mod:`simsched.engine.scheduler.constraints`) allow: each admission takes the KV blocks of its
first chunk (with a prefix cache, after reusing the blocks of its cached prefix), keeping a
watermark of free blocks back while others run, and may preempt lower-ranked running requests
when the queue policy is preemptive or ``preemption=True`` (:mod:`simsched.engine.scheduler.preemption`).
The last refusal of the queue's head is remembered, so KV-bound iterations skip the scan while
nothing it depends on has changed.
"""

from __future__ import annotations

from simsched.request import Request, Status

RUNNING = Status.RUNNING


class AdmissionMixin:
    """Prefill chunks, swap-ins and admissions for :class:`~simsched.engine.scheduler.core.Scheduler`.

    The scheduler owns the state (declared in ``Scheduler.__init__``). This layer reads ``cfg``,
    ``kv``, ``chunking``, ``max_num_prefills``, ``block_size``, ``preemptive``, ``meter``,
    ``now``, ``decoding``, ``_decodes_count``, ``_static``, the queue (``_queue``, ``_waiting``,
    ``_forget``, ``_num_pushed``) and the constraints (``_kv_blocks``, ``_added``,
    ``_memo_heads``, ``_memo_kv``); it changes the plan (``planned``, ``planned_tokens``),
    ``running``, ``prefilling``, ``num_admitted``, ``running_version``, ``num_cached_tokens``,
    ``swap_in_bytes`` and the memo ``_blocked``, and takes requests out of the queue and the
    swap space (``swap``, ``swapped``); ``add_constraint`` adds to ``constraints`` (and, for a
    constraint that skips, ``_skipped``, the requests a scan sets aside, and ``_admit``, which
    becomes :meth:`_admit_skipping`). It calls
    down into preemption (``_make_room``, ``_preempt_for_admission``) and decode
    (``_start_run``), never up.
    """

    __slots__ = ()

    def _may_admit(self) -> bool:
        # Swapped requests resume before new admissions, unless the policy ranks them lower.
        return not self.swapped or self.preemptive

    def budget_left(self) -> int:
        """Tokens of ``max_num_batched_tokens`` this iteration has not spent yet."""
        used = self.planned_tokens + (len(self.decoding) if self._decodes_count else 0)
        return self.cfg.max_num_batched_tokens - used

    def add_constraint(self, constraint) -> None:
        """Ask ``constraint`` (an :class:`~simsched.engine.scheduler.constraints.AdmissionConstraint`)
        before every admission: once the head of the queue's first chunk is sized, after the
        constraints added before it and before ``KVBlocks``. A constraint that ``skips``
        makes the scheduler admit with :meth:`_admit_skipping` from then on."""
        if constraint.preemptible:
            raise ValueError(f"admission constraint {constraint!r}: preemption frees only sequence "
                             "slots and KV blocks, so an added constraint cannot be preemptible")
        self.constraints.insert(len(self.constraints) - 1, constraint)   # KVBlocks stays last
        self._added += (constraint,)
        self._blocked = None
        if constraint.skips and self._skipped is None:
            # Decided once: schedulers without a skipping constraint never pay for skips.
            self._skipped = []
            self._admit = self._admit_skipping

    def _admit_skipping(self) -> None:
        """:meth:`_admit` where a refusal by a ``skips`` constraint sets the request aside and
        the scan goes on; the requests set aside go back into the queue with their keys."""
        AdmissionMixin._admit(self)
        skipped = self._skipped
        if skipped:
            restore = self._queue.restore
            for req in skipped:
                restore(req)
            skipped.clear()
            # A refusal remembered after a skip is not the queue head's: ask again next time.
            self._blocked = None

    def _admit_waiting(self) -> None:
        """Swap-ins first, then admissions, unless the last refusal of the queue's head would
        be made again: the queue as it was (nothing pushed or admitted since, fixed keys) and
        the refusing constraint still refusing (simsched.engine.scheduler.constraints). KV-bound runs
        spend many iterations with a refused head; those skip the admission scan."""
        if self.swapped:
            self._swap_in()
        if (not self.swapped or self.preemptive) and self._waiting \
                and (not self._static or not self.running):
            blocked = self._blocked
            if blocked is not None and blocked[1] == self._num_pushed \
                    and blocked[2] == self.num_admitted and blocked[3] is self._queue:
                if blocked[0] is self._kv_blocks:
                    # KVBlocks.still_blocked, inlined: asked in every iteration of a KV-bound
                    # stretch, where the call costs more than the question.
                    free, budget, running = blocked[4]
                    if self.kv.num_free <= free and bool(self.running) == running \
                            and self.cfg.max_num_batched_tokens - self.planned_tokens \
                            - (len(self.decoding) if self._decodes_count else 0) >= budget:
                        return
                elif blocked[0].still_blocked(self, blocked[4]):
                    return
            self._admit()

    def _swap_in(self) -> None:
        """Swap requests back in (:mod:`simsched.engine.scheduler.swap`), oldest swap first, while
        sequence slots, KV blocks and budget last.

        A decoder resumes its decode run in this iteration's decode step; a request swapped out
        in the middle of its prefill continues it. If nothing else runs, the watermark is waived
        so a swapped request can always come back.
        """
        kv, cfg, swapped, queue = self.kv, self.cfg, self.swapped, self._queue
        while swapped:
            req = next(iter(swapped.values()))
            if len(self.running) >= cfg.max_num_seqs:
                return
            if self.preemptive and queue and queue.ranks_below(req, queue.peek()):
                return  # a preemptive policy (MLFQ) runs a better waiting request first
            decoding = req.num_computed_tokens >= req.prefill_target
            if self.budget_left() < 1:
                return
            # A decoder's first step may start a new block: take it now (growth may have run).
            need = kv.blocks_for(req.num_computed_tokens + (1 if decoding else 0))
            if not kv.can_allocate(need, use_watermark=bool(self.running)):
                return
            self.swap_in_bytes += self.swap.swap_in(req, kv.blocks_for(req.num_computed_tokens))
            kv.acquire(req, 0, req.num_computed_tokens)   # a prefix cache registers them again
            req.status = RUNNING
            req.admitted_seq = self.num_admitted
            self.num_admitted += 1
            self.running[req.id] = req
            self.running_version += 1
            if decoding:
                self._start_run(req, resumed=True)
            else:
                self.prefilling[req.id] = req
                self._continue_prefill(req)

    def _continue_prefills(self) -> None:
        for req in list(self.prefilling.values()):
            if req.status is not RUNNING or req.id in self.planned:
                continue
            if not self._continue_prefill(req):
                break

    def _continue_prefill(self, req: Request) -> bool:
        """Plan the next chunk of running ``req``'s prefill; False once the iteration is full."""
        if len(self.planned) >= self.max_num_prefills:
            return False
        budget = self.budget_left()
        if budget <= 0:
            return False
        kv = self.kv
        chunk = min(req.prefill_target - req.num_computed_tokens, budget)
        need = kv.num_new_blocks(req.id, req.num_computed_tokens + chunk)
        if need > kv.num_free and not self._make_room(req, need):
            return True
        kv.allocate(req.id, req.num_computed_tokens + chunk)
        self._plan(req, chunk)
        return True

    def _refused(self, constraint) -> None:
        """Remember that ``constraint`` refused the queue's head, if it can say until when."""
        if self._memo_heads:
            stamp = constraint.stamp(self)
            if stamp is not None:
                self._blocked = (constraint, self._num_pushed, self.num_admitted, self._queue,
                                 stamp)

    def _plan(self, req: Request, chunk: int) -> None:
        self.planned[req.id] = (req, chunk)
        self.planned_tokens += chunk
        if self.meter is not None:
            self.meter.prefill(req, chunk)

    def _admit(self) -> None:
        """Admit waiting requests in queue order while every admission constraint allows
        (:mod:`simsched.engine.scheduler.constraints`); the first refusal ends the scan, and is remembered
        (``_blocked``) when its constraint can say until when.

        The built-in constraints are asked inline, in this order (their ``admits``, copied: a
        call each per admission would cost more than the rest of it): ``SeqSlots`` (unless a
        preemptive policy may free a slot), ``PrefillSlots`` and ``TokenBudget``; the head's
        first chunk is sized; then the added constraints, and last ``KVBlocks`` (with a
        preemptible ``SeqSlots``), as preemption may lift them.
        """
        cfg, kv, queue = self.cfg, self.kv, self._queue
        static = self._static
        reserved = 0  # static batching admits whole prompts' worth of blocks up front
        kv_blocks = self._kv_blocks
        added = self._added
        waiting, forget = self._waiting, self._forget
        while waiting:
            full = len(self.running) >= cfg.max_num_seqs                    # SeqSlots
            if (full and not self.preemptive) or len(self.planned) >= self.max_num_prefills:
                return                                                      # PrefillSlots
            budget = cfg.max_num_batched_tokens - self.planned_tokens \
                - (len(self.decoding) if self._decodes_count else 0)      # budget_left()
            if budget <= 0 and not static:                                  # TokenBudget
                return
            req = queue.peek()
            remaining = req.prefill_target
            cached = 0
            if req.content is not None:     # without an identity nothing matches: no call
                cached, hit, evictable = kv.match(req)
                if cached:
                    remaining -= cached
            if self.chunking:
                chunk = remaining if remaining <= budget else budget if budget > 0 else 0
            elif remaining <= budget:
                chunk = remaining
            elif not self.planned and not (self._decodes_count and self.decoding):
                chunk = remaining               # an over-budget prompt runs alone, unchunked
            else:
                return                          # the token budget cannot take it whole
            # kv.blocks_for(), inlined, and no arithmetic with a miss's zeros (new int objects,
            # per admission): hit blocks are held already; taking evictable ones uses free ones.
            if cached:
                need = -(-(cached + (remaining if static else chunk)) // self.block_size) \
                    - hit + evictable + reserved
            else:
                need = -(-(remaining if static else chunk) // self.block_size) + reserved
            if added:
                refused = None
                for constraint in added:
                    if not constraint.admits(self, req, need):
                        refused = constraint
                        break
                if refused is not None:
                    if not refused.skips:
                        self._refused(refused)
                        return
                    if forget is None:          # set aside (see _admit_skipping)
                        queue.pop()
                    else:
                        del forget[req.id]
                    self._skipped.append(req)
                    continue
            # reserve_full_isl (vLLM's scheduler_reserve_full_isl): admit only if the whole
            # prompt's blocks are free, though only the first chunk's are taken now.
            check = need
            if cfg.reserve_full_isl and not static and chunk < remaining:
                check += kv.blocks_for(cached + remaining) - kv.blocks_for(cached + chunk)
            # KVBlocks (and a preemptible SeqSlots): the watermark keeps headroom for running
            # requests to grow; with none running it would only block a request that fits.
            if full or kv.num_free - check < (kv.watermark_blocks if self.running else 0):
                if not kv_blocks.preemptible:
                    if self._memo_kv:       # _refused(kv_blocks), with KVBlocks.stamp inlined
                        self._blocked = (kv_blocks, self._num_pushed, self.num_admitted, queue,
                                         (kv.num_free, budget, bool(self.running)))
                    return
                if not self._preempt_for_admission(req, check, full):
                    return
                if kv.prefix_caching:
                    # The victims' released blocks change a shared cache's match: look again.
                    # With private blocks the chunk stays as sized (resizing it to the budget a
                    # decoding victim frees would change results).
                    continue
            if forget is None:
                queue.pop()
            else:
                del forget[req.id]
            req.status = RUNNING
            req.admitted_seq = self.num_admitted
            self.num_admitted += 1
            if req.first_scheduled_at != req.first_scheduled_at:  # NaN: first admission
                req.first_scheduled_at = self.now
                if cached:
                    req.content.num_cached_tokens = cached
            self.running[req.id] = req
            self.running_version += 1
            self.prefilling[req.id] = req
            if static:
                reserved += kv.blocks_for(cached + remaining) - kv.blocks_for(cached + chunk)
            if cached:          # the hit's tokens need no prefill
                req.num_computed_tokens = cached
                self.num_cached_tokens += cached
                kv.acquire(req, hit, cached + chunk if chunk else 0)
            elif req.content is None and chunk and not static:
                kv.hold(req.id, need)   # the common case: private blocks, as many as need says
            else:
                kv.acquire(req, 0, chunk)
            if chunk:
                self.planned[req.id] = (req, chunk)         # _plan(req, chunk), inlined
                self.planned_tokens += chunk
                if self.meter is not None:
                    self.meter.prefill(req, chunk)
