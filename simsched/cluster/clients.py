"""Benchmark clients as SimPy processes: ``vllm bench serve``'s fixed concurrency and
inference-perf's load stages (configured by :class:`simsched.config.client.ClientConfig`).

One process sends every request, in dataset order: a request leaves once its scheduled time has
come and one of the ``max_concurrency`` slots is free (no limit: at its time), so with every
slot taken the next request is sent at the very instant the client receives a finish. A
request's process returns the slot on the client's receipt of its last token: the engine's
finish plus its replica's client-side ``output_delay`` (the time the results report as
``finished_at``); a request the engine rejects returns it at once. This is vLLM's
``asyncio.Semaphore`` (FIFO: requests waiting for a slot are sent in their order) around each
request, and inference-perf's per-worker semaphore.

Requests are created when sent (``arrival_at`` is the send time, so TTFT and E2E latency count
from it, as the benchmarks count them) and appended to the cluster's request list, so ids follow
the send order: the ready check and the warm-ups first (:attr:`ClientPlan.num_warmup_requests`
of them, left out of the results), then the measured requests.
"""

from __future__ import annotations

import math

import numpy as np

from simsched.config.client import ClientConfig
from simsched.request import Content, Request, Status
from simsched.workloads import benchmark_clients as schedules

__all__ = ["ClientPlan", "run_client"]

# Content-id namespace of a prompt that had no prefix identity (see simsched.cluster.sessions).
CLIENT_PROMPT = 5


class _Stage:
    """Scheduled send times (seconds from the stage's timer start) and prompt indices."""

    __slots__ = ("offsets", "prompts")

    def __init__(self, offsets: np.ndarray, prompts: list[int]) -> None:
        self.offsets = offsets.tolist()
        self.prompts = prompts


class ClientPlan:
    """What a client sends: its prompts (request templates, in dataset order), the warm-up
    phases, the stages' schedules, and what the run recorded (send plans per request id).

    ``templates`` are requests built from the client's dataset (their ids and arrival times are
    not used). ``seed`` seeds the send schedule's draws (gamma gaps, stage timers).
    """

    def __init__(self, client: ClientConfig, templates: list[Request], seed: int) -> None:
        if not templates:
            raise ValueError("client: the dataset has no prompts")
        self.client = client
        self.templates = [_with_content(t, k) for k, t in enumerate(templates)]
        self.max_concurrency = client.max_concurrency
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(5,)))
        pool = client.num_unique_prompts or len(self.templates)
        # The prompt order draws from its own stream, so the send schedule is the same
        # whatever the order.
        order = _PromptOrder(client, pool, np.random.default_rng(
            np.random.SeedSequence(seed, spawn_key=(6,))))
        warm = order.take(client.num_warmups) if client.warmup_prompts == "dataset" else None
        self.stages: list[_Stage] = []
        if client.client_type == "staged":
            self.lead_time = client.stage_lead_time
            self.poll_time = client.stage_poll_time
            self.interval_time = client.stage_interval_time
            timer = (schedules.constant_stage_offsets if client.stage_load == "constant"
                     else schedules.poisson_stage_offsets)
            for rate, seconds in client.stages:
                offsets = timer(rng, rate, seconds)
                self.stages.append(_Stage(offsets, order.take(len(offsets), stage=True)))
        else:
            self.lead_time = self.poll_time = self.interval_time = 0.0
            n = client.resolved_num_prompts(len(self.templates))
            timer = (schedules.vllm_send_offsets if client.request_timing == "vllm"
                     else schedules.inferencex_send_offsets)
            self.stages.append(_Stage(timer(rng, n, client.request_rate, client.burstiness),
                                      order.take(n)))
        drawn = [p for s in self.stages for p in s.prompts] + (warm or [])
        needed = max(drawn, default=0) + 1
        if needed > len(self.templates):
            raise ValueError(f"client: {needed} prompts needed but the dataset has "
                             f"{len(self.templates)} (draw more requests, or set "
                             "client.num_unique_prompts to cycle them)")
        # Warm-up phases, each sent at once (within the slots) and waited for: copies of the
        # first prompt, as vllm bench serve sends them, or the order's first prompts (aiperf).
        self.warmups = ([[0]] if client.resolved_ready_check else []) + \
            ([warm if warm is not None else [0] * client.num_warmups]
             if client.num_warmups else [])
        self.num_warmup_requests = client.num_warmup_requests
        self.num_requests = self.num_warmup_requests + sum(len(s.prompts) for s in self.stages)
        # Filled in by the run: per request id, when it was meant to leave and its stage (-1:
        # a warm-up); when the measured requests started; the most requests in flight.
        self.scheduled_at: list[float] = []
        self.stage_of: list[int] = []
        self.benchmark_start_at = math.nan
        self.max_num_in_flight = 0


class _PromptOrder:
    """The prompts requests take, in send order (``client.prompt_order`` over a pool of
    ``pool``), drawn once for the whole run so that warm-ups and stages continue one
    sequence (a shuffled pass goes on where the last take stopped). inference-perf's sequential
    pool restarts each stage (``stage=True``)."""

    def __init__(self, client: ClientConfig, pool: int, rng: np.random.Generator) -> None:
        self.kind = client.prompt_order
        self.restart = bool(client.num_unique_prompts)
        self.pool = pool
        self.rng = rng
        self.drawn: list[int] = []
        self.sent = 0

    def take(self, count: int, stage: bool = False) -> list[int]:
        """The next ``count`` prompts (``stage``: an inference-perf stage's)."""
        if self.kind == "sequential" and not self.restart:
            # Without a pool nothing is reused: an index past the dataset is refused, not
            # wrapped (ClientPlan checks).
            out = list(range(self.sent, self.sent + count))
        elif self.kind == "sequential" and stage:
            out = schedules.prompt_indices(self.rng, "sequential", self.pool, count)
        else:
            short = self.sent + count - len(self.drawn)
            if short > 0:
                # whole passes, so a shuffled pass is never cut and redrawn
                passes = -(-short // self.pool) * self.pool
                self.drawn += schedules.prompt_indices(self.rng, self.kind, self.pool, passes)
            out = self.drawn[self.sent:self.sent + count]
        self.sent += count
        return out


def _with_content(template: Request, k: int) -> Request:
    """``template`` with a prefix identity (its own if it has one), so that a prompt sent twice
    (a warm-up, a cycled pool) is the same tokens to a prefix cache."""
    if template.content is None:
        template.content = Content.from_segments([((CLIENT_PROMPT, k),
                                                   template.num_prompt_tokens)],
                                                 (CLIENT_PROMPT, -1, k))
    return template


class _Slots:
    """``max_concurrency`` slots (None: unlimited) with one waiter: the client's send loop."""

    def __init__(self, env, limit: int | None) -> None:
        self.env = env
        self.free = math.inf if limit is None else limit
        self.in_flight = 0
        self.waiter = None

    def take(self):
        """SimPy steps: wait until a slot is free, then take it."""
        while self.free <= 0:
            self.waiter = self.env.event()
            yield self.waiter
        self.free -= 1
        self.in_flight += 1

    def give(self) -> None:
        """Return a slot (the client received a finish); wake the send loop if it waits."""
        self.free += 1
        self.in_flight -= 1
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter.succeed()


def run_client(cluster, plan: ClientPlan):
    """SimPy process: the warm-up phases, then each stage's requests at their times."""
    env = cluster.env
    slots = _Slots(env, plan.max_concurrency)
    for phase in plan.warmups:
        sent = []
        for k in phase:
            yield from slots.take()
            sent.append(env.process(_send(cluster, plan, slots, k, env.now, -1)))
        yield env.all_of(sent)
    plan.benchmark_start_at = float(env.now)
    last = len(plan.stages) - 1
    for index, stage in enumerate(plan.stages):
        started = env.now
        timer_start = started + plan.lead_time
        sent = []
        for offset, k in zip(stage.offsets, stage.prompts):
            at = timer_start + offset
            if at > env.now:
                yield env.timeout(at - env.now)
                at = env.now    # the clock's time for it (a timeout may land an ulp beside it)
            yield from slots.take()
            sent.append(env.process(_send(cluster, plan, slots, k, at, index)))
        if sent:
            yield env.all_of(sent)
        if plan.poll_time > 0:
            # inference-perf checks for the stage's end once per poll, from the stage's start.
            polls = math.ceil((env.now - started) / plan.poll_time)
            done_at = started + polls * plan.poll_time
            if done_at > env.now:
                yield env.timeout(done_at - env.now)
        if index < last and plan.interval_time > 0:
            yield env.timeout(plan.interval_time)


def _send(cluster, plan: ClientPlan, slots: _Slots, k: int, scheduled_at: float, stage: int):
    """One request's life at the client: sent now, its slot returned on the last token's
    receipt (the engine's finish plus the replica's output delay)."""
    env = cluster.env
    tpl = plan.templates[k]
    content = tpl.content
    req = Request(len(cluster.requests), env.now, tpl.num_prompt_tokens, tpl.num_output_tokens,
                  tpl.priority, tpl.tenant,
                  Content(content.keys, content.ends, content.output_key, content.session_id))
    req.adapter = tpl.adapter
    cluster.requests.append(req)
    plan.scheduled_at.append(scheduled_at)
    plan.stage_of.append(stage)
    if slots.in_flight > plan.max_num_in_flight:
        plan.max_num_in_flight = slots.in_flight
    yield from cluster._request(req)
    if req.status is Status.FINISHED:
        delay = _output_delay(cluster, req.id)
        if delay > 0:
            yield env.timeout(delay)
    slots.give()


def _output_delay(cluster, request_id: int) -> float:
    """The client-side delay of the replica that served ``request_id`` (0 without one)."""
    owners = cluster.replica_of
    i = 0 if owners is None else owners[request_id]
    if i < 0:
        return 0.0
    return float(getattr(cluster.specs[i].cost_model, "output_delay", 0.0))
