"""Admission constraints: what a waiting request must get before it is admitted, asked in order.

The scheduler admits waiting requests in queue order (``Scheduler._admit``). Before it looks at
the head of the queue it asks the constraints whose answer does not depend on the request (a
sequence slot, a prefill slot, token budget left); it then sizes the head's first prefill chunk
under the token budget and asks the added constraints (LoRA adapter slots, a per-tenant cap, ...,
each with :meth:`~simsched.engine.scheduler.core.Scheduler.add_constraint`) and last the KV blocks for
that chunk. The first refusal ends the iteration's admissions (nobody overtakes the refused
request; a constraint that ``skips`` sets the request aside instead and the scan goes on), unless preempting lower-ranked running requests can lift it: a sequence slot under a
preemptive queue policy, KV blocks under one or with ``preemption=True``. Those are asked last, so
nobody is preempted for a request another constraint refuses anyway.

A refusal can be remembered. :meth:`AdmissionConstraint.stamp` snapshots what the constraint's
answer depends on, and :meth:`AdmissionConstraint.still_blocked` tells from a snapshot whether
the answer is still no. The scheduler keeps one memo, the last refusal of the queue's head (the
constraint, its stamp and the queue as it was), and skips the admission scan while the queue is
unchanged and the constraint still refuses (``Scheduler._admit_waiting``): KV-bound runs spend
many iterations with a refused head, and those skip the scan. A stamp must cover everything the
answer depends on, or the memo goes stale and admissions are skipped that should happen; a
constraint that cannot say returns None from ``stamp`` (the default) and is asked again every
iteration.

The built-in constraints are asked inline by ``Scheduler._admit`` (a call each per admission
would cost more than the rest of it); their ``admits`` here is the definition it copies.
"""

from __future__ import annotations


class AdmissionConstraint:
    """One condition a waiting request must meet to be admitted.

    Subclass it, implement :meth:`admits` (and :meth:`stamp` with :meth:`still_blocked` to be
    remembered), and register an instance with ``Scheduler.add_constraint``. ``preemptible``:
    preempting lower-ranked running requests can lift a refusal (only the built-in sequence
    slots and KV blocks: preemption frees nothing else). ``skips``: a refused request is set
    aside for this iteration and the requests behind it may be admitted (vLLM's LoRA rule),
    instead of the refusal ending the iteration's admissions.
    """

    __slots__ = ()
    name = "constraint"
    preemptible = False
    skips = False

    def admits(self, sched, req, need: int) -> bool:
        """Whether ``req``, the head of ``sched``'s waiting queue, may be admitted now, its
        first prefill chunk needing ``need`` more KV blocks."""
        raise NotImplementedError

    def stamp(self, sched):
        """What a refusal made now depends on, for :meth:`still_blocked`; None: not remembered."""
        return None

    def still_blocked(self, sched, stamp) -> bool:
        """Whether a refusal stamped ``stamp`` would be made again now (the queue unchanged)."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SeqSlots(AdmissionConstraint):
    """Fewer than ``max_num_seqs`` requests run; a preemptive queue policy may free a slot."""

    __slots__ = ("max_num_seqs", "preemptible")
    name = "max_num_seqs"

    def __init__(self, max_num_seqs: int, preemptible: bool = False) -> None:
        self.max_num_seqs = max_num_seqs
        self.preemptible = preemptible

    def admits(self, sched, req, need: int) -> bool:
        return len(sched.running) < self.max_num_seqs


class PrefillSlots(AdmissionConstraint):
    """At most ``max_num_prefills`` prefill chunks per iteration (continuing ones included)."""

    __slots__ = ("max_num_prefills",)
    name = "max_num_prefills"

    def __init__(self, max_num_prefills: int) -> None:
        self.max_num_prefills = max_num_prefills

    def admits(self, sched, req, need: int) -> bool:
        return len(sched.planned) < self.max_num_prefills


class TokenBudget(AdmissionConstraint):
    """Some of ``max_num_batched_tokens`` is left in this iteration (decodes and prefills
    spend it). Without chunked prefill a prompt also waits for a budget that takes it whole
    (the scheduler sizes the chunk). Static batching, which admits whole batches, has none."""

    __slots__ = ()
    name = "max_num_batched_tokens"

    def admits(self, sched, req, need: int) -> bool:
        return sched.budget_left() > 0


class KVBlocks(AdmissionConstraint):
    """The first chunk's ``need`` KV blocks are free, with the watermark kept back while others
    run (headroom for them to grow; with none running it would only block a request that fits).

    A refusal holds while no more blocks are free, the budget is no smaller (a smaller one may
    shrink the chunk) and the watermark applies as before. ``memoise=False`` for a cache that
    shares blocks: another request may compute, or evict, the prefix a refused one would reuse.
    """

    __slots__ = ("preemptible", "memoise")
    name = "kv_blocks"

    def __init__(self, preemptible: bool = False, memoise: bool = True) -> None:
        self.preemptible = preemptible
        self.memoise = memoise

    def admits(self, sched, req, need: int) -> bool:
        kv = sched.kv
        return kv.num_free - need >= (kv.watermark_blocks if sched.running else 0)

    def stamp(self, sched):
        if not self.memoise:
            return None
        return sched.kv.num_free, sched.budget_left(), bool(sched.running)

    def still_blocked(self, sched, stamp) -> bool:
        free, budget, running = stamp
        if sched.kv.num_free > free or bool(sched.running) != running:
            return False
        # sched.budget_left(), inlined: this runs in every iteration of a KV-bound stretch.
        return sched.cfg.max_num_batched_tokens - sched.planned_tokens \
            - (len(sched.decoding) if sched._decodes_count else 0) >= budget
