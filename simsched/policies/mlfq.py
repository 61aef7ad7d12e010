"""FastServe's skip-join multi-level feedback queue (Wu et al., "Fast Distributed Inference
Serving for Large Language Models", 2023).

Service is counted in *units* of about one decode iteration: each output token is one unit and a
prefill of ``p`` prompt tokens is ``p / prefill_tokens_per_unit`` units. Level ``i`` has quantum
``quantum * growth**i`` units. A new request skips the levels whose quantum its prefill would
exceed (skip-join: it enters the first level whose quantum is larger than its prefill), is
demoted to the next level each time it has used up its current level's quantum, and the last
level has no limit. Requests are served by level, then by arrival.

A running request's level changes while it decodes. Levels are cached: a request's key
``(level, arrival_at, id, end)`` carries the service ``end`` at which its level ends, so its rank
is recomputed only when its service crosses that bound, and only when a rank is asked for
(admission preemption, the ``policy_worst`` victim): no per-iteration pass over the running
requests. The queue is *preemptive*: a waiting request of a higher level that cannot get a
sequence slot or KV blocks preempts running requests of lower levels.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Mapping

import numpy as np

from simsched.policies.queues import HeapQueue, check_option_names, option
from simsched.request import Request


class MLFQueue(HeapQueue):
    """Skip-join MLFQ: the key is (level, arrival, id), with the level's service bound cached."""

    preemptive = True
    dynamic_ranks = True        # a running request's rank changes as it is served

    def __init__(self, quantum: float, growth: float, num_levels: int,
                 prefill_tokens_per_unit: float, max_wait: float | None = None,
                 min_quantum: float = 0.0) -> None:
        super().__init__(self._rank_key, max_wait)
        self.min_quantum = min_quantum
        self.quanta = [quantum * growth ** i for i in range(num_levels)]
        self.num_levels = num_levels
        self.prefill_tokens_per_unit = prefill_tokens_per_unit
        # ends[e][L]: service (units) after which a request that entered at level e leaves level L
        self.ends = [list(itertools.accumulate(self.quanta[e:])) for e in range(num_levels)]
        self._view = None

    def bind(self, view) -> None:
        """Read running requests' progress from ``view`` (the scheduler)."""
        self._view = view

    def entry_level(self, req: Request) -> int:
        """The first level whose quantum exceeds ``req``'s prefill (skip-join)."""
        p = req.num_prompt_tokens / self.prefill_tokens_per_unit
        for i, q in enumerate(self.quanta):
            if q > p:
                return i
        return self.num_levels - 1

    def _key_at(self, req: Request, num_generated: int) -> tuple:
        e = self.entry_level(req)
        service = req.num_prompt_tokens / self.prefill_tokens_per_unit + num_generated
        for offset, end in enumerate(self.ends[e]):
            if service < end:
                return (e + offset, req.arrival_at, req.id, end)
        return (self.num_levels - 1, req.arrival_at, req.id, math.inf)

    def level(self, req: Request, num_generated: int) -> int:
        """The level of ``req`` after ``num_generated`` output tokens."""
        return self._key_at(req, num_generated)[0]

    def _rank_key(self, req: Request, now: float) -> tuple:
        return self._key_at(req, req.num_generated)

    def key(self, req: Request) -> tuple:
        """``req``'s current key, recomputed only if its service left the cached level."""
        key = req.sort_key
        g = self._view.num_generated(req) if self._view is not None else req.num_generated
        if key and req.num_prompt_tokens / self.prefill_tokens_per_unit + g < key[3]:
            return key            # service only grows: still below the cached level's end
        key = req.sort_key = self._key_at(req, g)
        return key

    def ranks_below(self, req: Request, other: Request) -> bool:
        """Whether ``req`` (waiting, running or swapped) is served after ``other`` now."""
        return self.key(req) > self.key(other)

    def may_preempt(self, running: Request, waiting: Request) -> bool:
        """Whether ``waiting`` may preempt ``running`` to be admitted: it ranks higher, and
        ``running`` has decoded ``min_quantum`` tokens since its last admission (the guard
        against demote-and-preempt storms; a request still in its prefill is protected too)."""
        s0 = running.run_start_step
        if s0 < 0 or self._view.step - s0 + 1 < self.min_quantum:
            return False
        return self.key(running) > self.key(waiting)


def mlfq(options: Mapping[str, Any], rng: np.random.Generator) -> MLFQueue:
    """FastServe skip-join MLFQ with preemption of lower levels.

    Options: ``quantum`` (units in level 0, default 4), ``growth`` (quantum ratio between levels,
    default 2), ``num_levels`` (default 8), ``prefill_tokens_per_unit`` (prompt tokens whose
    prefill counts as one unit, default 128), ``max_wait`` (seconds; promote longer waits),
    ``min_quantum`` (output tokens a request decodes after each admission before a waiting
    request of a higher level may preempt it, default 64; 0 turns the guard off).
    """
    check_option_names(options, "mlfq", ("quantum", "growth", "num_levels",
                                         "prefill_tokens_per_unit", "max_wait", "min_quantum"))
    levels = option(options, "num_levels", 8, 1, 64)
    if levels != int(levels):
        raise ValueError(f"scheduler.policy_options['num_levels'] must be an integer, "
                         f"got {options['num_levels']!r}")
    return MLFQueue(option(options, "quantum", 4.0, 0.0, low_open=True),
                    option(options, "growth", 2.0, 1.0),
                    int(levels),
                    option(options, "prefill_tokens_per_unit", 128.0, 0.0, low_open=True),
                    option(options, "max_wait", None, 0.0, low_open=True),
                    option(options, "min_quantum", 64.0, 0.0))
