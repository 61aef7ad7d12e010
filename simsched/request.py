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
    ABORTED = "aborted"        # ended unfinished: its replica was removed (autoscaling's abort)
    # An attempt given up by its client or lost with its replica (simsched.config.faults).
    TIMED_OUT = "timed_out"    # its client's deadline (TTFT or total) passed first
    CANCELLED = "cancelled"    # its user cancelled it (or a hedged copy won)
    FAILED = "failed"          # its replica failed while it was there


class Request:
    """One inference request and its per-run state.

    ``num_output_tokens`` is the true output length: the simulator knows it, but only oracle
    policies may read it. Timestamps are simulated seconds, NaN until set.

    ``num_computed_tokens`` (vLLM V1's name) counts the tokens whose KV is computed, prompt and
    output alike (a prefix-cache hit counts as computed); each iteration grants a request some
    tokens: a prefill chunk or one decode token. Decoding progress is kept lazily (the scheduler
    advances all decoders with one counter), so read ``num_generated`` and the computed tokens
    through :class:`~simsched.engine.scheduler.core.Scheduler` helpers (``num_generated``,
    ``num_cached``) while a request decodes; after it stops they are exact.
    """

    __slots__ = (
        "id", "arrival_at", "num_prompt_tokens", "num_output_tokens", "priority", "tenant",
        "status", "reject_reason", "sort_key", "queued_at", "admitted_seq",
        # progress
        "num_generated", "num_computed_tokens", "prefill_target", "run_start_step", "ctx_base",
        "finish_step", "epoch",
        # accounting
        "num_preemptions", "num_recomputed_tokens", "num_swaps", "swapped_bytes",
        "first_scheduled_at", "first_token_at", "finished_at", "last_token_at",
        "runs", "gaps", "causes",
        "predicted_output_tokens", "deadline_at",
        "content",   # Content (prefix-cache identity, session, cache hits) or None
        "adapter",   # LoRA adapter id (simsched.engine.lora), -1: the base model
    )

    def __init__(self, id: int, arrival_at: float, num_prompt_tokens: int,
                 num_output_tokens: int, priority: int = 0, tenant: str | None = None,
                 content: "Content | None" = None) -> None:
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
        self.num_computed_tokens = 0    # tokens whose KV is computed (exact unless decoding)
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
        self.content = content
        self.adapter = -1

    def note_preemption(self, cause: "PreemptionCause") -> None:
        """Keep the cause of a recompute preemption (its process received it as an interrupt)."""
        if not self.causes:
            self.causes = []                # a shared empty tuple until the first cause
        self.causes.append(cause)

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache at the first admission (0 without content)."""
        content = self.content
        return 0 if content is None else content.num_cached_tokens

    @property
    def session_id(self) -> int:
        """The session this request is a turn of, or -1."""
        content = self.content
        return -1 if content is None else content.session_id

    def __repr__(self) -> str:
        return (f"Request(id={self.id}, arrival_at={self.arrival_at:.4f}, "
                f"prompt={self.num_prompt_tokens}, output={self.num_output_tokens}, "
                f"priority={self.priority}, status={self.status.value})")


def awaits_release(req: Request) -> bool:
    """Whether ``req`` finished but still holds its KV blocks and slot until its replica's next
    plan (``scheduler.plan_ahead``), which may yet preempt it as vLLM's async scheduler does:
    the request frame's stores copy it only once that plan is made (its ``num_preemptions`` may
    still change). The scheduler's release of a finished request drops its ``sort_key``."""
    return req.status is Status.FINISHED and req.sort_key is not None


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


def chain_key(parent: int, start: int, content_id) -> int:
    """Identity of a content segment that starts at token ``start`` after what ``parent`` names.

    ``content_id`` is an int or a tuple of ints (never a string: string hashes change between
    Python processes, and runs must be reproducible). Keys are 64-bit hashes: two different
    histories share a key with negligible probability.
    """
    return hash((parent, start, content_id))


class Content:
    """What a request's tokens are, as far as a prefix cache can tell, plus per-request cache facts.

    simsched has no token text. A prompt is a sequence of *segments* ``(content_id, num_tokens)``;
    two prompts share their first ``n`` tokens when they agree on every segment that starts
    before ``n`` (same id at the same start: a segment id names a token string, so equal ids at
    equal starts hold equal tokens at equal offsets). Each segment gets a chained key
    (:func:`chain_key` of the previous segment's key, its start and its id), so a key names the
    whole history before it. ``ends`` are the segments' cumulative end offsets (the last is the
    prompt length). The output gets one more key, ``output_key``, chained after the prompt from
    ``output_id``: the next turn of a session names it to reuse the KV of the generated tokens.

    A request without content (``Request.content is None``) never shares KV blocks. An instance
    with no keys only carries ``session_id``. ``num_cached_tokens`` is set by the scheduler at the
    first admission (prompt tokens served from the cache, as vLLM reports it); ``runs`` is the
    KV cache's memo of the keys cut to its block size.
    """

    __slots__ = ("keys", "ends", "output_key", "session_id", "num_cached_tokens", "runs")

    def __init__(self, keys: tuple = (), ends: tuple = (), output_key: int = 0,
                 session_id: int = -1) -> None:
        if len(keys) != len(ends):
            raise ValueError(f"Content: {len(keys)} keys but {len(ends)} segment ends")
        self.keys = keys
        self.ends = ends
        self.output_key = output_key
        self.session_id = session_id
        self.num_cached_tokens = 0
        self.runs = None

    @property
    def num_tokens(self) -> int:
        """Tokens the segments cover (the prompt length)."""
        return self.ends[-1] if self.ends else 0

    @classmethod
    def from_segments(cls, segments, output_id, session_id: int = -1,
                      parent: "Content | None" = None, num_parent_output: int = 0) -> "Content":
        """Content of ``segments`` ``[(content_id, num_tokens), ...]``, output named ``output_id``.

        With ``parent`` the prompt starts with the parent's prompt and its first
        ``num_parent_output`` generated tokens (a session's next turn), then ``segments``.
        """
        if parent is not None and parent.keys:
            keys, ends = list(parent.keys), list(parent.ends)
            if num_parent_output:
                keys.append(parent.output_key)
                ends.append(ends[-1] + num_parent_output)
        else:
            keys, ends = [], []
        key = keys[-1] if keys else 0
        end = ends[-1] if ends else 0
        for cid, n in segments:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"segment {cid!r} must have an integer number of tokens >= 0, "
                                 f"got {n!r}")
            if n:
                key = chain_key(key, end, cid)
                end += n
                keys.append(key)
                ends.append(end)
        return cls(tuple(keys), tuple(ends), chain_key(key, end, output_id), session_id)

    def __repr__(self) -> str:
        return (f"Content({len(self.keys)} segments, {self.num_tokens} tokens, "
                f"session_id={self.session_id})")
