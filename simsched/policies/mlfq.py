"""FastServe's skip-join multi-level feedback queue (Wu et al., "Fast Distributed Inference
Serving for Large Language Models", 2023).

Service is counted in *units* of about one decode iteration: each output token is one unit and a
prefill of ``p`` prompt tokens is ``p / prefill_tokens_per_unit`` units. Level ``i`` has quantum
``quantum * growth**i`` units. A new request skips the levels whose quantum its prefill would
exceed (skip-join: it enters the first level whose quantum is larger than its prefill), is
demoted to the next level each time it has used up its current level's quantum, and the last
level has no limit. Requests are served by level, then by arrival.

Because a running request's level changes while it decodes, the scheduler calls
:meth:`MLFQueue.refresh` once per iteration, which re-ranks every running request (O(running), paid
only when this policy is selected); the queue is *preemptive*: a waiting request of a higher level
that cannot get a sequence slot or KV blocks preempts running requests of lower levels.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping

import numpy as np

from simsched.policies.queues import HeapQueue, check_option_names, option
from simsched.request import Request


class MLFQueue(HeapQueue):
    """Skip-join MLFQ: the waiting-queue key is (level, arrival) at enqueue time."""

    preemptive = True

    def __init__(self, quantum: float, growth: float, num_levels: int,
                 prefill_tokens_per_unit: float, max_wait: float | None = None) -> None:
        super().__init__(self._rank_key, max_wait)
        self.quanta = [quantum * growth ** i for i in range(num_levels)]
        self.num_levels = num_levels
        self.prefill_tokens_per_unit = prefill_tokens_per_unit
        # ends[e][L]: service (units) after which a request that entered at level e leaves level L
        self.ends = [list(itertools.accumulate(self.quanta[e:])) for e in range(num_levels)]

    def entry_level(self, req: Request) -> int:
        """The first level whose quantum exceeds ``req``'s prefill (skip-join)."""
        p = req.num_prompt_tokens / self.prefill_tokens_per_unit
        for i, q in enumerate(self.quanta):
            if q > p:
                return i
        return self.num_levels - 1

    def level(self, req: Request, num_generated: int) -> int:
        """The level of ``req`` after ``num_generated`` output tokens."""
        e = self.entry_level(req)
        service = req.num_prompt_tokens / self.prefill_tokens_per_unit + num_generated
        for offset, end in enumerate(self.ends[e]):
            if service < end:
                return e + offset
        return self.num_levels - 1

    def _rank_key(self, req: Request, now: float) -> tuple:
        return (self.level(req, req.num_generated), req.arrival_at, req.id)

    def refresh(self, running, view) -> None:
        """Re-rank running requests by their current level (called once per iteration)."""
        for req in running:
            req.sort_key = (self.level(req, view.num_generated(req)), req.arrival_at, req.id)


def mlfq(options: Mapping[str, Any], rng: np.random.Generator) -> MLFQueue:
    """FastServe skip-join MLFQ with preemption of lower levels.

    Options: ``quantum`` (units in level 0, default 4), ``growth`` (quantum ratio between levels,
    default 2), ``num_levels`` (default 8), ``prefill_tokens_per_unit`` (prompt tokens whose
    prefill counts as one unit, default 128), ``max_wait`` (seconds; promote longer waits).
    """
    check_option_names(options, "mlfq", ("quantum", "growth", "num_levels",
                                         "prefill_tokens_per_unit", "max_wait"))
    levels = option(options, "num_levels", 8, 1, 64)
    if levels != int(levels):
        raise ValueError(f"scheduler.policy_options['num_levels'] must be an integer, "
                         f"got {options['num_levels']!r}")
    return MLFQueue(option(options, "quantum", 4.0, 0.0, low_open=True),
                    option(options, "growth", 2.0, 1.0),
                    int(levels),
                    option(options, "prefill_tokens_per_unit", 128.0, 0.0, low_open=True),
                    option(options, "max_wait", None, 0.0, low_open=True))
