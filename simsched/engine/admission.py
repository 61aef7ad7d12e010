"""Prefill planning and admission, as methods the scheduler inherits.

Each iteration first continues the partial prefills of running requests (a chunk each while the
token budget lasts), then admits waiting requests in queue order: each admission takes the KV
blocks of its first chunk (with a prefix cache, after reusing the blocks of its cached prefix),
keeping a watermark of free blocks back while others run, and may preempt lower-ranked running
requests when the queue policy is preemptive (:mod:`simsched.engine.preemption`). An admission
that failed for want of KV blocks is remembered, so KV-bound iterations skip the scan while
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

    def _budget_left(self) -> int:
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
        budget = self._budget_left()
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
        cfg, kv, queue = self.cfg, self.kv, self._queue
        static = self._static
        prefix = self.prefix_caching
        reserved = 0  # static batching admits whole prompts' worth of blocks up front
        may_preempt, memo_ok = self._admit_flags    # see _update_special
        waiting, forget = self._waiting, self._forget
        while waiting:
            full = len(self.running) >= cfg.max_num_seqs
            if (full and not self.preemptive) or len(self.planned) >= self.max_num_prefills:
                break
            budget = cfg.max_num_batched_tokens - self.planned_tokens \
                - (len(self.decoding) if self._decodes_count else 0)      # _budget_left()
            if budget <= 0 and not static:
                break
            req = queue.peek()
            remaining = req.prefill_target
            if prefix:
                cached, hit, evictable = kv.match(req)
                remaining -= cached
            if self.chunking:
                chunk = remaining if remaining <= budget else budget if budget > 0 else 0
            elif remaining <= budget:
                chunk = remaining
            elif not self.planned and not (self._decodes_count and self.decoding):
                chunk = remaining               # an over-budget prompt runs alone, unchunked
            else:
                break
            if prefix:
                # Hit blocks are held already; taking evictable ones uses free blocks.
                need = kv.blocks_for(cached + (remaining if static else chunk)) - hit \
                    + evictable + reserved
            else:
                need = -(-(remaining if static else chunk) // self.block_size) + reserved
            # reserve_full_isl (vLLM's scheduler_reserve_full_isl): admit only if the whole
            # prompt's blocks are free, though only the first chunk's are taken now.
            check = need
            if cfg.reserve_full_isl and not static and chunk < remaining:
                done = cached if prefix else 0
                check += kv.blocks_for(done + remaining) - kv.blocks_for(done + chunk)
            # The watermark keeps headroom for running requests to grow; with none running it
            # would only block a request that fits the cache forever.
            if full or kv.num_free - check < (kv.watermark_blocks if self.running else 0):
                if not (may_preempt and self._preempt_for_admission(req, check, full)):
                    if not full and memo_ok:
                        self._kv_blocked = (self._num_pushed, self.num_admitted, kv.num_free,
                                            budget, bool(self.running), queue)
                    break
                if prefix:
                    continue        # the victims' released blocks change the match: look again
            if forget is None:
                queue.pop()
            else:
                del forget[req.id]
            req.status = RUNNING
            req.admitted_seq = self.num_admitted
            self.num_admitted += 1
            if req.first_scheduled_at != req.first_scheduled_at:  # NaN: first admission
                req.first_scheduled_at = self.now
                if prefix and req.content is not None:
                    req.content.num_cached_tokens = cached
            if prefix:
                kv.acquire(req, hit)
                req.num_computed = cached
                self.num_cached_tokens += cached
            self.running[req.id] = req
            self.running_version += 1
            self.prefilling[req.id] = req
            if prefix or static:
                done = req.num_computed            # cached tokens (0 without a prefix cache)
                if static:
                    reserved += kv.blocks_for(done + remaining) - kv.blocks_for(done + chunk)
                if chunk:
                    kv.allocate(req.id, done + chunk)
            elif chunk:
                kv.hold(req.id, need)              # holds nothing yet: its first chunk's blocks
            if chunk:
                self.planned[req.id] = (req, chunk)         # _plan(req, chunk), inlined
                self.planned_tokens += chunk
                if self.meter is not None:
                    self.meter.prefill(req, chunk)
