"""TensorRT-LLM's batch scheduler: a capacity scheduler, then a micro-batch scheduler.

Written after TensorRT-LLM 1.x: ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp``
(``GuaranteedNoEvictScheduler::impl``, ``MaxUtilizationScheduler::operator()``,
``trySchedulingRequestMaxUtilization``, ``beneficialToSkip``),
``cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp`` (``MicroBatchScheduler::operator()``,
``setCtxRequestsChunkSize<kFIRST_COME_FIRST_SERVED>``) and the PyTorch executor's
``_schedule`` / ``_pause_requests`` (``tensorrt_llm/_torch/pyexecutor/``). Defaults: 1.x's
``LlmArgs`` (``max_batch_size`` 2048, ``max_num_tokens`` 8192, chunked prefill off,
``tokens_per_block`` 32, ``enable_block_reuse`` on, ``GUARANTEED_NO_EVICT``). Each step:

1. **Capacity** over the *active list* (every request in arrival order; a paused request keeps
   its place). ``GUARANTEED_NO_EVICT``: every generating request is kept and the blocks it needs
   to finish (prompt + ``max_new_tokens``, less what it holds) are set aside from the free
   blocks; then context requests, in order, while the blocks *they* need to finish fit, the
   first that does not ending the scan (no eviction is ever needed). ``MAX_UTILIZATION``:
   requests in order while this step's blocks fit (a generating request's next block, a context
   request's prompt blocks); when one does not, the last *started* request from there to the
   end of the list is paused (its blocks counted free) and the request is tried again; with none
   to pause the scan ends. A paused request is recomputed later: its KV is freed (block reuse
   keeps what it computed cached), it becomes a context request of its prompt and output so far.
   Both skip a first-chunk context request whose first uncached block another request scheduled
   in this step (or an executing chunked context) will compute (``beneficialToSkip``, with block
   reuse).
2. **Micro-batch** over the fitting requests (generating ones first, as the capacity scheduler
   lists them): at most ``max_batch_size`` requests; a generating request costs one token; an
   unchunked context costs its whole prompt and the first that does not fit within
   ``max_num_tokens`` ends the batch; with chunked context, contexts that do not all fit are cut
   first come first served to the tokens left, each cut to whole blocks (``chunkUnitSize`` =
   ``tokens_per_block``). Context and generation requests run in the same step.

Memory is simsched's block-granular KV cache with ``cache.block_size`` = ``tokens_per_block``
(block reuse: full blocks of equal content, the last prompt token always computed; TensorRT-LLM's
*partial* block reuse is not modelled). A prompt's blocks are taken chunk by chunk (TensorRT-LLM
takes them all at its first chunk); both capacity policies count all of them, so decisions agree
while the pool holds them. A generating request the micro-batch leaves out of a step (the token
budget ran out before it) sits that step out. Decisions are those of the executor without its
overlap scheduler, which hides CPU time (the ``trtllm`` engine profile); the replica applies
the pipeline's arrival rule for it, as the overlap loop delays a new request
(:func:`simsched.config.pipeline.arrival_rule`; on by default as in TensorRT-LLM, off with
``scheduler.async_scheduling=False``, its ``disable_overlap_scheduler``). With attention data
parallelism and ``engine_options.attention_dp_enable_balance``, each rank batches its own
requests and their contexts may be held back (:mod:`simsched.engine.engines.trtllm_adp`).
"""

from __future__ import annotations

from simsched.config.engines import engine_options
from simsched.engine.engines.trtllm_adp import AttentionDPBalance
from simsched.engine.scheduler.core import Scheduler, _new_batch
from simsched.cost.base import Batch
from simsched.request import PreemptionCause, Status

RUNNING, WAITING, FINISHED = Status.RUNNING, Status.WAITING, Status.FINISHED


class _Waiting:
    """The active list's not-yet-started requests, as the engine loop and checks read a queue."""

    def __init__(self, sched) -> None:
        self.sched = sched

    def push(self, req, now: float) -> None:
        sched = self.sched
        sched.active.append(req)
        sched.num_waiting_active += 1
        if sched.adp is not None:
            sched.adp.deal(req)

    def __len__(self) -> int:
        return self.sched.num_waiting_active

    def __bool__(self) -> bool:
        return self.sched.num_waiting_active > 0

    def __iter__(self):
        return (r for r in self.sched.active if r.status is WAITING)


class TRTLLMScheduler(Scheduler):
    """TensorRT-LLM 1.x's scheduling decisions over simsched's request state (module docstring).

    ``num_paused`` counts the requests ``MAX_UTILIZATION`` paused.
    """

    def __init__(self, cfg, kv, max_model_len=None, rng=None, attention_dp_size: int = 1,
                 **kwargs) -> None:
        super().__init__(cfg, kv, max_model_len, rng, **kwargs)
        opts = engine_options("trtllm", cfg.engine_options)
        self.policy = opts["capacity_scheduler_policy"]
        # Attention-DP context balancing (None: off, or one rank): trtllm_adp.
        self.adp = AttentionDPBalance(
            attention_dp_size, cfg.max_num_seqs, cfg.max_num_batched_tokens,
            opts["attention_dp_timeout_iters"], opts["attention_dp_batching_wait_iters"]) \
            if opts["attention_dp_enable_balance"] and attention_dp_size > 1 else None
        self.active: list = []
        self.num_waiting_active = 0
        self._queue = self._waiting = _Waiting(self)
        self._forget = None
        self.max_batch_size = cfg.max_num_seqs
        self.max_num_tokens = cfg.max_num_batched_tokens
        self.num_paused = 0
        self._sitting_out: dict = {}        # generating requests left out of this step

    def add(self, req, now: float) -> bool:
        """Queue an arrival, or reject one that could never be scheduled (too long for the
        model or the pool, or, unchunked, a prompt over ``max_num_tokens``)."""
        total = req.num_prompt_tokens + req.num_output_tokens
        if total > self.kv.num_blocks * self.kv.block_size or total > self._max_total:
            req.status = Status.REJECTED
            req.reject_reason = self._too_long(max(total, self.kv.num_blocks
                                                   * self.kv.block_size + 1))
            return False
        if not self.chunking and req.num_prompt_tokens > self.max_num_tokens:
            req.status = Status.REJECTED
            req.reject_reason = (f"prompt of {req.num_prompt_tokens} tokens exceeds max_num_tokens "
                                 f"{self.max_num_tokens} without chunked context")
            return False
        req.status = WAITING
        req.queued_at = now
        self._queue.push(req, now)
        self._num_pushed += 1
        return True

    def has_work(self) -> bool:
        return bool(self.active)

    # ----------------------------------------------------------------- one step
    def schedule(self, now: float) -> Batch:
        """Capacity, pauses, micro-batch; then the step's KV (admissions, decode growth)."""
        self.now = now
        self.planned_tokens = 0
        self.decode_step = 0
        if self.planned:
            self.planned = {}
        if self.preempted:
            self.preempted = []
        fitting, paused = (self._guaranteed_no_evict() if self.policy == "GUARANTEED_NO_EVICT"
                           else self._max_utilization())
        for req in paused:
            self._pause(req)
        adp = self.adp
        if adp is None:
            contexts, generation = self._micro_batch(fitting)
        else:
            # Each rank batches its own requests, then the ranks' contexts may be held back.
            contexts, generation = (
                self._micro_batch(fitting) if self.chunking else
                adp.micro_batch(fitting, self._is_generating))
            if not adp.admits(contexts, generation):
                contexts = []
        for req, chunk in contexts:
            self._schedule_context(req, chunk)
        self._schedule_generation(generation)
        return self._batch()

    def _is_generating(self, req) -> bool:
        return req.id in self.decoding or req.id in self._sitting_out

    def _remaining_blocks(self, req) -> int:
        """getRemainingBlocksToCompletion: blocks for prompt + max_new_tokens, less those held."""
        kv = self.kv
        return kv.blocks_for(req.num_prompt_tokens + req.num_output_tokens) - kv.num_held(req.id)

    def _guaranteed_no_evict(self) -> tuple[list, list]:
        avail = self.kv.num_free
        scheduled, pending = [], []
        contributed = self._executing_contexts()
        for req in self.active:
            if len(scheduled) >= self.max_batch_size:
                break
            if self._is_generating(req):
                scheduled.append(req)
                avail -= self._remaining_blocks(req)
            else:
                pending.append(req)
        for req in pending:
            if self._beneficial_to_skip(req, contributed):
                continue
            if len(scheduled) >= self.max_batch_size:
                break
            need = self._remaining_blocks(req)
            if need > avail:
                break                        # head-of-line: nobody overtakes it
            scheduled.append(req)
            avail -= need
        return scheduled, []

    def _one_step_blocks(self, req) -> int:
        """getNeededBlocksOneStep: a generating request's next block (if its next token starts
        one), a context request's prompt blocks it does not hold yet."""
        kv = self.kv
        if self._is_generating(req):
            return 1 if self.num_cached(req) % kv.block_size == 0 else 0
        return kv.blocks_for(req.prefill_target) - kv.num_held(req.id)

    def _max_utilization(self) -> tuple[list, list]:
        free = self.kv.num_free
        used = 0
        scheduled, paused = [], []
        contributed = self._executing_contexts()
        active = self.active
        i, end = 0, len(active)
        while i < end:
            req = active[i]
            if self._beneficial_to_skip(req, contributed):
                i += 1
                continue
            need = self._one_step_blocks(req)
            if len(scheduled) < self.max_batch_size and used + need <= free:
                used += need
                scheduled.append(req)
                i += 1
                continue
            j = next((k for k in range(end - 1, i - 1, -1) if self._started(active[k])), None)
            if j is None:
                break
            free += self.kv.num_held(active[j].id)   # schedulingRemoveSequence
            paused.append(active[j])
            end = j
        # The capacity scheduler lists them in the active list's order: generating requests
        # are those that started earlier, so they come first in the micro-batch's pass.
        return [r for r in scheduled if self._is_generating(r)] \
            + [r for r in scheduled if not self._is_generating(r)], paused

    def _started(self, req) -> bool:
        return self._is_generating(req) or (req.id in self.prefilling
                                            and req.num_computed_tokens > 0)

    def _executing_contexts(self) -> set | None:
        """Blocks the chunked contexts already executing will contribute (None: no reuse)."""
        if not self.kv.prefix_caching:
            return None
        return {self._block_key(req, req.num_computed_tokens // self.kv.block_size)
                for req in self.prefilling.values()}

    def _block_key(self, req, index: int):
        """The content identity of ``req``'s block ``index``: its last token's segment and the
        block's end (a request without content: its own)."""
        content, bs = req.content, self.kv.block_size
        end = min((index + 1) * bs, req.prefill_target)
        if content is None or not content.keys:
            return ("own", req.id, index)
        for key, seg_end in zip(content.keys, content.ends):
            if end <= seg_end:
                return key, end
        return content.output_key, end

    def _beneficial_to_skip(self, req, contributed) -> bool:
        """A first-chunk context whose first uncached block another request computes now."""
        if contributed is None or req.status is not WAITING:
            return False
        key = self._block_key(req, self.kv.match(req)[1])
        if key in contributed:
            return True
        contributed.add(key)
        return False

    def _micro_batch(self, fitting: list) -> tuple[list, list]:
        budget, bs = self.max_num_tokens, self.kv.block_size
        tokens = scheduled = 0
        contexts, generation, to_chunk = [], [], []
        num_chunked = 0
        for req in fitting:
            if not self._is_generating(req):
                remaining = req.prefill_target - req.num_computed_tokens
                if not self.chunking:
                    if tokens + req.prefill_target > budget:
                        break
                    contexts.append((req, remaining))
                    tokens += req.prefill_target
                else:
                    to_chunk.append([req, remaining])
                    num_chunked += remaining
            else:
                if tokens + 1 > budget:
                    break
                generation.append(req)
                tokens += 1
            scheduled += 1
            if scheduled >= self.max_batch_size:
                break
        if to_chunk and num_chunked > budget - tokens:      # setCtxRequestsChunkSize, FCFS
            capacity = budget - tokens
            for entry in to_chunk:
                actual = min(capacity, entry[1])
                if actual != entry[1]:
                    actual = actual // bs * bs
                entry[1] = actual
                capacity -= actual
        contexts += [(req, chunk) for req, chunk in to_chunk if chunk > 0]
        return contexts, generation

    # ----------------------------------------------------------------- carrying it out
    def _schedule_context(self, req, chunk: int) -> None:
        kv = self.kv
        if req.status is WAITING:
            cached = hit = evictable = 0
            if req.content is not None:
                cached, hit, evictable = kv.match(req)
            chunk = min(chunk, req.prefill_target - cached)
            need = kv.blocks_for(cached + chunk) - hit + evictable
            if need > kv.num_free:
                return                      # the pool lacks it after all: next step
            self.num_waiting_active -= 1
            req.status = RUNNING
            req.admitted_seq = self.num_admitted
            self.num_admitted += 1
            if req.first_scheduled_at != req.first_scheduled_at:   # NaN: first admission
                req.first_scheduled_at = self.now
                if cached:
                    req.content.num_cached_tokens = cached
            self.num_cached_tokens += cached
            req.num_computed_tokens = cached
            self.running[req.id] = req
            self.running_version += 1
            self.prefilling[req.id] = req
            kv.acquire(req, hit, cached + chunk)
        else:
            if kv.num_new_blocks(req.id, req.num_computed_tokens + chunk) > kv.num_free:
                return
            kv.allocate(req.id, req.num_computed_tokens + chunk)
        self._plan(req, chunk)

    def _schedule_generation(self, generation: list) -> None:
        """The step's generating requests decode; the others sit it out (their runs close)."""
        chosen = {req.id for req in generation}
        for req in list(self.decoding.values()):
            if req.id not in chosen:
                cached = self.num_cached(req)
                self._close_run(req, self.step)
                self.kv.leave_group(req.id)
                req.num_computed_tokens = cached
                self._sitting_out[req.id] = req
        for req in generation:
            if self._sitting_out.pop(req.id, None) is not None:
                self._start_run(req)
        step1 = self.step + 1
        if self.decoding and step1 != self._grown_step:
            self._grown_step = step1
            group = step1 % self.block_size
            members = self.growing[group]
            if members and not self.kv.grow_group(group, len(members)):
                self._grow_each(list(members.values()))
        if self._late:
            self._grow_late()
        self._decodes_count = True

    def _batch(self) -> Batch:
        batch = _new_batch(Batch)
        n_dec = len(self.decoding)
        if n_dec:
            self.decode_step = self.step + 1
            batch.decode_context_sum = self.ctx_base_sum + n_dec * self.decode_step
        else:
            batch.decode_context_sum = 0
        batch.num_decode_seqs = n_dec
        planned = self.planned
        batch.prefill_new_tokens = [chunk for _, chunk in planned.values()]
        batch.prefill_cached_tokens = [req.num_computed_tokens for req, _ in planned.values()]
        batch.swap_out_bytes = batch.swap_in_bytes = 0.0
        return batch

    def _pause(self, req) -> None:
        """``_pause_requests``: free its KV (reuse keeps what it computed cached); it stays in
        the active list as a context request of its prompt and output so far."""
        generated = self.num_generated(req)
        cached = self.num_cached(req)
        self._sitting_out.pop(req.id, None)
        self._stop(req, cached)
        req.num_generated = generated
        req.num_computed_tokens = 0
        req.prefill_target = req.num_prompt_tokens + generated
        req.status = WAITING
        req.queued_at = self.now
        req.num_preemptions += 1
        req.num_recomputed_tokens += cached
        self.num_waiting_active += 1
        self.num_paused += 1
        self.preempted.append((req, PreemptionCause(req.id, "kv_full", None, self.now, cached)))

    def _preempt(self, victim, reason: str, by) -> None:
        """A decode block the capacity scheduler's count missed (reuse can make free blocks
        evictable ones): the victim is paused as MAX_UTILIZATION pauses."""
        self._pause(victim)

    def _release(self, req) -> None:
        super()._release(req)
        self.active.remove(req)
        if self.adp is not None:
            self.adp.leave(req)
