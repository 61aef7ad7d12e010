"""Fair sharing between tenants: the virtual token counter (VTC) of Sheng et al., "Fairness in
Serving Large Language Models", OSDI'24.

Every tenant has a counter of the weighted service it has received: ``prompt_weight`` per prompt
token prefilled plus ``output_weight`` per output token generated, divided by the tenant's weight.
The queue serves the backlogged tenant (one with waiting requests) with the smallest counter,
oldest request first; a tenant that becomes backlogged is lifted to the smallest counter of the
backlogged tenants (or to the counter of the last tenant that stopped being backlogged), so idle
time earns no credit.

Service is metered exactly despite lazy decoding: prefill chunks are counted when planned (and
un-counted if the request is preempted before they run), first tokens at commit, and decode
tokens as (tenant's running decoders) x (decode steps) between changes of that count.
"""

from __future__ import annotations

import heapq
from typing import Any, Hashable, Iterator, Mapping

import numpy as np

from simsched.policies.base import QueuePolicy
from simsched.policies.queues import check_option_names, option
from simsched.request import Request


class ServiceMeter:
    """Exact per-tenant prompt and output tokens served, and the VTC counters built on them."""

    def __init__(self, prompt_weight: float = 1.0, output_weight: float = 2.0,
                 tenant_weights: Mapping[Hashable, float] | None = None) -> None:
        self.prompt_weight = prompt_weight
        self.output_weight = output_weight
        self.tenant_weights = dict(tenant_weights or {})
        self.prompt_tokens: dict[Hashable, int] = {}
        self._output: dict[Hashable, int] = {}     # output tokens up to step _mark[t]
        self._decoders: dict[Hashable, int] = {}
        self._mark: dict[Hashable, int] = {}
        self._lift: dict[Hashable, float] = {}
        self.version = 0            # bumped by every change, so counters can be cached

    def _settle(self, tenant: Hashable, step: int) -> None:
        self.version += 1
        n = self._decoders.get(tenant, 0)
        if n:
            self._output[tenant] = self._output.get(tenant, 0) + n * (step - self._mark[tenant])
        self._mark[tenant] = step

    def prefill(self, req: Request, num_tokens: int) -> None:
        """Count ``num_tokens`` prompt tokens prefilled for ``req`` (negative to undo)."""
        t = req.tenant
        self.version += 1
        self.prompt_tokens[t] = self.prompt_tokens.get(t, 0) + num_tokens

    def first_token(self, req: Request) -> None:
        """Count an output token emitted at the end of a (re)prefill."""
        self.version += 1
        self._output[req.tenant] = self._output.get(req.tenant, 0) + 1

    def start_decoding(self, req: Request, step: int) -> None:
        """``req`` decodes one token per decode step after ``step``."""
        self._settle(req.tenant, step)
        self._decoders[req.tenant] = self._decoders.get(req.tenant, 0) + 1

    def stop_decoding(self, req: Request, step: int) -> None:
        """``req`` decoded its last token of this run at ``step``."""
        self._settle(req.tenant, step)
        self._decoders[req.tenant] -= 1

    def output_tokens(self, tenant: Hashable, step: int) -> int:
        """Output tokens served to ``tenant`` up to decode step ``step``."""
        n = self._decoders.get(tenant, 0)
        base = self._output.get(tenant, 0)
        return base + n * (step - self._mark[tenant]) if n else base

    def counter(self, tenant: Hashable, step: int) -> float:
        """The tenant's virtual token counter (weighted service plus lifts)."""
        service = (self.prompt_weight * self.prompt_tokens.get(tenant, 0)
                   + self.output_weight * self.output_tokens(tenant, step))
        return service / self.tenant_weights.get(tenant, 1.0) + self._lift.get(tenant, 0.0)

    def lift(self, tenant: Hashable, step: int, to: float) -> None:
        """Raise the tenant's counter to at least ``to``."""
        gap = to - self.counter(tenant, step)
        if gap > 0:
            self.version += 1
            self._lift[tenant] = self._lift.get(tenant, 0.0) + gap


class VTCQueue(QueuePolicy):
    """Waiting queue of the virtual token counter policy (see the module docstring)."""

    dynamic_ranks = True        # ranks follow the tenants' counters, which change every iteration

    def __init__(self, meter: ServiceMeter) -> None:
        self.meter = meter
        self._queues: dict[Hashable, list] = {}   # tenant -> heap of (arrival_at, id, req)
        self._view = None
        self._last_left = 0.0
        self._len = 0
        self._counters: dict[Hashable, float] = {}   # valid for _counted = (version, step)
        self._counted = (-1, -1)

    def bind(self, view) -> None:
        """Read the decode-step clock from ``view`` (the scheduler)."""
        self._view = view

    def _step(self) -> int:
        return self._view.step if self._view is not None else 0

    def counter(self, tenant: Hashable) -> float:
        """The VTC of ``tenant`` now (cached until the meter or the decode step changes)."""
        stamp = (self.meter.version, self._step())
        if stamp != self._counted:
            self._counters = {}
            self._counted = stamp
        value = self._counters.get(tenant)
        if value is None:
            value = self._counters[tenant] = self.meter.counter(tenant, stamp[1])
        return value

    def push(self, req: Request, now: float) -> None:
        """Enqueue ``req``; lift its tenant if it was not backlogged."""
        t = req.tenant
        q = self._queues.get(t)
        if not q:
            backlogged = [self.counter(u) for u, uq in self._queues.items() if uq]
            self.meter.lift(t, self._step(), min(backlogged) if backlogged else self._last_left)
            q = self._queues.setdefault(t, [])
        req.sort_key = (req.arrival_at, req.id)
        heapq.heappush(q, (req.arrival_at, req.id, req))
        self._len += 1

    def _best_tenant(self) -> Hashable:
        return min((t for t, q in self._queues.items() if q),
                   key=lambda t: (self.counter(t), self._queues[t][0][:2]))

    def peek(self) -> Request:
        """The oldest request of the backlogged tenant with the smallest counter."""
        return self._queues[self._best_tenant()][0][2]

    def pop(self) -> Request:
        """Remove and return :meth:`peek`'s request."""
        t = self._best_tenant()
        q = self._queues[t]
        req = heapq.heappop(q)[2]
        self._len -= 1
        if not q:
            self._last_left = self.counter(t)
        return req

    def remove(self, req: Request) -> bool:
        """Take ``req`` out of its tenant's queue (an abort)."""
        q = self._queues.get(req.tenant)
        if not q or not any(e[2] is req for e in q):
            return False
        q[:] = [e for e in q if e[2] is not req]
        heapq.heapify(q)
        self._len -= 1
        if not q:
            self._last_left = self.counter(req.tenant)
        return True

    def ranks_below(self, req: Request, other: Request) -> bool:
        """Whether ``req``'s tenant has received more service (ties: ``req`` arrived later)."""
        return ((self.counter(req.tenant), req.arrival_at, req.id)
                > (self.counter(other.tenant), other.arrival_at, other.id))

    def may_preempt(self, running: Request, waiting: Request) -> bool:
        """Whether ``waiting`` may preempt ``running``: only if its tenant stays behind
        ``running``'s even after ``waiting``'s prefill is counted.

        Otherwise the two tenants would swap places at the next iteration and the victim's
        tenant would preempt back: a storm of several preemptions per iteration. Requests of one
        tenant never preempt each other.
        """
        meter = self.meter
        prefill = (meter.prompt_weight * (waiting.prefill_target - waiting.num_computed_tokens)
                   / meter.tenant_weights.get(waiting.tenant, 1.0))
        return self.counter(running.tenant) > self.counter(waiting.tenant) + prefill

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Request]:
        return (e[2] for q in self._queues.values() for e in q)


def fair(options: Mapping[str, Any], rng: np.random.Generator) -> VTCQueue:
    """Virtual token counter fair share between tenants (Sheng et al., OSDI'24).

    Options: ``prompt_weight`` (default 1), ``output_weight`` (default 2, the paper's), and
    ``tenant_weights`` (tenant -> share weight, default 1 each: a weight-2 tenant gets twice the
    service of a weight-1 tenant when both are backlogged).
    """
    check_option_names(options, "fair", ("prompt_weight", "output_weight", "tenant_weights"))
    weights = options.get("tenant_weights") or {}
    if not isinstance(weights, Mapping):
        raise ValueError("scheduler.policy_options['tenant_weights'] must map tenant -> weight, "
                         f"got {weights!r}")
    for tenant, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0:
            raise ValueError(f"scheduler.policy_options['tenant_weights'][{tenant!r}] must be a "
                             f"number > 0, got {w!r}")
    meter = ServiceMeter(option(options, "prompt_weight", 1.0),
                         option(options, "output_weight", 2.0), weights)
    if meter.prompt_weight == 0 and meter.output_weight == 0:
        raise ValueError("scheduler.policy_options: prompt_weight and output_weight are both 0")
    return VTCQueue(meter)
