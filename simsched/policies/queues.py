"""Waiting-queue building blocks shared by the queue policies: a keyed heap and option parsing.

:class:`HeapQueue` keeps waiting requests in a heap by a key fixed at enqueue time (O(log n) per
push/pop). With ``max_wait`` it also promotes any request that has waited longer than that, in
enqueue order, ahead of the key order (an anti-starvation rule): the promotion is evaluated at the
time of the scheduler's last :meth:`HeapQueue.update` call. Promotion decides who is admitted
next, not whom a waiting request may preempt (see :meth:`HeapQueue.ranks_below`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from typing import Any, Callable, Iterator, Mapping

from simsched.policies.base import QueuePolicy
from simsched.request import Request


def option(options: Mapping[str, Any], name: str, default: float, low: float = 0.0,
           high: float = math.inf, low_open: bool = False) -> float:
    """Read number option ``name`` of ``scheduler.policy_options``, checking its range."""
    value = options.get(name, default)
    if value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"scheduler.policy_options[{name!r}] must be a number, got {value!r}")
    if (value <= low if low_open else value < low) or value > high:
        bracket = "(" if low_open else "["
        raise ValueError(f"scheduler.policy_options[{name!r}] must be in {bracket}{low}, {high}], "
                         f"got {value!r}")
    return float(value)


def check_option_names(options: Mapping[str, Any], policy: str, allowed) -> None:
    """Reject options that policy ``policy`` does not understand (typos would be ignored)."""
    bad = sorted(set(options) - set(allowed))
    if bad:
        raise ValueError(f"scheduler.policy_options {bad} not understood by policy {policy!r}; "
                         f"it accepts {sorted(allowed)}")


class HeapQueue(QueuePolicy):
    """A waiting queue ordered by a key function (smaller key = served first).

    ``key(req, now)`` is evaluated once, when ``req`` is enqueued at ``now``. ``max_wait``
    (seconds, optional) promotes requests that have waited longer, oldest first.

    Entries pushed in key order (every arrival under FCFS) join a sorted run, O(1) to push and
    pop; the others a heap. The next request is the smaller of the two heads, so the order is
    the one a heap alone would give, and a long FCFS queue costs no O(log n) sifts.
    """

    def __init__(self, key: Callable[[Request, float], tuple],
                 max_wait: float | None = None) -> None:
        self._key = key
        self._heap: list = []
        self._run: deque = deque()        # (key, tiebreak, req), sorted: pushed in key order
        self._tiebreak = itertools.count()
        self.max_wait = max_wait
        self._fifo: deque = deque()       # (queued_at, tiebreak, req), only with max_wait
        self._live: dict[int, int] = {}   # request id -> tiebreak of its live entry
        self.now = 0.0

    def push(self, req: Request, now: float) -> None:
        """Enqueue ``req`` at time ``now``."""
        req.sort_key = key = self._key(req, now)
        tb = next(self._tiebreak)
        self._live[req.id] = tb
        run = self._run
        if not run or key >= run[-1][0]:
            run.append((key, tb, req))    # a later tiebreak: after the run's last entry
        else:
            heapq.heappush(self._heap, (key, tb, req))
        if self.max_wait is not None:
            self._fifo.append((now, tb, req))

    def restore(self, req: Request) -> None:
        """Put back ``req``, popped and not admitted, with the key it had (into the heap: it
        ranks before requests pushed since, as it did)."""
        tb = next(self._tiebreak)
        self._live[req.id] = tb
        heapq.heappush(self._heap, (req.sort_key, tb, req))
        if self.max_wait is not None:
            fifo = self._fifo      # ordered by queue time: put it back where it was
            i = len(fifo)
            while i and fifo[i - 1][0] > req.queued_at:
                i -= 1
            fifo.insert(i, (req.queued_at, tb, req))

    def remove(self, req: Request) -> bool:
        """Take ``req`` out (an abort): its entries are dropped lazily, as a popped one's are."""
        live = self._live
        if req.id not in live:
            return False
        del live[req.id]
        return True

    def update(self, now: float) -> None:
        """Set the time at which waiting times are judged (called once per iteration)."""
        self.now = now

    def peek(self) -> Request:
        """The request to serve next (the queue must not be empty)."""
        run, heap, live = self._run, self._heap, self._live
        # Entries of popped requests stay in the run, the heap and the fifo until they reach
        # the front.
        while run and live.get(run[0][2].id) != run[0][1]:
            run.popleft()
        while heap and live.get(heap[0][2].id) != heap[0][1]:
            heapq.heappop(heap)
        fifo = self._fifo
        if fifo:
            while fifo and live.get(fifo[0][2].id) != fifo[0][1]:
                fifo.popleft()
            if fifo and self.now - fifo[0][0] > self.max_wait:
                return fifo[0][2]
        if heap and (not run or heap[0] < run[0]):
            return heap[0][2]
        return run[0][2]

    def pop(self) -> Request:
        """Remove and return the request to serve next."""
        req = self.peek()
        del self._live[req.id]
        return req

    def ranks_below(self, req: Request, other: Request) -> bool:
        """Whether ``req``'s key ranks it after ``other`` (for preemption and victims).

        Promotion past ``max_wait`` orders the waiting queue only: it gives no right to preempt
        running requests. (It did: once every waiting request had waited ``max_wait``, each
        admission preempted a running one, and the victims, re-queued, did the same ``max_wait``
        later, a storm of two to three preemptions per iteration in overload.)
        """
        return req.sort_key > other.sort_key

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Request]:
        live = self._live
        return (e[2] for e in itertools.chain(self._run, self._heap)
                if live.get(e[2].id) == e[1])
