"""Lazy decoding, as methods the scheduler inherits: one step counter for every decoder.

Every running decoder computes one token in every *decode step* (the config guarantees the token
budget covers ``max_num_seqs`` decodes), so the scheduler's ``step`` counter advances them all; a
decoder's progress is its count at the start of its decode run plus the steps since. Its last
step is known in advance (the scheduler's ``finish_due`` calendar). A decoder needs a new KV
block every ``block_size`` steps, at steps of one residue modulo ``block_size``: decoders are
grouped by that residue (``growing``), and when the cache has the blocks a whole group grows in
O(1) (:meth:`~simsched.engine.kv.cache.KVCacheManager.grow_group`); otherwise its members take
one block each, in the order they started decoding, preempting (victim policy) when none is
free (:meth:`~simsched.engine.scheduler.preemption.PreemptionMixin._grow_each`).
"""

from __future__ import annotations

from heapq import heappop, heappush

from simsched.request import Request


class DecodeMixin:
    """Decode runs and lazy progress for :class:`~simsched.engine.scheduler.core.Scheduler`.

    The bottom layer: it calls no other part of the scheduler. It reads ``kv``, ``block_size``,
    ``meter``, ``step``, ``step_ended_at`` and ``_grown_step``, and changes the decode state:
    ``decoding``, ``ctx_base_sum``, ``growing``, ``finish_due`` (with quiet steps, its steps as a
    heap too: ``_due_steps``) and ``_late`` (and a request's own run fields). Growing decoders
    one by one, which may preempt, is preemption's (``PreemptionMixin._grow_each``).
    Quiet steps (:mod:`simsched.engine.scheduler.quiet`) also read what else the next steps could do
    (``planned``, ``preempted``, ``ready``, ``prefilling``, ``_waiting``, ``_requeue``,
    ``swapped``) and set what a step's ``schedule()``/``commit()`` leave (``now``,
    ``planned_tokens``, ``decode_step``).
    """

    __slots__ = ()

    def num_generated(self, req: Request) -> int:
        """Output tokens ``req`` has emitted so far."""
        s0 = req.run_start_step
        if s0 < 0 or self.step < s0:
            return req.num_generated
        return req.num_generated + self.step - s0 + 1

    def num_cached(self, req: Request) -> int:
        """Tokens of ``req`` whose KV is in the cache."""
        if req.run_start_step >= 0:
            return req.ctx_base + self.step + 1
        return req.num_computed_tokens

    def _start_run(self, req: Request, resumed: bool = False) -> None:
        """Make ``req`` a decoder from the next decode step on (``resumed``: after a swap-in)."""
        s1 = self.step + 1
        cached = req.num_computed_tokens
        rid = req.id
        req.run_start_step = s1
        req.ctx_base = ctx_base = cached - s1
        self.ctx_base_sum += ctx_base
        req.finish_step = last = s1 + req.num_output_tokens - req.num_generated - 1
        self.decoding[rid] = req
        due = self.finish_due.get(last)
        if due is None:
            self.finish_due[last] = [(req, req.epoch)]
            if self._due_steps is not None:
                heappush(self._due_steps, last)
        else:
            due.append((req, req.epoch))
        if self.meter is not None:
            self.meter.start_decoding(req, self.step)
        block_size = self.block_size
        first_block = s1 + (-cached) % block_size
        if resumed and first_block == self._grown_step:
            # This step's new blocks were already handed out: take ours now (swap_in checked).
            self.kv.add_block(rid)
            first_block += block_size
        if first_block <= last:
            group = first_block % block_size
            self.growing[group][rid] = req
            self.kv.join_group(rid, group)
            if first_block == self._grown_step:
                self._late.append((req, req.epoch))  # this step's blocks went out already

    def _close_run(self, req: Request, last_step: int) -> None:
        """End ``req``'s decode run after step ``last_step``, the latest step (``self.step``)."""
        if last_step >= req.run_start_step:
            req.runs += (req.last_token_at, req.run_start_step, last_step)
            req.last_token_at = self.step_ended_at
        req.num_generated += max(0, last_step - req.run_start_step + 1)
        del self.decoding[req.id]
        # Out of its growth group here; the KV manager settles its group membership when the
        # blocks are freed, which every caller does next (or the run is over).
        self.growing[-req.ctx_base % self.block_size].pop(req.id, None)
        self.ctx_base_sum -= req.ctx_base
        req.run_start_step = -1
        if self.meter is not None:
            self.meter.stop_decoding(req, last_step)

    def close(self) -> None:
        """Freeze lazy progress of requests still running when the run stops."""
        for req in list(self.decoding.values()):
            self._close_run(req, self.step)
            req.num_computed_tokens = req.num_prompt_tokens + req.num_generated - 1

    # ------------------------------------------------------------ quiet steps (engine/scheduler/quiet.py)
    def track_due_steps(self) -> None:
        """Keep ``finish_due``'s steps in a heap too (``_due_steps``), so :meth:`quiet_steps`
        finds the next decoder's last step in O(1); entries leave it as their step ends
        (:meth:`_forget_due_steps`)."""
        self._due_steps = sorted(self.finish_due)

    def _forget_due_steps(self, s: int) -> None:
        """Step ``s``'s ``finish_due`` entry is gone: so is every heap entry up to it."""
        heap = self._due_steps
        while heap and heap[0] <= s:
            heappop(heap)

    def quiet_steps(self, limit: int) -> int:
        """How many of the next decode steps (at most ``limit``) are quiet: nothing waits, is
        planned, prefills or is preempted, and every growth group's new blocks are free (so
        ``schedule()`` would grow it in O(1), preempting nobody). No decoder finishes before the
        last of them (it may finish there: ``step + k`` in ``finish_due``). 0 if none is.
        Needs :meth:`track_due_steps`."""
        if self.planned or self.preempted or self.ready or self.prefilling or self._waiting \
                or self._requeue or self.swapped or self._late or not self.decoding:
            return 0
        s = self.step
        heap = self._due_steps
        k = heap[0] - s if heap and heap[0] - s < limit else limit
        kv = self.kv
        free = kv.num_free - kv.num_evictable
        block_size = self.block_size
        # Each decoder takes at most one block per block_size steps: if that many are free, the
        # whole run's growth is (the usual case, checked without a loop).
        if len(self.decoding) * (1 + (k - 1) // block_size) <= free:
            return k
        growing, grown = self.growing, self._grown_step
        for j in range(k):
            s += 1
            need = len(growing[s % block_size]) if s != grown else 0
            if need > free:
                return j
            free -= need
        return k

    def take_quiet_steps(self, num_steps: int, last_started_at: float,
                         ended_at: float) -> list[int]:
        """Apply the next ``num_steps`` quiet steps (at most what :meth:`quiet_steps` gave) as
        their ``schedule()`` and ``commit()`` pairs would, the last started at
        ``last_started_at`` and ended at ``ended_at``; return the KV blocks each step's growth
        group took (0: none, or grown already)."""
        block_size = self.block_size
        first = self.step + 1
        # Step s grows group s % block_size (its size: growing groups do not change in a run).
        g = first % block_size
        growing = self.growing
        if num_steps <= block_size:
            needs = []
            append = needs.append
            for s in range(first, first + num_steps):
                append(len(growing[s % block_size]))
        else:                           # the groups' sizes from the first step's on, cycled
            sizes = list(map(len, growing))
            needs = (sizes[g:] + sizes[:g]) * -(-num_steps // block_size)
            del needs[num_steps:]
        if first == self._grown_step:
            needs[0] = 0                    # that step's blocks were handed out already
        if not self.kv.grow_groups(g, needs):
            raise RuntimeError(f"quiet steps from {first}: their growth groups lack KV blocks")
        s = first + num_steps - 1
        self._grown_step = s
        self.now = last_started_at
        self.planned_tokens = 0
        self.decode_step = self.step = s
        self.step_ended_at = ended_at
        return needs
