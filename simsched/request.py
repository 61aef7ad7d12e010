"""A request's identity, scheduling state and timestamps."""

from __future__ import annotations

import math
from enum import Enum

NAN = math.nan


class Status(str, Enum):
    """Where a request is in its life."""

    PENDING = "pending"        # not yet arrived
    WAITING = "waiting"        # in the waiting queue (new or preempted by recompute)
    RUNNING = "running"        # admitted: prefilling or decoding
    SWAPPED = "swapped"        # preempted by swap: KV blocks in CPU memory
    FINISHED = "finished"
    REJECTED = "rejected"      # can never be served (too long for the model or the KV cache)


class Request:
    """One inference request and its per-run state.

    ``num_output_tokens`` is the true output length: the simulator knows it, but only oracle
    policies may read it. Timestamps are simulated seconds, NaN until set.

    Decoding progress is kept lazily (the scheduler advances all decoders with one counter), so
    read ``num_generated`` and ``num_cached`` through :class:`~simsched.engine.scheduler.Scheduler`
    helpers while a request runs; after it stops they are exact.
    """

    __slots__ = (
        "id", "arrival_at", "num_prompt_tokens", "num_output_tokens", "priority", "tenant",
        "status", "reject_reason", "sort_key", "queued_at", "admitted_seq",
        # progress
        "num_generated", "num_computed", "prefill_target", "run_start_step", "ctx_base",
        "finish_step", "epoch",
        # accounting
        "num_preemptions", "num_recomputed_tokens", "num_swaps", "swapped_bytes",
        "first_scheduled_at", "first_token_at", "finished_at", "last_token_at",
        "runs", "gaps", "causes",
        "predicted_output_tokens", "deadline_at",
    )

    def __init__(self, id: int, arrival_at: float, num_prompt_tokens: int,
                 num_output_tokens: int, priority: int = 0, tenant: str | None = None) -> None:
        self.id = id
        self.arrival_at = float(arrival_at)
        self.num_prompt_tokens = int(num_prompt_tokens)
        self.num_output_tokens = int(num_output_tokens)
        self.priority = int(priority)
        self.tenant = tenant
        self.status = Status.PENDING
        self.reject_reason = ""
        self.sort_key: tuple = ()
        self.queued_at = NAN
        self.admitted_seq = -1
        self.num_generated = 0          # output tokens emitted so far (exact unless decoding)
        self.num_computed = 0           # tokens whose KV is computed (exact unless decoding)
        self.prefill_target = self.num_prompt_tokens
        self.run_start_step = -1        # first decode step of the current decode run
        self.ctx_base = 0               # cached tokens at run start minus run_start_step
        self.finish_step = -1
        self.epoch = 0                  # bumped on every preemption: stale due-events are ignored
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.num_swaps = 0
        self.swapped_bytes = 0.0
        self.first_scheduled_at = NAN
        self.first_token_at = NAN
        self.finished_at = NAN
        self.last_token_at = NAN
        # Decode runs as (prev_token_at, first_step, last_step): tokens in consecutive decode
        # steps, so per-token gaps are rebuilt from step end times at the end, not stored per token.
        self.runs: tuple = ()           # flat (prev_token_at, first_step, last_step) triples
        # Rare, so a shared empty tuple until the first entry (saves memory on big runs).
        self.gaps: list | tuple = ()    # gaps of tokens emitted by a (re)prefill after a stall
        self.causes: list | tuple = ()  # PreemptionCause objects received by the process
        self.predicted_output_tokens = NAN
        self.deadline_at = NAN

    def __repr__(self) -> str:
        return (f"Request(id={self.id}, arrival_at={self.arrival_at:.4f}, "
                f"prompt={self.num_prompt_tokens}, output={self.num_output_tokens}, "
                f"priority={self.priority}, status={self.status.value})")


class PreemptionCause:
    """Why a request's process was interrupted: victim, preemptor or reason, time, lost work."""

    __slots__ = ("request_id", "reason", "preempted_by", "at", "num_lost_tokens", "mode")

    def __init__(self, request_id: int, reason: str, preempted_by: int | None, at: float,
                 num_lost_tokens: int, mode: str = "recompute") -> None:
        self.request_id = request_id
        self.reason = reason            # "kv_full" (running request lacked a block) or "admission"
        self.preempted_by = preempted_by
        self.at = at
        self.num_lost_tokens = num_lost_tokens
        self.mode = mode

    def __repr__(self) -> str:
        return (f"PreemptionCause(request_id={self.request_id}, reason={self.reason!r}, "
                f"preempted_by={self.preempted_by}, at={self.at:.6f}, "
                f"num_lost_tokens={self.num_lost_tokens}, mode={self.mode!r})")
