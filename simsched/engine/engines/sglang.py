"""SGLang's scheduler step: ``get_next_batch_to_run`` with prefill and decode in separate batches.

Written after SGLang 0.5.9's ``python/sglang/srt/managers/scheduler.py`` (``Scheduler``:
``get_next_batch_to_run``, ``get_new_batch_prefill`` / ``_get_new_batch_prefill_raw``,
``update_running_batch``, the ``new_token_ratio`` terms of ``__init__``) and
``managers/schedule_batch.py`` (``ScheduleBatch.check_decode_mem``, ``retract_decode``,
``release_req``; ``Req.init_next_round_input``), with :mod:`~simsched.engine.engines.sglang_policy`
(``SchedulePolicy``, ``PrefillAdder``) and :mod:`~simsched.engine.engines.radix_cache`
(``RadixCache``). Each step:

1. **Prefill first.** Unless the running batch is marked full (or nothing waits) and no request
   is mid-chunk, the queue is ordered (``SchedulePolicy.calc_priority``), the chunked request's
   next chunk goes first, then waiting requests in order, each matched against the radix cache
   (all but its last token), while ``PrefillAdder`` admits them and fewer than
   ``max_running_requests`` run. Running out of tokens (``NO_TOKEN``) or of request slots marks
   the batch full; only a request leaving it (a finish, a retraction, a filtered prefill) clears
   the mark. If anything was admitted, the step is that prefill batch alone; with
   ``--enable-mixed-chunk`` (``engine_options.enable_mixed_chunk``) the running requests decode
   one token each in it too (``mix_with_running``), their tokens taken from the batch's budgets
   first, without a memory check or a ``new_token_ratio`` decay (SGLang does neither there).
2. **Else decode.** ``check_decode_mem``: each running request needs one token (page size 1),
   evicting cached tokens if needed. If they are not there, ``retract_decode`` retracts the
   request with the fewest output tokens (ties: the longest prompt) until they are, keeping at
   least one; a retracted request frees the tokens it decoded (its prefilled ones stay cached),
   goes to the end of the waiting queue and later re-prefills its prompt and output so far.
   ``new_token_ratio`` is then reset to ``(decoded + 20 x running) / (max_new_tokens + 1)``
   (at most 1); a decode step without retraction decays it by
   ``(init - min) / 600`` down to ``min`` (init 0.7 x ``schedule_conservativeness``, min 0.14 x
   init: SGLang's environment defaults).

The step's decisions are those of SGLang's normal event loop (``event_loop_normal``). SGLang's
default overlap loop forms step k + 1 before it processes step k's results and new requests: it
hides CPU time (the ``sglang`` engine profile), and the replica applies the pipeline's arrival
rule for it (:func:`simsched.config.pipeline.arrival_rule`; on by default as in SGLang, off
with ``scheduler.async_scheduling=False``, SGLang's ``--disable-overlap-schedule``).
``max_running_requests`` is ``max_num_seqs``
capped as SGLang derives it from its pool: ``min(tokens // 2, clamp(tokens / context length x
512, 2048, 4096))``. Decodes advance lazily, as the vLLM scheduler's (the base class keeps
progress, growth and recording); only the decisions differ.
"""

from __future__ import annotations

from simsched.config.engines import engine_options
from simsched.engine.engines.sglang_policy import AddReqResult, PrefillAdder, SchedulePolicy
from simsched.engine.scheduler.core import Scheduler, _new_batch
from simsched.cost.base import Batch
from simsched.request import PreemptionCause, Status

RUNNING, WAITING, FINISHED = Status.RUNNING, Status.WAITING, Status.FINISHED


class WaitingQueue(list):
    """SGLang's ``waiting_queue`` (a list) with the push the engine's loop calls."""

    def push(self, req, now: float) -> None:
        self.append(req)


class SGLangScheduler(Scheduler):
    """SGLang 0.5.9's scheduling decisions over simsched's request state (module docstring).

    ``kv`` is a :class:`~simsched.engine.engines.radix_cache.RadixCache` (``disable=True``
    without prefix caching). ``num_retracted`` counts retractions.
    """

    def __init__(self, cfg, kv, max_model_len=None, rng=None, **kwargs) -> None:
        super().__init__(cfg, kv, max_model_len, rng, **kwargs)
        opts = engine_options("sglang", cfg.engine_options)
        self.waiting_queue = WaitingQueue()
        self._queue = self._waiting = self.waiting_queue
        self._forget = None
        self.tree_cache = kv
        self.policy = SchedulePolicy(opts["schedule_policy"], kv, opts)
        self.chunked_prefill_size = cfg.max_num_batched_tokens \
            if cfg.enable_chunked_prefill else None
        self.max_prefill_tokens = opts["max_prefill_tokens"]
        # SGLang mixes only with chunked prefill on (Scheduler.is_mixed_chunk).
        self.is_mixed_chunk = opts["enable_mixed_chunk"] and self.chunked_prefill_size is not None
        # A prefill batch's most tokens (a longer unchunked prompt runs alone).
        self.batch_token_limit = self.chunked_prefill_size or self.max_prefill_tokens
        self.clip_max_new_tokens = opts["clip_max_new_tokens"]
        self.retract_decode_steps = opts["retract_decode_steps"]
        tokens = kv.num_blocks
        context = max_model_len or tokens
        derived = min(tokens // 2, min(max(int(tokens / context * 512), 2048), 4096))
        self.max_running_requests = max(1, min(cfg.max_num_seqs, derived))
        self.init_new_token_ratio = min(opts["init_new_token_ratio"]
                                        * opts["schedule_conservativeness"], 1.0)
        self.min_new_token_ratio = min(self.init_new_token_ratio
                                       * opts["min_new_token_ratio_factor"], 1.0)
        self.new_token_ratio_decay = (self.init_new_token_ratio - self.min_new_token_ratio) \
            / opts["new_token_ratio_decay_steps"]
        self.new_token_ratio = self.init_new_token_ratio
        self.chunked_req = None
        self.batch_is_full = False
        self.num_retracted = 0
        self._unfiltered = 0        # decoders finished since the running batch was filtered
        self._shrank = False        # the last prefill batch lost requests when filtered

    # ----------------------------------------------------------------- arrivals
    def add(self, req, now: float) -> bool:
        """Queue an arrival, or reject one SGLang could never schedule (too long for the model,
        or its prompt and clipped output at least the whole token pool)."""
        total = req.num_prompt_tokens + req.num_output_tokens
        clipped = req.num_prompt_tokens + min(req.num_output_tokens, self.clip_max_new_tokens)
        if total > self._max_total or clipped >= self.kv.num_blocks:
            req.status = Status.REJECTED
            req.reject_reason = self._too_long(max(total, clipped + 1))
            return False
        req.status = WAITING
        req.queued_at = now
        self.waiting_queue.append(req)
        self._num_pushed += 1
        return True

    def has_work(self) -> bool:
        return bool(self.running or self.waiting_queue)

    # ----------------------------------------------------------------- one step
    def schedule(self, now: float) -> Batch:
        """``get_next_batch_to_run``: a prefill batch if one can be formed, else a decode
        step (which may retract; the victims are in ``preempted``)."""
        self.now = now
        self.planned_tokens = 0
        self.decode_step = 0
        if self.planned:
            self.planned = {}
        if self.preempted:
            self.preempted = []
        if self._shrank:                    # last_batch.filter_batch() shrank it
            self._shrank = False
            self.batch_is_full = False
        self._decodes_count = False
        # The running batch still holds the decoders that finished in the last step until it
        # is filtered (update_running_batch): not empty while they are there.
        if not self.get_new_batch_prefill() and (self.decoding or self._unfiltered):
            self.update_running_batch()
        return self._batch()

    def _batch(self) -> Batch:
        batch = _new_batch(Batch)
        n_dec = len(self.decoding) if self._decodes_count else 0
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

    def get_new_batch_prefill(self) -> bool:
        """``_get_new_batch_prefill_raw``: plan a prefill batch; False if none."""
        if (self.batch_is_full or not self.waiting_queue) and self.chunked_req is None:
            return False
        running = list(self.decoding.values())
        running_bs = len(running) + self._unfiltered
        allocatable = self.max_running_requests - running_bs
        if allocatable <= 0 and self.chunked_req is not None:
            self.batch_is_full = True
            return False
        queue = self.waiting_queue
        self.policy.calc_priority(queue)
        adder = PrefillAdder(self, running, self.new_token_ratio, self.max_prefill_tokens,
                             self.chunked_prefill_size,
                             running_bs if self.is_mixed_chunk else 0)
        if self.chunked_req is not None:
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        tree = self.tree_cache
        for req in queue:
            if len(adder.can_run_list) >= allocatable:
                self.batch_is_full = True
            if self.batch_is_full:
                break
            # init_next_round_input: match all but the last token (one is always computed).
            prefix_len, last_node = tree.match_prefix(
                tree.stream(req, req.prefill_target - 1))
            res = adder.add_one_req(req, prefix_len, last_node)
            if res is not AddReqResult.CONTINUE:
                if res is AddReqResult.NO_TOKEN:
                    self.batch_is_full = True
                break
        can_run = adder.can_run_list
        if not can_run:
            return False
        admitted = {req.id for req, _, _ in can_run}
        queue[:] = [r for r in queue if r.id not in admitted]
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        # prepare_for_extend: the batch's new tokens in one allocation (evicting first).
        tree.evict_from_tree_cache(sum(chunk for _, chunk, _ in can_run))
        for req, chunk, prefix_len in can_run:
            if req.status is not RUNNING:
                self._admit_one(req, prefix_len)
            tree.alloc(req.id, chunk)
            self.planned[req.id] = (req, chunk)
            self.planned_tokens += chunk
        if self.is_mixed_chunk and running_bs:
            # Mixed-style chunked prefill: filter the running batch, then its requests decode
            # in this batch (prepare_for_decode, mix_with_running).
            self._unfiltered = 0
            if self.decoding:
                self.tree_cache.evict_from_tree_cache(len(self.decoding))  # alloc_token_slots
                self._grant_decode()
        return True

    def _admit_one(self, req, prefix_len: int) -> None:
        req.status = RUNNING
        req.admitted_seq = self.num_admitted
        self.num_admitted += 1
        if req.first_scheduled_at != req.first_scheduled_at:      # NaN: first admission
            req.first_scheduled_at = self.now
            if prefix_len and req.content is not None:
                req.content.num_cached_tokens = prefix_len
        self.num_cached_tokens += prefix_len
        req.num_computed_tokens = prefix_len
        self.running[req.id] = req
        self.running_version += 1
        self.prefilling[req.id] = req

    def update_running_batch(self) -> None:
        """Filter the running batch, check decode memory (retracting if short), update
        ``new_token_ratio`` and grant the step's tokens."""
        initial_bs = len(self.decoding) + self._unfiltered
        self._unfiltered = 0
        if not self.decoding:               # filter_batch left it empty
            self.batch_is_full = False
            return
        if not self.check_decode_mem(len(self.decoding)):
            self.new_token_ratio = self.retract_decode()
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay,
                                       self.min_new_token_ratio)
        if len(self.decoding) < initial_bs:
            self.batch_is_full = False
        self._grant_decode()

    def _grant_decode(self) -> None:
        """The step's decode token for each running request (``prepare_for_decode``)."""
        step1 = self.step + 1
        self._grown_step = step1
        members = self.growing[0]
        if members and not self.kv.grow_group(0, len(members)):
            raise RuntimeError(f"decode step {step1}: {len(members)} tokens not available "
                               "after check_decode_mem")
        self._decodes_count = True

    def check_decode_mem(self, num_reqs: int) -> bool:
        """One token per decoding request (page size 1), evicting cached tokens if needed."""
        self.tree_cache.evict_from_tree_cache(num_reqs)
        return self.tree_cache.available_size() >= num_reqs

    def retract_decode(self) -> float:
        """Retract decoders until the rest can decode (at least one is kept); return the new
        ``new_token_ratio``."""
        reqs = list(self.decoding.values())
        generated = self.num_generated
        order = sorted(range(len(reqs)),
                       key=lambda i: (generated(reqs[i]), -reqs[i].num_prompt_tokens),
                       reverse=True)
        first = True
        while first or not self.check_decode_mem(len(order)):
            if len(order) == 1:
                break
            first = False
            self._retract(reqs[order.pop()])
            self.tree_cache.evict_from_tree_cache(len(order) * self.retract_decode_steps)
        if len(order) <= 1 and not self.check_decode_mem(len(order)):
            raise RuntimeError("out of memory even after retracting all other requests in the "
                               "decode batch")
        kept = [reqs[i] for i in order]
        # filter_batch(keep_indices=...) keeps them in the sorted order: later ties and sums
        # follow it.
        self.decoding = {r.id: r for r in kept}
        decoded = sum(generated(r) for r in kept)
        max_new = sum(r.num_output_tokens for r in kept)
        return min(1.0, (decoded + self.retract_decode_steps * len(kept)) / (max_new + 1))

    def _retract(self, req) -> None:
        """``release_req``: free what ``req`` decoded (its prefill stays cached) and queue it to
        prefill its prompt and output so far again."""
        generated = self.num_generated(req)
        cached = self.num_cached(req)
        self._close_run(req, self.step)
        del self.running[req.id]
        self.running_version += 1
        self.tree_cache.cache_finished_req(req, 0, is_insert=False)
        req.epoch += 1
        req.finish_step = -1
        req.num_generated = generated
        req.num_computed_tokens = 0
        req.prefill_target = req.num_prompt_tokens + generated
        req.status = WAITING
        req.queued_at = self.now
        req.num_preemptions += 1
        req.num_recomputed_tokens += cached
        self.num_retracted += 1
        self.waiting_queue.append(req)
        self._num_pushed += 1
        self.preempted.append((req, PreemptionCause(req.id, "kv_full", None, self.now, cached)))

    # ----------------------------------------------------------------- end of a step
    def commit(self, now: float):
        """Apply the step; after a prefill batch its requests' tokens enter the radix tree
        (``cache_unfinished_req``), so later requests match them."""
        planned = list(self.planned.values()) if self.planned else ()
        decoded = self.decode_step != 0
        firsts, finished = super().commit(now)
        shrank = False
        if decoded and finished:
            if planned:
                shrank = True           # a mixed batch: filtered when merged back (last_bs)
            else:
                self._unfiltered += len(finished)
        for req, _ in planned:
            if req.status is RUNNING:
                self.tree_cache.cache_unfinished_req(req, req.num_computed_tokens)
                shrank = shrank or req.id in self.prefilling      # the chunked request
            else:
                shrank = True                                      # finished at its prefill
        self._shrank = shrank
        if self._unfiltered and not self.running and not self.waiting_queue:
            # Idle: SGLang's loop keeps calling get_next_batch_to_run, whose
            # update_running_batch filters the finished requests out at once.
            self._unfiltered = 0
            self.batch_is_full = False
        return firsts, finished

    def _release(self, req) -> None:
        """A finished request's prompt and output (but its last token) go into the tree."""
        del self.running[req.id]
        self.running_version += 1
        kv = self.tree_cache
        kv.cache_finished_req(req, req.num_prompt_tokens + req.num_output_tokens - 1)
        kv.forget(req.id)
        req.sort_key = None
        req.prefill_target = req.num_computed_tokens = req.ctx_base = req.finish_step = 0
