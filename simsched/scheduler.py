"""One iteration's scheduling decision: decodes, partial prefills, admissions, preemptions.

The scheduler is a plain object (no SimPy). The engine calls :meth:`Scheduler.schedule` at the
start of an iteration, which returns the :class:`~simsched.cost_model.Batch` to run, and
:meth:`Scheduler.commit` at its end, which advances progress and reports first tokens and
finished requests.

Decodes are advanced lazily. Every running decoder computes one token in every *decode step*
(the config guarantees the token budget covers ``max_num_seqs`` decodes), so one counter,
``step``, advances them all; a decoder's progress is its count at the start of its decode run
plus the steps since. The steps at which a decoder needs a new KV block or emits its last token
are known in advance and kept in calendar dicts, so an iteration costs O(events) rather than
O(batch), and never O(waiting queue).
"""

from __future__ import annotations

import math

from simsched.cost_model import Batch
from simsched.kv_cache import KVCacheManager
from simsched.policies import VICTIM_POLICIES, make_queue
from simsched.request import PreemptionCause, Request, Status

RUNNING, WAITING, FINISHED, REJECTED = (Status.RUNNING, Status.WAITING, Status.FINISHED,
                                        Status.REJECTED)


class Scheduler:
    """Stall-free continuous batching (Sarathi-Serve style) with a paged KV cache.

    ``style="prefill_first"`` runs prefill-only iterations whenever a waiting request can be
    admitted, without chunking (vLLM V0 / Orca); ``style="static"`` admits a new batch only when
    the previous one has fully finished.
    """

    def __init__(self, cfg, kv: KVCacheManager, max_model_len: int | None = None) -> None:
        self.cfg = cfg
        self.kv = kv
        self.block_size = kv.block_size
        self.max_model_len = max_model_len
        self.queue = make_queue(cfg.policy, cfg.policy_options)
        self.choose_victim = VICTIM_POLICIES[cfg.victim_policy]
        self.chunking = cfg.enable_chunked_prefill and cfg.style != "prefill_first"
        self.max_num_prefills = cfg.max_num_prefills or math.inf
        self.running: dict[int, Request] = {}     # admission order: the last is the newest
        self.decoding: dict[int, Request] = {}
        self.prefilling: dict[int, Request] = {}
        self.step = 0                             # decode steps completed
        self.step_end_at: list[float] = [math.nan]
        self.ctx_base_sum = 0                     # sum of decoders' ctx_base
        self.block_due: dict[int, list] = {}
        self.finish_due: dict[int, list] = {}
        self.num_admitted = 0
        self.num_preemptions = 0
        # this iteration's decision
        self.planned: dict[int, tuple] = {}       # id -> (request, prefill chunk)
        self.planned_tokens = 0
        self.decode_step = 0                      # the step this iteration runs, 0 if none
        self.preempted: list[tuple[Request, PreemptionCause]] = []
        self._decodes_count = True
        self._requeue: list[Request] = []
        self.now = 0.0

    # ----------------------------------------------------------------- lazy progress
    def num_generated(self, req: Request) -> int:
        """Output tokens ``req`` has emitted so far."""
        s0 = req.run_start_step
        if s0 < 0 or self.step < s0:
            return req.num_generated
        return req.num_generated + self.step - s0 + 1

    def num_cached(self, req: Request) -> int:
        """Tokens of ``req`` whose KV is in the cache."""
        if req.run_start_step >= 0:
            return req.ctx_base + self.step + 1
        return req.num_computed

    def has_work(self) -> bool:
        """Whether anything is waiting or running."""
        return bool(self.running) or bool(self.queue) or bool(self._requeue)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue."""
        return len(self.queue) + len(self._requeue)

    # ----------------------------------------------------------------- arrivals
    def add(self, req: Request, now: float) -> bool:
        """Queue an arriving request, or reject it (returns False) if it can never be served."""
        total = req.num_prompt_tokens + req.num_output_tokens
        kv = self.kv
        reason = ""
        if self.max_model_len is not None and total > self.max_model_len:
            reason = (f"prompt + output = {total} tokens exceeds max_model_len "
                      f"{self.max_model_len}")
        else:
            peak = total - 1  # the last token's KV is never written
            first = min(peak, self.cfg.max_num_batched_tokens) if self.chunking else peak
            if kv.blocks_for(peak) > kv.num_blocks:
                reason = (f"needs {kv.blocks_for(peak)} KV blocks, the cache has "
                          f"{kv.num_blocks}")
            elif kv.blocks_for(first) > kv.num_blocks - kv.watermark_blocks:
                reason = (f"first prefill chunk needs {kv.blocks_for(first)} KV blocks, "
                          f"{kv.num_blocks - kv.watermark_blocks} admissible")
        if reason:
            req.status = REJECTED
            req.reject_reason = reason
            return False
        req.status = WAITING
        req.queued_at = now
        self.queue.push(req, now)
        return True

    # ----------------------------------------------------------------- one iteration
    def schedule(self, now: float) -> Batch:
        """Decide the next iteration's batch (may preempt; see ``self.preempted``)."""
        self.now = now
        self.planned = {}
        self.planned_tokens = 0
        self.preempted = []
        self.decode_step = 0
        if self.cfg.style == "prefill_first":
            self._decodes_count = False
            self._admit()
            if not self.planned:
                self._decodes_count = True
                self._grow_decoders(self.step + 1)
        else:
            self._decodes_count = True
            self._grow_decoders(self.step + 1)
            self._continue_prefills()
            if self.cfg.style != "static" or not self.running:
                self._admit()
        for req in self._requeue:
            self.queue.push(req, now)
        self._requeue.clear()
        n_dec = len(self.decoding) if self._decodes_count else 0
        if n_dec:
            self.decode_step = self.step + 1
        batch = Batch((), (), n_dec, self.ctx_base_sum + n_dec * (self.step + 1) if n_dec else 0)
        for req, chunk in self.planned.values():
            batch.prefill_new_tokens.append(chunk)
            batch.prefill_cached_tokens.append(req.num_computed)
        return batch

    def _budget_left(self) -> int:
        used = self.planned_tokens + (len(self.decoding) if self._decodes_count else 0)
        return self.cfg.max_num_batched_tokens - used

    def _grow_decoders(self, s: int) -> None:
        """Give every decoder whose next token starts a new block that block (step ``s``)."""
        due = self.block_due.pop(s, None)
        if not due:
            return
        kv = self.kv
        for req, epoch in due:
            if req.epoch != epoch:
                continue                        # preempted since this was scheduled
            if kv.num_free < 1 and not self._make_room(req, 1):
                continue                        # req itself was the victim
            kv.add_block(req.id)
            nxt = s + self.block_size
            if nxt <= req.finish_step:
                self.block_due.setdefault(nxt, []).append((req, epoch))

    def _continue_prefills(self) -> None:
        kv = self.kv
        for req in list(self.prefilling.values()):
            if req.status is not RUNNING or req.id in self.planned:
                continue
            if len(self.planned) >= self.max_num_prefills:
                break
            budget = self._budget_left()
            if budget <= 0:
                break
            chunk = min(req.prefill_target - req.num_computed, budget)
            need = kv.num_new_blocks(req.id, req.num_computed + chunk)
            if need > kv.num_free and not self._make_room(req, need):
                continue
            kv.allocate(req.id, req.num_computed + chunk)
            self.planned[req.id] = (req, chunk)
            self.planned_tokens += chunk

    def _admit(self) -> None:
        cfg, kv, queue = self.cfg, self.kv, self.queue
        static = cfg.style == "static"
        reserved = 0  # static batching admits whole prompts' worth of blocks up front
        while queue:
            if len(self.running) >= cfg.max_num_seqs or len(self.planned) >= self.max_num_prefills:
                break
            budget = self._budget_left()
            if budget <= 0 and not static:
                break
            req = queue.peek()
            remaining = req.prefill_target
            if self.chunking:
                chunk = min(remaining, max(budget, 0))
            elif remaining <= budget:
                chunk = remaining
            elif not self.planned and not (self._decodes_count and self.decoding):
                chunk = remaining               # an over-budget prompt runs alone, unchunked
            else:
                break
            need = kv.blocks_for(remaining if static else chunk) + reserved
            if not kv.can_allocate(need, use_watermark=True):
                if not (cfg.preemption and self._preempt_for_admission(req, need)):
                    break
            queue.pop()
            req.status = RUNNING
            req.admitted_seq = self.num_admitted
            self.num_admitted += 1
            if req.first_scheduled_at != req.first_scheduled_at:  # NaN: first admission
                req.first_scheduled_at = self.now
            self.running[req.id] = req
            self.prefilling[req.id] = req
            if static:
                reserved += kv.blocks_for(remaining) - kv.blocks_for(chunk)
            if chunk:
                kv.allocate(req.id, chunk)
                self.planned[req.id] = (req, chunk)
                self.planned_tokens += chunk

    # ----------------------------------------------------------------- preemption
    def _make_room(self, req: Request, need: int) -> bool:
        """Preempt victims until ``need`` blocks are free for running ``req``; False if req went."""
        cap = self.cfg.max_num_preemptions
        while self.kv.num_free < need:
            running = list(self.running.values())
            # Requests preempted too often are protected, so every request eventually finishes.
            candidates = [r for r in running if r.num_preemptions < cap] or running
            victim = self.choose_victim(candidates, self)
            self._preempt(victim, "kv_full", None)
            if victim is req:
                return False
        return True

    def _preempt_for_admission(self, req: Request, need: int) -> bool:
        """Preempt requests ranked below ``req`` so it can be admitted; False if impossible."""
        cap = self.cfg.max_num_preemptions
        ranks_below = self.queue.ranks_below
        candidates = [r for r in self.running.values()
                      if r.num_preemptions < cap and r.id not in self.planned
                      and ranks_below(r, req)]
        if not candidates:
            return False
        kv = self.kv
        freeable = sum(kv.num_held(r.id) for r in candidates)
        if kv.num_free - kv.watermark_blocks + freeable < need:
            return False  # preempting would not help: keep their work
        while not kv.can_allocate(need, use_watermark=True):
            victim = self.choose_victim(candidates, self)
            candidates.remove(victim)
            self._preempt(victim, "admission", req.id)
        return True

    def _preempt(self, victim: Request, reason: str, by: int | None) -> None:
        """Recompute preemption: free the victim's blocks and send it back to the queue."""
        generated = self.num_generated(victim)
        cached = self.num_cached(victim)
        if victim.run_start_step >= 0:
            self._close_run(victim, self.step)
        else:
            self.prefilling.pop(victim.id, None)
            entry = self.planned.pop(victim.id, None)
            if entry is not None:
                self.planned_tokens -= entry[1]
        del self.running[victim.id]
        self.kv.free(victim.id)
        victim.num_generated = generated
        victim.epoch += 1
        victim.finish_step = -1
        victim.num_computed = 0
        # Re-prefill the prompt and every token already generated; the next one is new.
        victim.prefill_target = victim.num_prompt_tokens + generated
        victim.status = WAITING
        victim.queued_at = self.now
        victim.num_preemptions += 1
        victim.num_recomputed_tokens += cached
        self.num_preemptions += 1
        self._requeue.append(victim)
        self.preempted.append((victim, PreemptionCause(victim.id, reason, by, self.now, cached)))

    def _close_run(self, req: Request, last_step: int) -> None:
        """End ``req``'s decode run after step ``last_step``."""
        if last_step >= req.run_start_step:
            req.runs.append((req.last_token_at, req.run_start_step, last_step))
            req.last_token_at = self.step_end_at[last_step]
        req.num_generated += max(0, last_step - req.run_start_step + 1)
        del self.decoding[req.id]
        self.ctx_base_sum -= req.ctx_base
        req.run_start_step = -1

    # ----------------------------------------------------------------- end of iteration
    def commit(self, now: float) -> tuple[list[Request], list[Request]]:
        """Apply the iteration that just ended at ``now``: (first-token requests, finished)."""
        firsts: list[Request] = []
        finished: list[Request] = []
        s = self.decode_step
        if s:
            self.step = s
            self.step_end_at.append(now)
            due = self.finish_due.pop(s, None)
            if due:
                for req, epoch in due:
                    if req.epoch == epoch and req.run_start_step >= 0:
                        self._close_run(req, s)
                        self._finish(req, now, finished)
        for req, chunk in self.planned.values():
            req.num_computed += chunk
            if req.num_computed < req.prefill_target:
                continue
            del self.prefilling[req.id]
            req.num_generated += 1
            if req.first_token_at != req.first_token_at:  # NaN: this is the first token
                req.first_token_at = now
                firsts.append(req)
            else:
                req.gaps.append(now - req.last_token_at)  # stall of a recomputed request
            req.last_token_at = now
            if req.num_generated >= req.num_output_tokens:
                self._finish(req, now, finished)
            else:
                self._start_run(req)
        self.planned = {}
        return firsts, finished

    def _start_run(self, req: Request) -> None:
        """Make ``req`` a decoder from the next decode step on."""
        s1 = self.step + 1
        cached = req.num_computed
        req.run_start_step = s1
        req.ctx_base = cached - s1
        self.ctx_base_sum += req.ctx_base
        req.finish_step = s1 + req.num_output_tokens - req.num_generated - 1
        self.decoding[req.id] = req
        self.finish_due.setdefault(req.finish_step, []).append((req, req.epoch))
        first_block = s1 + (-cached) % self.block_size
        if first_block <= req.finish_step:
            self.block_due.setdefault(first_block, []).append((req, req.epoch))

    def _finish(self, req: Request, now: float, finished: list) -> None:
        req.status = FINISHED
        req.finished_at = now
        req.num_generated = req.num_output_tokens
        del self.running[req.id]
        self.kv.free(req.id)
        finished.append(req)

    def close(self) -> None:
        """Freeze lazy progress of requests still running when the run stops."""
        for req in list(self.decoding.values()):
            self._close_run(req, self.step)
            req.num_computed = req.num_prompt_tokens + req.num_generated - 1
