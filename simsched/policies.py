"""Queue-ordering and preemption-victim policies, each registered by name.

A *queue policy* is a factory ``make(options) -> WaitingQueue``. The waiting queue orders waiting
requests (a heap: O(log n) per push/pop) and says whether one request ranks below another, which
the admission trigger uses to choose whom it may preempt. Keys must not change while a request
waits; time-dependent rules (aging) are written as a fixed key involving the enqueue time.

A *victim policy* is a function ``choose(candidates, view) -> Request`` picking which running
request to preempt; ``view`` is the scheduler, which answers ``num_generated(req)`` and
``num_cached(req)``.

Adding a policy means adding one function and one line in a registry below.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable, Iterator, Mapping

from simsched.request import Request


class HeapQueue:
    """A waiting queue ordered by a key function (smaller key = served first)."""

    def __init__(self, key: Callable[[Request, float], tuple]) -> None:
        self._key = key
        self._heap: list = []
        self._tiebreak = itertools.count()

    def push(self, req: Request, now: float) -> None:
        """Enqueue ``req`` at time ``now``."""
        req.sort_key = self._key(req, now)
        heapq.heappush(self._heap, (req.sort_key, next(self._tiebreak), req))

    def peek(self) -> Request:
        """The request to serve next (the queue must not be empty)."""
        return self._heap[0][2]

    def pop(self) -> Request:
        """Remove and return the request to serve next."""
        return heapq.heappop(self._heap)[2]

    def ranks_below(self, req: Request, other: Request) -> bool:
        """Whether ``req`` would be served after ``other``."""
        return req.sort_key > other.sort_key

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[2] for entry in self._heap)


def fcfs(options: Mapping[str, Any]) -> HeapQueue:
    """First come, first served: by arrival time (vLLM's default)."""
    return HeapQueue(lambda r, now: (r.arrival_at, r.id))


def spf(options: Mapping[str, Any]) -> HeapQueue:
    """Shortest prompt first: ascending prompt tokens, ties by arrival.

    Lowers mean TTFT by removing head-of-line blocking behind long prefills; long prompts can
    starve under sustained load.
    """
    return HeapQueue(lambda r, now: (r.num_prompt_tokens, r.arrival_at, r.id))


def priority(options: Mapping[str, Any]) -> HeapQueue:
    """Strict priority (lower value = more urgent), ties by arrival (vLLM's priority policy)."""
    return HeapQueue(lambda r, now: (r.priority, r.arrival_at, r.id))


QUEUE_POLICIES: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "fcfs": fcfs,
    "spf": spf,
    "priority": priority,
}


def fewest_generated(candidates, view) -> Request:
    """The request that has generated the fewest tokens (least sunk decode work); ties: newest."""
    return min(candidates, key=lambda r: (view.num_generated(r), -r.admitted_seq))


def newest(candidates, view) -> Request:
    """The most recently admitted request (vLLM's rule: pop the tail of the running list)."""
    return max(candidates, key=lambda r: r.admitted_seq)


def lowest_priority(candidates, view) -> Request:
    """The least urgent request (largest priority value); ties: newest."""
    return max(candidates, key=lambda r: (r.priority, r.admitted_seq))


VICTIM_POLICIES: dict[str, Callable[..., Request]] = {
    "fewest_generated": fewest_generated,
    "newest": newest,
    "lowest_priority": lowest_priority,
}


def make_queue(name: str, options: Mapping[str, Any]):
    """Build the waiting queue of queue policy ``name``."""
    try:
        factory = QUEUE_POLICIES[name]
    except KeyError:
        raise ValueError(f"scheduler.policy must be one of {sorted(QUEUE_POLICIES)}, "
                         f"got {name!r}") from None
    return factory(options)
