"""The queue-policy protocol: what a waiting queue must do and the hooks it may add.

A *queue policy* is a factory ``make(options, rng) -> QueuePolicy`` registered by name in
:data:`simsched.policies.orders.QUEUE_POLICIES`; the object it returns is the scheduler's waiting
queue and derives from :class:`QueuePolicy`. A new policy subclasses it (or
:class:`~simsched.policies.queues.HeapQueue`, a keyed heap that implements the required part) and
overrides only the hooks it needs; the scheduler reads every hook as an attribute and skips those
left at their defaults, so an unused hook costs nothing per iteration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable, Iterator

from simsched.request import Request


class QueuePolicy(ABC):
    """A waiting queue: orders waiting requests and ranks requests against each other.

    Required (abstract): :meth:`push`, :meth:`peek`, :meth:`pop`, :meth:`ranks_below`,
    ``__len__`` and ``__iter__``.

    Optional hooks, each with its default (a method left at its default is never called):

    ========================  =========  =========================================================
    hook                      default    meaning
    ========================  =========  =========================================================
    ``bind(scheduler)``       no-op      called once when the queue is installed: read running
                                         requests' progress (``scheduler.num_generated(req)``,
                                         ``scheduler.step``) or its KV cache from it
    ``update(now)``           no-op      called at the start of every iteration with its time
    ``refresh(running, s)``   no-op      called every iteration with the running requests:
                                         O(running) per iteration (no built-in policy has one)
    ``may_preempt(r, w)``     ranks_     whether waiting ``w`` may preempt running ``r`` to be
                              below      admitted (a storm guard may refuse what ranks allow)
    ``preemptive``            False      a better waiting request may also preempt for a
                                         sequence slot, and is admitted before swapped-out
                                         requests return
    ``dynamic_ranks``         False      ranks of running requests change as they are served, so
                                         the scheduler asks :meth:`ranks_below` (or
                                         ``may_preempt``) instead of comparing fixed ``sort_key``
    ``ranks_only_improve``    False      with dynamic ranks: a running request's rank only
                                         improves while it runs (SJF: its remaining work
                                         shrinks), so a failed admission scan stays failed until
                                         the running set changes
    ``meter``                 None       a :class:`~simsched.policies.fairness.ServiceMeter` the
                                         scheduler feeds with served prompt and output tokens
    ========================  =========  =========================================================

    Keys are fixed while a request waits: :meth:`push` sets ``req.sort_key``, which ranks
    requests when ``dynamic_ranks`` is False and no ``refresh`` hook exists. Time-dependent rules
    are written as a fixed key involving the enqueue time (aging: ``base - rate * (now - t_enq)``
    compared at one ``now`` orders like ``base + rate * t_enq``).
    """

    preemptive: bool = False
    dynamic_ranks: bool = False
    ranks_only_improve: bool = False
    meter = None

    @abstractmethod
    def push(self, req: Request, now: float) -> None:
        """Enqueue ``req`` at time ``now`` (and set ``req.sort_key``)."""

    @abstractmethod
    def peek(self) -> Request:
        """The request to serve next (the queue is not empty)."""

    @abstractmethod
    def pop(self) -> Request:
        """Remove and return the request to serve next."""

    @abstractmethod
    def ranks_below(self, req: Request, other: Request) -> bool:
        """Whether ``req`` (waiting, running or swapped) is served after ``other`` now (the
        admission trigger and the ``policy_worst`` victim ask)."""

    @abstractmethod
    def __len__(self) -> int:
        """The number of waiting requests."""

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """The waiting requests, in any order."""

    def restore(self, req: Request) -> None:
        """Put back ``req``, popped in this iteration's admission scan and not admitted (an
        admission constraint skipped it), in its place (default: pushed again at the time it was
        queued, which gives it its key again when the key depends on that time only)."""
        self.push(req, req.queued_at)

    def remove(self, req: Request) -> bool:
        """Take ``req`` out of the queue (its client gave up: an abort); False if it is not
        queued here. The default pops every request and puts back the others with
        :meth:`restore` (O(n log n), and only ever called on an abort); a queue that can do
        better overrides it."""
        if not any(other is req for other in self):
            return False
        others = [self.pop() for _ in range(len(self))]
        for other in others:
            if other is not req:
                self.restore(other)
        return True

    def bind(self, scheduler) -> None:
        """Called once with the scheduler that owns this queue (default: nothing)."""

    def update(self, now: float) -> None:
        """Called at the start of every iteration at time ``now`` (default: nothing; the
        scheduler skips the call)."""

    def refresh(self, running: Iterable[Request], scheduler) -> None:
        """Called every iteration with the running requests (default: nothing; the scheduler
        skips the call)."""

    def may_preempt(self, running: Request, waiting: Request) -> bool:
        """Whether ``waiting`` may preempt ``running`` to be admitted (default:
        ``ranks_below(running, waiting)``)."""
        return self.ranks_below(running, waiting)


def check_queue(queue, policy: str | None = None) -> None:
    """Refuse a waiting queue that does not derive from :class:`QueuePolicy` (a duck-typed one
    would have its optional hooks silently ignored)."""
    if not isinstance(queue, QueuePolicy):
        source = f"queue policy {policy!r} returned" if policy is not None else "got"
        raise TypeError(
            f"{source} a {type(queue).__qualname__}, which does not derive from "
            f"simsched.policies.base.QueuePolicy: subclass it (its optional hooks have defaults)")
