"""Cache-aware queue policies: longest cached prefix first (SGLang's ``lpm``)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from simsched.policies.queues import HeapQueue, check_option_names, option
from simsched.request import Request

DEFAULT_MAX_QUEUE_LEN = 128     # SGLang switches LPM to FCFS past 128 waiting requests


class LpmQueue(HeapQueue):
    """Waiting requests with the longest cached prefix first; FCFS when the queue is long.

    The order is recomputed against the KV cache once per iteration (and after arrivals), as
    SGLang's scheduler does: O(waiting x prompt segments), so past ``max_queue_len`` waiting
    requests it serves first come, first served instead. Without a prefix cache every match is
    0 and the order is FCFS. Preemption ranks (``ranks_below``) are FCFS ranks.
    """

    def __init__(self, max_queue_len: int = DEFAULT_MAX_QUEUE_LEN) -> None:
        super().__init__(lambda r, now: (r.arrival_at, r.id))
        self.max_queue_len = max_queue_len
        self._match = None
        self._order: list[Request] | None = None
        self._pos = 0

    def bind(self, scheduler) -> None:
        """Read cache matches from ``scheduler``'s KV cache."""
        kv = scheduler.kv
        self._match = kv.num_cached_prefix_tokens if kv.prefix_caching else None

    def update(self, now: float) -> None:
        """A new iteration: the cache changed, so the order is recomputed when next needed."""
        super().update(now)
        self._order = None

    def push(self, req: Request, now: float) -> None:
        """Enqueue ``req``."""
        super().push(req, now)
        self._order = None

    def peek(self) -> Request:
        """The waiting request with the longest cached prefix (FCFS past ``max_queue_len``)."""
        if self._match is None or len(self) > self.max_queue_len:
            return super().peek()
        if self._order is None:
            match = self._match
            self._order = sorted(self, key=lambda r: (-match(r), r.sort_key))
            self._pos = 0
        order, live = self._order, self._live
        while order[self._pos].id not in live:
            self._pos += 1          # served since the order was computed
        return order[self._pos]


def lpm(options: Mapping[str, Any], rng: np.random.Generator) -> LpmQueue:
    """Longest prefix match first (SGLang): most prompt tokens already in the prefix cache.

    Option ``max_queue_len`` (default 128, as SGLang): above this many waiting requests the
    queue is served FCFS, which keeps an iteration's cost bounded.
    """
    check_option_names(options, "lpm", ("max_queue_len",))
    limit = option(options, "max_queue_len", DEFAULT_MAX_QUEUE_LEN)
    if limit != int(limit):
        raise ValueError(f"scheduler.policy_options['max_queue_len'] must be an integer, "
                         f"got {options['max_queue_len']!r}")
    return LpmQueue(int(limit))
