"""Prefill planning and admission, as methods the scheduler inherits.

Each iteration first continues the partial prefills of running requests (a chunk each while the
token budget lasts), then admits waiting requests in queue order while the admission
constraints (:mod:`simsched.engine.constraints`) allow: each admission takes the KV blocks of its
first chunk (with a prefix cache, after reusing the blocks of its cached prefix), keeping a
watermark of free blocks back while others run, and may preempt lower-ranked running requests
when the queue policy is preemptive or ``preemption=True`` (:mod:`simsched.engine.preemption`).
The last refusal of the queue's head is remembered, so KV-bound iterations skip the scan while
nothing it depends on has changed.
"""

from __future__ import annotations

from simsched.request import Request, Status

RUNNING = Status.RUNNING


class AdmissionMixin:
    """Prefill chunks and admissions for :class:`~simsched.engine.scheduler.Scheduler`."""

    __slots__ = ()

    def _may_admit(self) -> bool:
        # Swapped requests resume before new admissions, unless the policy ranks them lower.
        return not self.swapped or self.preemptive

    def budget_left(self) -> int:
        """Tokens of ``max_num_batched_tokens`` this iteration has not spent yet."""
        used = self.planned_tokens + (len(self.decoding) if self._decodes_count else 0)
        return self.cfg.max_num_batched_tokens - used

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
        chunk = min(req.prefill_target - req.num_computed, budget)
        need = kv.num_new_blocks(req.id, req.num_computed + chunk)
        if need > kv.num_free and not self._make_room(req, need):
            return True
        kv.allocate(req.id, req.num_computed + chunk)
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

    def _unplan(self, req: Request) -> None:
        entry = self.planned.pop(req.id, None)
        if entry is not None:
            self.planned_tokens -= entry[1]
            if self.meter is not None:
                self.meter.prefill(req, -entry[1])

    def _admit(self) -> None:
        """Admit waiting requests in queue order while every admission constraint allows
        (:mod:`simsched.engine.constraints`); the first refusal ends the scan, and is remembered
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
                for constraint in added:
                    if not constraint.admits(self, req, need):
                        self._refused(constraint)
                        return
            # KVBlocks (and a preemptible SeqSlots): the watermark keeps headroom for running
            # requests to grow; with none running it would only block a request that fits.
            if full or kv.num_free - need < (kv.watermark_blocks if self.running else 0):
                if not kv_blocks.preemptible:
                    if self._memo_kv:       # _refused(kv_blocks), with KVBlocks.stamp inlined
                        self._blocked = (kv_blocks, self._num_pushed, self.num_admitted, queue,
                                         (kv.num_free, budget, bool(self.running)))
                    return
                if not self._preempt_for_admission(req, need, full):
                    return
                if kv.prefix_caching:
                    # The victims' released blocks change a shared cache's match: look again.
                    # (Private blocks keep the chunk as sized, though a decoding victim freed
                    # a token of budget: results depend on it.)
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
                req.num_computed = cached
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
