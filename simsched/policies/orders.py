"""Queue-ordering policies, each registered by name.

A *queue policy* is a factory ``make(options, rng) -> QueuePolicy``: ``options`` is
``scheduler.policy_options`` and ``rng`` the run's scheduler Generator (for policies that draw
random numbers, e.g. a noisy length predictor). The waiting queue it returns derives from
:class:`~simsched.policies.base.QueuePolicy`, which lists what a queue must do (push, peek, pop,
ranks_below, len, iter) and the optional hooks the scheduler calls, each with its default.

Adding a policy means adding one function and one line in a registry below.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from simsched.policies.base import QueuePolicy, check_queue
from simsched.policies.cache_aware import lpm
from simsched.policies.fairness import fair
from simsched.policies.mlfq import mlfq
from simsched.policies.predictors import predicted_sjf, sjf_oracle
from simsched.policies.queues import HeapQueue, check_option_names, option
from simsched.request import Request

__all__ = ["HeapQueue", "QUEUE_POLICIES", "QueuePolicy", "make_queue"]


def fcfs(options: Mapping[str, Any], rng: np.random.Generator) -> HeapQueue:
    """First come, first served: by arrival time (vLLM's default)."""
    check_option_names(options, "fcfs", ())
    return HeapQueue(lambda r, now: (r.arrival_at, r.id))


def spf(options: Mapping[str, Any], rng: np.random.Generator) -> HeapQueue:
    """Shortest prompt first: ascending prompt tokens, ties by arrival.

    Lowers mean TTFT by removing head-of-line blocking behind long prefills; long prompts can
    starve under sustained load unless ``aging_rate`` (prompt tokens of credit per second waited)
    is set.
    """
    check_option_names(options, "spf", ("aging_rate",))
    rate = option(options, "aging_rate", 0.0)
    return HeapQueue(lambda r, now: (r.num_prompt_tokens + rate * now, r.arrival_at, r.id))


def spf_aging(options: Mapping[str, Any], rng: np.random.Generator) -> HeapQueue:
    """Shortest prompt first with aging: rank = prompt tokens - ``aging_rate`` x seconds waited.

    Default ``aging_rate`` 100 tokens/s: a prompt 1000 tokens longer overtakes after 10 s.
    """
    return spf({"aging_rate": 100.0, **options}, rng)


def priority(options: Mapping[str, Any], rng: np.random.Generator) -> HeapQueue:
    """Strict priority (lower value = more urgent), ties by arrival (vLLM's priority policy).

    ``aging_rate`` (priority levels per second waited, default 0) lets waiting requests rise.
    """
    check_option_names(options, "priority", ("aging_rate",))
    rate = option(options, "aging_rate", 0.0)
    return HeapQueue(lambda r, now: (r.priority + rate * now, r.arrival_at, r.id))


def priority_aging(options: Mapping[str, Any], rng: np.random.Generator) -> HeapQueue:
    """Priority with aging: rank = priority - ``aging_rate`` x seconds waited (default 0.1/s)."""
    return priority({"aging_rate": 0.1, **options}, rng)


def edf(options: Mapping[str, Any], rng: np.random.Generator) -> HeapQueue:
    """Earliest deadline first on a TTFT deadline: arrival + SLO (the SLO may depend on priority).

    Options: ``ttft_slo`` (seconds, default 1.0) and ``ttft_slo_by_priority`` (priority ->
    seconds, overriding ``ttft_slo`` for those classes). Classic EDF: under overload, late
    requests stay first.
    """
    check_option_names(options, "edf", ("ttft_slo", "ttft_slo_by_priority"))
    default = option(options, "ttft_slo", 1.0, 0.0, low_open=True)
    by_priority = options.get("ttft_slo_by_priority") or {}
    if not isinstance(by_priority, Mapping):
        raise ValueError("scheduler.policy_options['ttft_slo_by_priority'] must map priority -> "
                         f"seconds, got {by_priority!r}")
    slos = {int(p): option(by_priority, p, default, 0.0, low_open=True) for p in by_priority}

    def key(r: Request, now: float) -> tuple:
        if r.deadline_at != r.deadline_at:  # NaN: first enqueue
            r.deadline_at = r.arrival_at + slos.get(r.priority, default)
        return (r.deadline_at, r.arrival_at, r.id)

    return HeapQueue(key)


QUEUE_POLICIES: dict[str, Callable[[Mapping[str, Any], np.random.Generator], QueuePolicy]] = {
    "fcfs": fcfs,
    "spf": spf,
    "spf_aging": spf_aging,
    "priority": priority,
    "priority_aging": priority_aging,
    "sjf_oracle": sjf_oracle,
    "predicted_sjf": predicted_sjf,
    "mlfq": mlfq,
    "fair": fair,
    "edf": edf,
    "lpm": lpm,
}


def make_queue(name: str, options: Mapping[str, Any],
               rng: np.random.Generator | None = None) -> QueuePolicy:
    """Build the waiting queue of queue policy ``name`` (``rng`` defaults to seed 0); a factory
    returning anything but a :class:`~simsched.policies.base.QueuePolicy` is refused
    (TypeError)."""
    try:
        factory = QUEUE_POLICIES[name]
    except KeyError:
        raise ValueError(f"scheduler.policy must be one of {sorted(QUEUE_POLICIES)}, "
                         f"got {name!r}") from None
    queue = factory(options, rng if rng is not None else np.random.default_rng(0))
    check_queue(queue, name)
    return queue
