"""SGLang's waiting-queue order and prefill budget: ``SchedulePolicy`` and ``PrefillAdder``.

Written after SGLang 0.5.9's ``python/sglang/srt/managers/schedule_policy.py``:

* :class:`SchedulePolicy` (``calc_priority``): ``fcfs`` leaves the queue as it is (arrival
  order, retracted requests appended); ``lpm`` (longest prefix match) matches every waiting
  request's whole token stream against the radix cache and sorts by the longest match, first
  putting off a request whose match is short (at most 32 tokens) but which shares at least 32
  tokens with a request already seen in this pass (the in-batch prefix check: one of a group
  that shares a new prefix runs first, so the others hit it); ``lpm`` falls back to ``fcfs``
  when more than 128 requests wait; ``dfs-weight`` orders the queue by a depth-first walk of
  the radix tree, heavier subtrees (more waiting requests ending there) first; ``lof`` puts the
  longest ``max_new_tokens`` first. A cache-aware policy without the radix cache is ``fcfs``.
  Sorts are Python's stable sorts of the queue in place, as SGLang's, so ties keep the order
  the queue had.
* :class:`PrefillAdder` (``add_chunked_req``, ``add_one_req``, ``budget_state``,
  ``_update_prefill_budget``): a prefill batch spends at most ``max_prefill_tokens`` new tokens
  (``rem_input_tokens``) and ``chunked_prefill_size`` (``rem_chunk_tokens``), and admits a
  request only while ``rem_total_tokens`` (available + evictable tokens, less every running
  request's remaining ``max_new_tokens`` x ``new_token_ratio`` and each admitted request's
  prompt plus ``max_new_tokens``, clipped at 4096) exceeds what it asks; the prompt that does
  not fit the chunk is cut to it and becomes the chunked request.

``max_new_tokens`` is the request's output length: a benchmark client sets ``max_tokens`` to
it (with ``ignore_eos``), which simsched knows. The ``ignore_eos`` admission path SGLang takes
without a radix cache (``add_one_req_ignore_eos``) is not modelled.
"""

from __future__ import annotations

from enum import Enum, auto


class AddReqResult(Enum):
    """``PrefillAdder``'s answer: go on, out of tokens (the batch is full), or stop here."""

    CONTINUE = auto()
    NO_TOKEN = auto()
    OTHER = auto()


class SchedulePolicy:
    """The waiting queue's order (module docstring); ``prefix`` keeps each request's match."""

    def __init__(self, policy: str, tree_cache, options: dict) -> None:
        if policy in ("lpm", "dfs-weight") and tree_cache.disable:
            policy = "fcfs"                 # _validate_and_adjust_policy
        self.policy = policy
        self.tree_cache = tree_cache
        self.threshold = options["in_batch_prefix_threshold"]
        self.lpm_max_queue = options["lpm_max_queue"]
        self.prefix: dict[int, tuple] = {}  # request id -> (matched tokens, last node)

    def calc_priority(self, waiting_queue: list) -> None:
        """Sort ``waiting_queue`` in place by the policy."""
        policy = self.policy
        if policy == "fcfs":
            return
        if policy == "lpm" and len(waiting_queue) > self.lpm_max_queue:
            return                          # _determine_active_policy: fcfs
        if policy == "lof":
            waiting_queue.sort(key=lambda r: -r.num_output_tokens)
            return
        deprioritized = self._compute_prefix_matches(waiting_queue)
        prefix = self.prefix
        if policy == "lpm":
            waiting_queue.sort(key=lambda r: float("inf") if r.id in deprioritized
                               else -prefix[r.id][0])
        else:
            self._sort_by_dfs_weight(waiting_queue)

    def _compute_prefix_matches(self, waiting_queue: list) -> set:
        """Match each waiting request's whole stream (prompt and output so far); the in-batch
        check against a tree of the requests seen in this pass."""
        from simsched.engine.engines.radix_cache import RadixCache

        tree = self.tree_cache
        seen = RadixCache(1 << 40)          # waiting_queue_radix_tree, reset every call
        deprioritized: set = set()
        for r in waiting_queue:
            pieces = tree.stream(r, r.prefill_target)
            self.prefix[r.id] = matched = tree.match_prefix(pieces)
            if matched[0] <= self.threshold:
                in_batch = seen.match_prefix(pieces)[0]
                if in_batch >= self.threshold:
                    deprioritized.add(r.id)
                else:
                    seen.insert(pieces)
        return deprioritized

    def _sort_by_dfs_weight(self, waiting_queue: list) -> None:
        last_node_to_reqs: dict = {}
        for r in waiting_queue:
            last_node_to_reqs.setdefault(self.prefix[r.id][1], []).append(r)
        weight = {node: len(reqs) for node, reqs in last_node_to_reqs.items()}
        root = self.tree_cache.root_node

        def calc_weight(node) -> int:
            total = weight.get(node, 0)
            for child in node.children.values():
                total += calc_weight(child)
            weight[node] = total
            return total

        def dfs(node) -> None:
            children = sorted(node.children.values(), key=lambda c: -weight.get(c, 0))
            for child in children:
                dfs(child)
            waiting_queue.extend(last_node_to_reqs.get(node, ()))

        calc_weight(root)
        waiting_queue.clear()
        dfs(root)


class PrefillAdder:
    """One prefill batch's admissions under SGLang's token budgets (module docstring).

    ``can_run_list`` holds ``(request, new tokens, matched prefix tokens)`` in admission order.
    """

    def __init__(self, sched, running: list, new_token_ratio: float, rem_input_tokens: int,
                 rem_chunk_tokens: int | None, mixed_with_decode_tokens: int = 0) -> None:
        self.tree_cache = sched.kv
        self.clip = sched.clip_max_new_tokens
        # --enable-mixed-chunk: the running requests' decode tokens share the batch's budgets.
        self.rem_input_tokens = rem_input_tokens - mixed_with_decode_tokens
        self.rem_chunk_tokens = rem_chunk_tokens
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= mixed_with_decode_tokens
        self.rem_total_token_offset = mixed_with_decode_tokens
        self.cur_rem_token_offset = mixed_with_decode_tokens
        self.can_run_list: list[tuple] = []
        self.new_chunked_req = None
        generated = sched.num_generated
        # Each running request's remaining output, as predicted: x new_token_ratio.
        self.rem_total_token_offset += sum(
            [min(r.num_output_tokens - generated(r), self.clip) * new_token_ratio
             for r in running])

    @property
    def rem_total_tokens(self) -> float:
        """Available and evictable tokens less what admitted and running requests will take."""
        return self.tree_cache.num_free - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> float:
        """Available and evictable tokens less this batch's new tokens."""
        return self.tree_cache.num_free - self.cur_rem_token_offset

    def budget_state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (self.rem_chunk_tokens is not None
                                          and self.rem_chunk_tokens <= 0):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_prefill_budget(self, extend_input_len: int, max_new_tokens: int) -> None:
        self.rem_total_token_offset += extend_input_len + max_new_tokens
        self.cur_rem_token_offset += extend_input_len
        self.rem_input_tokens -= extend_input_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_input_len

    def add_chunked_req(self, req):
        """The chunked request's next chunk (it holds its earlier chunks in the tree); the
        request again if this chunk is not its last, else None."""
        rem = min(self.rem_chunk_tokens, int(self.rem_total_tokens))
        if rem <= 0:
            rem = self.rem_chunk_tokens
        extend = req.prefill_target - req.num_computed_tokens
        truncated = extend > rem
        chunk = min(extend, rem)
        self.can_run_list.append((req, chunk, req.num_computed_tokens))
        self._update_prefill_budget(
            chunk, 0 if truncated else min(req.num_output_tokens, self.clip))
        return req if truncated else None

    def add_one_req(self, req, prefix_len: int, last_node) -> AddReqResult:
        """Admit waiting ``req`` (its match: ``prefix_len`` tokens ending at ``last_node``), a
        chunk of it, or nothing (the answer says why)."""
        extend = req.prefill_target - prefix_len
        total_tokens = extend + min(max(req.num_output_tokens - req.num_generated, 0),
                                    self.clip)
        if total_tokens >= self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if extend >= self.rem_input_tokens and self.can_run_list:
            return AddReqResult.OTHER
        tree = self.tree_cache
        tree.inc_lock_ref(last_node)        # _lock_node: its prefix is not evictable now
        try:
            if total_tokens >= self.rem_total_tokens:
                return AddReqResult.NO_TOKEN
            if extend >= self.rem_input_tokens and self.can_run_list:
                return AddReqResult.OTHER
            if self.rem_chunk_tokens is None or extend <= self.rem_chunk_tokens:
                self.can_run_list.append((req, extend, prefix_len))
                tree.lock(req.id, last_node, prefix_len)
                self._update_prefill_budget(extend, min(req.num_output_tokens, self.clip))
            else:
                trunc_len = self.rem_chunk_tokens       # // page_size * page_size, page 1
                if trunc_len <= 0:
                    return AddReqResult.OTHER
                self.can_run_list.append((req, trunc_len, prefix_len))
                self.new_chunked_req = req
                tree.lock(req.id, last_node, prefix_len)
                self._update_prefill_budget(trunc_len, 0)
        finally:
            tree.dec_lock_ref(last_node)
        return self.budget_state()
