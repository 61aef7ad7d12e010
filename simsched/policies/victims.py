"""Preemption-victim policies, each registered by name.

A *victim policy* is a function ``choose(candidates, view) -> Request`` picking which running
request to preempt; ``view`` is the scheduler, which answers ``num_generated(req)``,
``num_cached(req)``, ``kv``, ``queue`` and ``cfg`` (its scheduler config). Adding one means one function and one registry line.
"""

from __future__ import annotations

from functools import cmp_to_key
from operator import attrgetter
from typing import Callable

from simsched.request import Request

__all__ = ["VICTIM_POLICIES"]


def fewest_generated(candidates, view) -> Request:
    """The request that has generated the fewest tokens (least sunk decode work); ties: newest."""
    return min(candidates, key=lambda r: (view.num_generated(r), -r.admitted_seq))


# The keys of newest and lowest_priority as attrgetters, the same values as the lambdas they
# replace (r.admitted_seq; (r.priority, r.admitted_seq)) read in C: the vllm_v1 preset's victim
# search (newest) runs over every running request at each preemption.
_ADMITTED_SEQ = attrgetter("admitted_seq")
_PRIORITY_THEN_ADMITTED = attrgetter("priority", "admitted_seq")


def newest(candidates, view) -> Request:
    """The most recently admitted request (vLLM's rule: pop the tail of the running list)."""
    return max(candidates, key=_ADMITTED_SEQ)


def lowest_priority(candidates, view) -> Request:
    """The least urgent request (largest priority value); ties: newest."""
    return max(candidates, key=_PRIORITY_THEN_ADMITTED)


def priority_arrival(candidates, view) -> Request:
    """The least urgent request, the latest arrival among equals; ties: the earliest admitted
    (vLLM V1's victim under its priority policy: the largest (priority, arrival time) in the
    running list, which is in admission order)."""
    return max(candidates, key=lambda r: (r.priority, r.arrival_at, -r.admitted_seq))


def vllm_v1(candidates, view) -> Request:
    """vLLM V1's victim under the queue policy in use (the default): :func:`priority_arrival`
    under ``policy="priority"``, :func:`newest` under any other (vLLM's ``fcfs`` pops the tail
    of its running list)."""
    if view.cfg.policy == "priority":
        return priority_arrival(candidates, view)
    return newest(candidates, view)


def largest_kv(candidates, view) -> Request:
    """The request holding the most KV blocks (frees the most memory at once); ties: newest."""
    held = view.kv.num_held
    return max(candidates, key=lambda r: (held(r.id), r.admitted_seq))


def policy_worst(candidates, view) -> Request:
    """The request the queue policy ranks last (e.g. the lowest MLFQ level); ties: newest."""
    below = view.queue.ranks_below

    def cmp(a: Request, b: Request) -> int:
        if below(a, b):
            return 1
        if below(b, a):
            return -1
        return (a.admitted_seq > b.admitted_seq) - (a.admitted_seq < b.admitted_seq)

    return max(candidates, key=cmp_to_key(cmp))


VICTIM_POLICIES: dict[str, Callable[..., Request]] = {
    "fewest_generated": fewest_generated,
    "newest": newest,
    "lowest_priority": lowest_priority,
    "priority_arrival": priority_arrival,
    "vllm_v1": vllm_v1,
    "largest_kv": largest_kv,
    "policy_worst": policy_worst,
}
