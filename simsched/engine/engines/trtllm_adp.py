"""TensorRT-LLM's attention-DP context balancing (``attention_dp_config.enable_balance``).

With attention data parallelism, every rank of a TensorRT-LLM replica keeps its own active list,
and the PyTorch executor deals each new request to one rank. With ``enable_balance`` it also
holds every rank's context requests back until each rank has one, so that the ranks' context
phases run together. Written after TensorRT-LLM 1.x's ``tensorrt_llm/_torch/pyexecutor/``:
``PyExecutor._balance_adp_requests`` (the hold) and ``ExecutorRequestQueue.
_balance_requests_across_ranks`` (the dealing).

* **Dealing.** A new request goes to the rank with the fewest active prompt tokens (then the
  fewest active requests, then the lowest index), among the ranks with fewer active requests
  than expected: the mean after the request joins, rounded up, or the busiest rank's count if
  that is larger. Here requests are dealt one at a time, as they arrive. TensorRT-LLM deals
  each iteration's new requests together, the longest prompt first.
* **The hold**, each iteration, over the requests the capacity and micro-batch schedulers chose:
  - every rank has a context request and fewer generating requests than ``max_batch_size``:
    the waiting count restarts. Where every rank also has a generating request, contexts wait
    ``batching_wait_iters`` iterations more (counted, then restarted);
  - otherwise the waiting count advances and contexts wait. They run when the count reaches
    ``timeout_iters`` (the count restarts) or when a rank has no generating request.

  The count advances on every unbalanced iteration, with contexts or without, so a new request
  waits for the rest of the current count.

simsched's TensorRT-LLM scheduler keeps one active list for all ranks. The ranks' own capacity
and token budgets are its shared ones, multiplied by the ranks. This module keeps what the hold
reads: each request's rank, each rank's active requests and prompt tokens, the two counts.
"""

from __future__ import annotations

__all__ = ["AttentionDPBalance"]


class AttentionDPBalance:
    """The dealing and the hold for ``num_ranks`` attention-DP ranks of a TensorRT-LLM replica
    whose ranks share its ``max_batch_size`` and ``max_num_tokens`` evenly (module docstring).
    ``max_batch_size`` and ``max_num_tokens`` hold one rank's share."""

    def __init__(self, num_ranks: int, max_batch_size: int, max_num_tokens: int,
                 timeout_iters: int, batching_wait_iters: int) -> None:
        if num_ranks < 2:
            raise ValueError(f"attention-DP balancing needs at least 2 ranks, got {num_ranks}")
        self.num_ranks = num_ranks
        self.max_batch_size = max(1, max_batch_size // num_ranks)
        self.max_num_tokens = max_num_tokens // num_ranks
        self.timeout_iters = timeout_iters
        self.batching_wait_iters = batching_wait_iters
        self.rank_of: dict[int, int] = {}
        self.num_active = [0] * num_ranks
        self.num_active_tokens = [0] * num_ranks
        self.waiting_iters = 0      # adp_ctx_waiting_iters_count
        self.batching_iters = 0     # adp_ctx_batching_wait_iters_count
        self.num_held_steps = 0     # steps in which contexts were held back

    def deal(self, req) -> int:
        """Give ``req`` its rank (the dealing rule) and count it active there."""
        active, tokens = self.num_active, self.num_active_tokens
        expected = max(-(-(sum(active) + 1) // self.num_ranks), max(active))
        rank = min((r for r in range(self.num_ranks) if active[r] < expected),
                   key=lambda r: (tokens[r], active[r], r))
        self.rank_of[req.id] = rank
        active[rank] += 1
        tokens[rank] += req.num_prompt_tokens
        return rank

    def leave(self, req) -> None:
        """``req`` left the active list (finished, rejected or aborted)."""
        rank = self.rank_of.pop(req.id, None)
        if rank is not None:
            self.num_active[rank] -= 1
            self.num_active_tokens[rank] -= req.num_prompt_tokens

    def admits(self, contexts: list, generation: list) -> bool:
        """Whether this iteration runs its ``contexts`` (``(request, chunk)`` pairs) beside its
        ``generation`` requests, or holds them back (the hold rule); advances the counts."""
        n = self.num_ranks
        num_ctx, num_gen = [0] * n, [0] * n
        rank_of = self.rank_of
        for req, _ in contexts:
            num_ctx[rank_of[req.id]] += 1
        for req in generation:
            num_gen[rank_of[req.id]] += 1
        all_gen = min(num_gen) > 0
        if min(num_ctx) > 0 and max(num_gen) < self.max_batch_size:
            self.waiting_iters = 0
            if all_gen:
                if self.batching_iters < self.batching_wait_iters:
                    self.batching_iters += 1
                    return self._held(contexts)
                self.batching_iters = 0
            return True
        self.waiting_iters += 1
        if self.waiting_iters >= self.timeout_iters or not all_gen:
            self.waiting_iters = 0
            return True
        return self._held(contexts)

    def micro_batch(self, fitting: list, is_generating) -> tuple[list, list]:
        """The micro-batch scheduler run by each rank over its own requests (unchunked
        context): ``fitting`` in order, each rank within its share of ``max_num_tokens`` and
        ``max_batch_size``, a rank's first context that does not fit ending its batch;
        ``(contexts as (request, tokens), generation)``."""
        n = self.num_ranks
        budget, cap = self.max_num_tokens, self.max_batch_size
        tokens, count, closed = [0] * n, [0] * n, [False] * n
        contexts, generation = [], []
        rank_of = self.rank_of
        for req in fitting:
            r = rank_of[req.id]
            if closed[r]:
                continue
            if is_generating(req):
                if tokens[r] + 1 > budget:
                    closed[r] = True
                    continue
                generation.append(req)
                tokens[r] += 1
            else:
                if tokens[r] + req.prefill_target > budget:
                    closed[r] = True
                    continue
                contexts.append((req, req.prefill_target - req.num_computed_tokens))
                tokens[r] += req.prefill_target
            count[r] += 1
            if count[r] >= cap:
                closed[r] = True
        return contexts, generation

    def _held(self, contexts: list) -> bool:
        if contexts:
            self.num_held_steps += 1
        return False
