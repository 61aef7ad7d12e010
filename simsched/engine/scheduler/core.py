"""One iteration's scheduling decision: decodes, partial prefills, admissions, preemptions.

The scheduler is a plain object (no SimPy). The engine calls :meth:`Scheduler.schedule` at the
start of an iteration, which returns the :class:`~simsched.cost.base.Batch` to run, and
:meth:`Scheduler.commit` at its end, which advances progress and reports first tokens and
finished requests.

Decodes are advanced lazily (:mod:`simsched.engine.scheduler.decode`): one step counter for all decoders,
their last steps in a calendar dict and their KV growth one O(1) grant per group, so an
iteration costs O(events) rather than O(batch), and never O(waiting queue). A queue policy
(:class:`~simsched.policies.base.QueuePolicy`) with a per-iteration ``refresh`` hook would add
O(running) per iteration (none has one: MLFQ ranks lazily).

Partial prefills, swap-ins and admissions are planned in :mod:`simsched.engine.scheduler.admission`, under
the admission constraints of :mod:`simsched.engine.scheduler.constraints`. Preemption
(:mod:`simsched.engine.scheduler.preemption`) recomputes (the victim's KV is dropped and it re-queues) or,
with ``preemption_mode="swap"``, swaps the victim's KV to CPU memory
(:class:`~simsched.engine.scheduler.swap.SwapSpace`). The KV cache is asked only through
:class:`~simsched.engine.kv.cache.KVManager`: with a prefix cache
(:mod:`simsched.engine.kv.prefix_cache`) an admission first reuses the cached blocks of the
request's prefix and prefills only the rest, with the cached tokens as context.

The scheduler owns all the state (``__init__`` declares every field); its methods live in
layers that call down only: :mod:`~simsched.engine.scheduler.decode` (decode runs, the bottom),
:mod:`~simsched.engine.scheduler.preemption` (victims, stopping a request, one-by-one KV growth) above it,
:mod:`~simsched.engine.scheduler.admission` above that, :mod:`~simsched.engine.scheduler.handoff` beside them (it
uses decode only), and this module's ``schedule`` and ``commit`` on top. Each layer's class
docstring lists the fields it reads and changes.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from simsched.config.parts import CacheConfig
from simsched.cost.base import Batch
from simsched.engine.kv.cache import KVManager
from simsched.policies import VICTIM_POLICIES, make_queue
from simsched.policies.base import QueuePolicy
from simsched.engine.scheduler.admission import AdmissionMixin
from simsched.engine.scheduler.constraints import KVBlocks, PrefillSlots, SeqSlots, TokenBudget
from simsched.engine.scheduler.decode import DecodeMixin
from simsched.engine.scheduler.handoff import HandoffMixin
from simsched.engine.scheduler.plan_ahead import PlanAheadMixin
from simsched.engine.scheduler.preemption import PreemptionMixin
from simsched.engine.scheduler.queue_binding import bind_queue
from simsched.engine.removal import take_all
from simsched.engine.scheduler.swap import SwapSpace
from simsched.request import PreemptionCause, Request, Status

RUNNING, WAITING, FINISHED, REJECTED = (Status.RUNNING, Status.WAITING, Status.FINISHED,
                                        Status.REJECTED)
# The config's default (cache.swap_space_gib), for schedulers built without a config's cache.
DEFAULT_SWAP_SPACE_BYTES = CacheConfig.swap_space_gib * 2**30
_new_batch = object.__new__
_NONE: tuple = ()       # commit's "no requests" (read-only, shared)


class Scheduler(AdmissionMixin, DecodeMixin, HandoffMixin, PlanAheadMixin, PreemptionMixin):
    """Stall-free continuous batching (Sarathi-Serve style) with a paged KV cache.

    ``style="prefill_first"`` runs prefill-only iterations whenever a waiting request can be
    admitted, without chunking (vLLM V0 / Orca); ``style="static"`` admits a new batch only when
    the previous one has fully finished.

    ``rng`` feeds randomised queue policies (a noisy length predictor); ``kv_bytes_per_block`` and
    ``swap_space_bytes`` size swap preemption (the engine passes them from the config).
    ``constraints`` lists the admission constraints in the order they are asked;
    :meth:`add_constraint` adds one.
    """

    __slots__ = ("cfg", "kv", "block_size", "max_model_len", "_max_total",
                 "num_cached_tokens", "_queue", "_note_time", "_queue_update", "_queue_refresh",
                 "_queue_hooks", "_fixed_order", "_waiting", "_forget", "preemptive",
                 "_static_ranks", "_may_preempt", "_memo_failed", "running_version",
                 "meter", "choose_victim", "swap", "swapping", "swapped",
                 "swap_out_bytes", "swap_in_bytes", "chunking",
                 "max_num_prefills", "running", "decoding", "prefilling", "step", "step_ended_at",
                 "ctx_base_sum", "growing", "_late", "finish_due", "num_admitted", "planned",
                 "planned_tokens", "decode_step", "preempted", "_decodes_count", "_grown_step",
                 "_requeue", "now", "handoff", "held", "incoming", "ready", "_prefill_first",
                 "_num_pushed", "_blocked", "_static", "_special", "_memo_heads", "_memo_kv",
                 "constraints", "_kv_blocks", "_added", "_skipped", "_plan_ahead", "_unseen",
                 "_zombies", "_due_steps",
                 "__dict__")     # the fields above are slots; anything else a user sets goes here

    def __init__(self, cfg, kv: KVManager, max_model_len: int | None = None,
                 rng: np.random.Generator | None = None, kv_bytes_per_block: float = 0.0,
                 swap_space_bytes: float = DEFAULT_SWAP_SPACE_BYTES) -> None:
        self.cfg = cfg
        self.kv = kv
        self.block_size = kv.block_size
        self.max_model_len = max_model_len
        # The longest prompt + output ever servable: within max_model_len, and its peak KV (the
        # last token's is never written) fits the cache, admitted once the engine is empty.
        self._max_total = kv.num_blocks * kv.block_size + 1
        if max_model_len is not None:
            self._max_total = min(self._max_total, max_model_len)
        self.num_cached_tokens = 0                # prompt tokens served from the prefix cache
        self.queue = make_queue(cfg.policy, cfg.policy_options, rng)
        self.running_version = 0
        self.choose_victim = VICTIM_POLICIES[cfg.victim_policy]
        self.swap = SwapSpace(swap_space_bytes, kv_bytes_per_block)
        self.swapping = cfg.preemption_mode == "swap"
        self.swapped = self.swap.swapped          # the swap space's, tested every iteration
        self.swap_out_bytes = 0.0                 # this iteration's transfers
        self.swap_in_bytes = 0.0
        self.chunking = cfg.enable_chunked_prefill and cfg.style != "prefill_first"
        # No cap: an int no count reaches (an int-int comparison on the admission path).
        self.max_num_prefills = cfg.max_num_prefills or sys.maxsize
        self.running: dict[int, Request] = {}     # admission order: the last is the newest
        self.decoding: dict[int, Request] = {}
        self.prefilling: dict[int, Request] = {}
        self.step = 0                             # decode steps completed
        # When the latest decode step ended: a decode run always closes at the latest step.
        # (Every step's end is in the iteration log: see log.decode_step_ends.)
        self.step_ended_at = math.nan
        self.ctx_base_sum = 0                     # sum of decoders' ctx_base
        # Decoders by the residue (mod block_size) of the steps at which they take a new block,
        # in the order they started decoding; ``_late``: those that started after their first
        # block's step had been grown (after an iteration without decodes).
        self.growing: list[dict[int, Request]] = [{} for _ in range(self.block_size)]
        self._late: list[tuple[Request, int]] = []
        self.finish_due: dict[int, list] = {}
        self._due_steps: list[int] | None = None    # its steps as a heap, for quiet steps
        self.num_admitted = 0
        # this iteration's decision
        self.planned: dict[int, tuple] = {}       # id -> (request, prefill chunk)
        self.planned_tokens = 0
        self.decode_step = 0                      # the step this iteration runs, 0 if none
        self.preempted: list[tuple[Request, PreemptionCause]] = []
        self._decodes_count = True
        self._grown_step = 0                      # the decode step whose new blocks were handed out
        self._requeue: list[Request] = []
        self.now = 0.0
        # Disaggregated prefill/decode (simsched.cluster.disagg): ids to hand off after their
        # prefill; handed-off requests whose KV stays here until its transfer ends; requests
        # whose KV blocks are reserved here for a transfer; and those whose KV has arrived.
        self.handoff: set[int] = set()
        self.held: dict[int, Request] = {}
        self.incoming: dict[int, Request] = {}
        self.ready: list[Request] = []
        self._prefill_first = cfg.style == "prefill_first"
        self._num_pushed = 0                      # requests ever pushed to the queue
        self._static = cfg.style == "static"
        # Admission constraints (simsched.engine.scheduler.constraints): the built-in ones, asked inline
        # by _admit; add_constraint adds more. A preemptive policy may preempt for a sequence
        # slot, and with preemption=True for KV blocks.
        may_preempt = bool(cfg.preemption or self.preemptive)
        self._kv_blocks = KVBlocks(preemptible=may_preempt, memoise=not kv.prefix_caching)
        self.constraints: list = [SeqSlots(cfg.max_num_seqs, preemptible=self.preemptive),
                                  PrefillSlots(self.max_num_prefills),
                                  *(() if self._static else (TokenBudget(),)), self._kv_blocks]
        self._added: tuple = ()                   # constraints add_constraint added
        self._skipped: list | None = None         # set aside by a scan (a constraint that skips)
        # plan_ahead (vLLM's async scheduling): arrivals not yet seen by a plan, and finished
        # requests still holding their blocks and slots until the next plan is made.
        self._plan_ahead = cfg.plan_ahead
        self._unseen: list[Request] = []
        self._zombies: list[Request] = []
        if self._plan_ahead:
            self.schedule = self._schedule_ahead    # off, schedule() pays nothing for it
        self._update_special()

    @property
    def queue(self):
        """The waiting queue (a queue policy's object)."""
        return self._queue

    @queue.setter
    def queue(self, queue: QueuePolicy) -> None:
        # The policy's hooks and the fast paths its type allows (simsched.engine.scheduler.queue_binding).
        (self._queue, self._note_time, self._queue_update, self._queue_refresh,
         self._queue_hooks, self.preemptive, self._may_preempt, self._static_ranks,
         self._memo_failed, self.meter, self._fixed_order, self._waiting,
         self._forget) = bind_queue(self, queue)
        if hasattr(self, "_static"):        # a queue set after __init__: flags from it anew
            self._update_special()

    def has_work(self) -> bool:
        """Whether anything is waiting or running."""
        return bool(self.running or self._waiting or self._requeue or self.swapped
                    or self.ready or self._unseen)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue."""
        return len(self._waiting) + len(self._requeue) + len(self._unseen)

    # ----------------------------------------------------------------- arrivals
    def add(self, req: Request, now: float) -> bool:
        """Queue an arriving request, or reject it (returns False) if it can never be served."""
        total = req.num_prompt_tokens + req.num_output_tokens
        if total > self._max_total and not (self.handoff and self._held_fits(req, total)):
            req.status = REJECTED
            req.reject_reason = self._too_long(total)
            return False
        req.status = WAITING
        req.queued_at = now
        # Replica._release queues async scheduling's held-back arrivals without this call:
        # a change here is a change there.
        if self._plan_ahead:
            self._unseen.append(req)    # the plan being made now (or made already) missed it
            return True
        self._queue.push(req, now)
        self._num_pushed += 1
        return True

    def _too_long(self, total: int) -> str:
        if self.max_model_len is not None and total > self.max_model_len:
            return (f"prompt + output = {total} tokens exceeds max_model_len "
                    f"{self.max_model_len}")
        need = self.kv.blocks_for(total - 1)
        return f"needs {need} KV blocks, the cache has {self.kv.num_blocks}"

    # ----------------------------------------------------------------- one iteration
    def schedule(self, now: float) -> Batch:
        """Decide the next iteration's batch (may preempt; see ``self.preempted``)."""
        self.now = now
        self.planned_tokens = 0
        self.decode_step = 0
        # One test for what most iterations skip (see _prepare).
        if self._special or self.planned or self.preempted or self.ready:
            self._prepare(now)
        step1 = self.step + 1
        # Prefill-first plans admissions first and decodes only when it admits nobody.
        if not self._prefill_first or self._admit_prefill_first():
            # Decoders whose token at this step starts a new KV block get it: each growth group
            # once per step, in one O(1) grant while the cache has the blocks (decode.py).
            if step1 != self._grown_step:
                self._grown_step = step1
                group = step1 % self.block_size
                members = self.growing[group]
                if members and not self.kv.grow_group(group, len(members)):
                    self._grow_each(list(members.values()))
            if self._late:
                self._grow_late()
            if not self._prefill_first:
                if self.prefilling:
                    self._continue_prefills()
                # vLLM V1: a step that preempted (a running request lacked KV) admits nobody.
                if (self._waiting or self.swapped) \
                        and (not self.preempted or self.cfg.admit_after_preemption):
                    self._admit_waiting()
        if self.preempted:
            self._settle_victims(now)
        n_dec = len(self.decoding) if self._decodes_count else 0
        # A Batch built field by field: Batch.__init__'s copies and checks cost more than the
        # rest of an idle-queue iteration's scheduling.
        batch = _new_batch(Batch)
        if n_dec:
            self.decode_step = step1
            batch.decode_context_sum = self.ctx_base_sum + n_dec * step1
        else:
            batch.decode_context_sum = 0
        batch.num_decode_seqs = n_dec
        planned = self.planned
        if planned:
            batch.prefill_new_tokens = [chunk for _, chunk in planned.values()]
            batch.prefill_cached_tokens = [req.num_computed_tokens for req, _ in planned.values()]
        else:
            batch.prefill_new_tokens = []
            batch.prefill_cached_tokens = []
        batch.swap_out_bytes = self.swap_out_bytes
        batch.swap_in_bytes = self.swap_in_bytes
        return batch

    def _prepare(self, now: float) -> None:
        """What an iteration starts with only sometimes: dropping a plan made earlier at this
        instant (the engine plans again after preempting everything runnable) and its victims,
        resetting swap transfers, the queue policy's time hooks, and disaggregated arrivals."""
        if self.planned:
            self.planned = {}
        if self.preempted:
            self.preempted = []
        if self.swapping:
            self.swap_out_bytes = self.swap_in_bytes = 0.0
        if self._queue_hooks:
            if self._note_time:
                self._queue.now = now
            elif self._queue_update is not None:
                self._queue_update(now)
            if self._queue_refresh is not None:
                self._queue_refresh(self.running.values(), self)
        if self.ready:
            self._insert_ready()

    def _update_special(self) -> None:
        # Whether every iteration has _prepare's work: swap transfers to reset, queue hooks.
        self._special = bool(self.swapping or self._queue_hooks)
        # Whether a refused queue head stays the head while nothing is pushed or admitted (a
        # queue of fixed keys; static batching's refusals count blocks reserved in the scan).
        self._memo_heads = self._fixed_order and not self._static
        self._memo_kv = self._memo_heads and self._kv_blocks.memoise
        self._blocked: tuple | None = None      # see _admit_waiting

    def _admit_prefill_first(self) -> bool:
        """Prefill-first style: admit (whole prompts) if possible; True if nobody was, so the
        iteration decodes."""
        self._decodes_count = False
        if self.swapped:
            self._swap_in()
        if self._may_admit():
            self._admit()
        if self.planned:
            return False
        self._decodes_count = True
        return True

    def _settle_victims(self, now: float) -> None:
        """Queue this iteration's recomputed victims; file its swapped-out ones."""
        if self._requeue:
            for req in self._requeue:
                self._queue.push(req, now)
            self._num_pushed += len(self._requeue)
            self._requeue.clear()
        if self.swapping:
            self.swap.settle()

    # ----------------------------------------------------------------- end of iteration
    def commit(self, now: float) -> tuple[list[Request], list[Request]]:
        """Apply the iteration that just ended at ``now``: (first-token requests, finished)
        (an empty tuple where there are none)."""
        finished: list[Request] = _NONE
        s = self.decode_step
        if s:
            self.step = s
            self.step_ended_at = now
            due = self.finish_due.pop(s, None)
            if due:
                finished = self._finish_due(due, s, now)
        planned = self.planned
        if not planned:
            return _NONE, finished      # most iterations: nothing to report, nothing allocated
        firsts: list[Request] = []
        if finished is _NONE:
            finished = []
        for req, chunk in planned.values():
            req.num_computed_tokens += chunk
            if req.num_computed_tokens < req.prefill_target:
                continue
            del self.prefilling[req.id]
            req.num_generated += 1
            if self.meter is not None:
                self.meter.first_token(req)
            if req.first_token_at != req.first_token_at:  # NaN: this is the first token
                req.first_token_at = now
                firsts.append(req)
            else:
                if not req.gaps:
                    req.gaps = []
                req.gaps.append(now - req.last_token_at)  # stall of a recomputed request
            req.last_token_at = now
            if req.num_generated >= req.num_output_tokens:
                self._finish(req, now, finished)
            elif self.handoff and req.id in self.handoff:
                self._hand_off(req)
            else:
                self._start_run(req)
        self.planned = {}
        return firsts, finished

    def _finish_due(self, due: list, s: int, now: float) -> list[Request]:
        """Finish the decoders whose last step is ``s`` (``due``: their ``finish_due`` entries;
        one preempted since is stale), which ended at ``now``; return them."""
        if self._due_steps is not None:
            self._forget_due_steps(s)
        finished: list[Request] = []
        for req, epoch in due:
            if req.epoch == epoch and req.run_start_step >= 0:
                self._close_run(req, s)
                self._finish(req, now, finished)
        return finished

    def finish_quiet_step(self) -> list[Request]:
        """After :meth:`take_quiet_steps` applied a run whose last step is a decoder's last:
        finish the decoders due then, as :meth:`commit` would (see :mod:`simsched.engine.scheduler.quiet`)."""
        due = self.finish_due.pop(self.step, None)
        return self._finish_due(due, self.step, self.step_ended_at) if due else _NONE

    def _finish(self, req: Request, now: float, finished: list) -> None:
        req.status = FINISHED
        req.finished_at = now
        req.num_generated = req.num_output_tokens
        if self._plan_ahead:
            # Its blocks and slot go after the next plan; its blocks stop growing now.
            self.kv.leave_group(req.id)
            self._zombies.append(req)
        else:
            self._release(req)
        finished.append(req)

    def take_all(self) -> list[tuple[Request, int]]:
        """Stop and remove every unfinished request held here (its replica is being removed):
        ``(request, tokens whose KV was dropped)`` each (see :mod:`simsched.engine.removal`)."""
        return take_all(self)
