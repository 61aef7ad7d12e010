"""Speculative decoding: decoders step eagerly, each verifying up to 1 + K tokens a step.

:class:`SpeculativeScheduler` is the :class:`~simsched.engine.scheduler.core.Scheduler` the replica
builds when ``scheduler.speculative`` is on (chosen once, at construction: the plain scheduler
and its lazy decode path are untouched, and a run without speculation is bit-identical and as
fast as before). It replaces the decode layer (:mod:`simsched.engine.scheduler.decode`) by an eager one:

* **Grants, one token budget** (vLLM V1's ``schedule()``): every step, before continuing
  prefills and admitting, each decoder in admission order asks for ``1 + K`` tokens (its last
  token plus K proposals), trimmed by what is left of ``max_num_batched_tokens`` and by the
  tokens it still has to generate; when the budget runs out, later decoders get nothing this
  step (they resume in the next). Decode and spec tokens go into ``planned_tokens``, so
  prefill chunks and admissions see one budget (``_decodes_count`` is off: nothing is counted
  twice). Each grant's KV slots are allocated at once (:meth:`_grant_decodes`), preempting
  victims (victim policy) when the cache has no room, as a decode's growth does.
* **Commit**: each verification accepts ``a`` of its ``k = n - 1`` proposals
  (:class:`Acceptance`, from the run's Generator), the request progresses by ``a + 1`` tokens
  (the accepted ones and the bonus token). The rejected proposals' KV slots stay the
  request's, as in vLLM (a block table only grows: the next steps' tokens fill them, and they go
  with the request's other blocks when it stops). Decode blocks are registered in a prefix
  cache only when the request stops, up to its computed (accepted) tokens: rejected tokens'
  blocks are never cacheable. As
  in vLLM (which caches a request's full blocks when it allocates its next step), the tokens
  its last verification accepted are not cached yet when it stops (``_lag``).
* **Progress is eager**: ``num_generated`` and ``num_computed_tokens`` are exact at every
  step, so preemption (recompute or swap) in the middle of speculation needs nothing special;
  a victim granted tokens this step gives them back to the budget (:meth:`_stop`).

Decode runs stay runs of consecutive steps (a skipped step splits a run), so the request frames'
per-chunk inter-token gaps (vLLM's ITL: several tokens may arrive in one chunk) come out as they
do without speculation. :class:`SpecStats` counts drafts, accepted tokens per position and the
per-chunk gaps and sizes that per-token ITL needs (:mod:`simsched.analysis.speculative`).

A future feature that needs per-step decisions for decoders (multi-token decoding, per-request
token caps, jump decoding) subclasses this scheduler, or changes :meth:`_grant_decodes` (how
many tokens each decoder gets, and its KV) and :meth:`_advance` (what a granted step yields).
"""

from __future__ import annotations

import bisect
from array import array

import numpy as np

from simsched.config.speculative import read_acceptance_trace
from simsched.cost.speculative import SpecBatch
from simsched.engine.scheduler.core import Scheduler
from simsched.request import Request

_new_batch = object.__new__
_NONE: tuple = ()


class Acceptance:
    """Accepted proposals per verification, drawn from ``rng`` (one uniform per verification).

    With per-position acceptance ``p`` (non-increasing), ``u < p[i]`` accepts position i + 1, so
    the number accepted is how many leading ``p`` exceed ``u``: position i is accepted with
    probability ``p[i]`` exactly. ``concentration`` draws each request's own vector (Beta
    conditional rates around the configured ones, on its first verification); a trace replays
    a request's recorded counts, then falls back to the vector.
    """

    def __init__(self, spec, rng: np.random.Generator) -> None:
        self.rng = rng
        self.p = np.asarray(spec.position_acceptance(), dtype=float)
        self._neg = [-x for x in self.p.tolist()]       # ascending, for bisect
        self.concentration = spec.concentration
        self._own: dict[int, list] = {}                 # request id -> its own negated vector
        self.trace = read_acceptance_trace(spec.acceptance_trace) \
            if spec.acceptance_trace else None
        self._played: dict[int, int] = {}

    def _vector(self, rid: int) -> list:
        neg = self._own.get(rid)
        if neg is None:
            p = self.p
            cond = p / np.concatenate(([1.0], p[:-1]))
            cond[~np.isfinite(cond)] = 0.0
            kappa = self.concentration
            inner = (cond > 0) & (cond < 1)
            draw = cond.copy()
            if inner.any():
                draw[inner] = self.rng.beta(kappa * cond[inner], kappa * (1 - cond[inner]))
            neg = self._own[rid] = [-x for x in np.cumprod(draw).tolist()]
        return neg

    def forget(self, rid: int) -> None:
        """``rid`` is finished: its own vector and trace position go."""
        self._own.pop(rid, None)
        self._played.pop(rid, None)

    def sample(self, grants: list) -> list[int]:
        """Accepted proposals of each ``(request, n)`` verification (``n - 1`` proposals)."""
        u = self.rng.random(len(grants)).tolist()
        hetero = self.concentration is not None
        trace = self.trace
        out = []
        for (req, n), x in zip(grants, u):
            k = n - 1
            if k <= 0:
                out.append(0)
                continue
            if trace is not None:
                rows = trace.get(req.id)
                i = self._played.get(req.id, 0)
                if rows is not None and i < len(rows):
                    self._played[req.id] = i + 1
                    out.append(min(rows[i], k))
                    continue
            neg = self._vector(req.id) if hetero else self._neg
            a = bisect.bisect_left(neg, -x)
            out.append(a if a < k else k)
        return out


class SpecStats:
    """One replica's speculation counters (vLLM's ``spec_decode`` metrics) and chunk record.

    ``num_drafts``: verifications with at least one proposal; ``num_draft_tokens``: proposals
    verified; ``num_accepted_tokens``: accepted; ``accepted_per_pos[i]``: verifications that
    accepted position i + 1; ``accepted_hist[a]``: verifications that accepted exactly ``a``;
    ``chunk_gaps`` / ``chunk_tokens``: each decode chunk's gap since the request's previous
    token and how many tokens it brought.
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.num_steps = 0
        self.num_verifications = 0
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_skipped = 0                 # decoder-steps left out by the token budget
        self.accepted_per_pos = [0] * k
        self.accepted_hist = [0] * (k + 1)
        self.chunk_gaps = array("d")
        self.chunk_tokens = array("B")

    def as_dict(self) -> dict:
        """Plain counters (lists) and the chunk record (numpy arrays)."""
        return {"num_speculative_tokens": self.k, "num_steps": self.num_steps,
                "num_verifications": self.num_verifications, "num_drafts": self.num_drafts,
                "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "num_skipped": self.num_skipped,
                "accepted_per_pos": list(self.accepted_per_pos),
                "accepted_hist": list(self.accepted_hist),
                "chunk_gaps": np.frombuffer(self.chunk_gaps, dtype=float).copy(),
                "chunk_tokens": np.frombuffer(self.chunk_tokens, dtype=np.uint8).astype(np.int64)}


def merge_stats(replicas) -> dict | None:
    """The speculation counters of every replica that speculates, summed (None if none does);
    ``per_replica_accepted`` keeps each replica's accepted tokens (work conservation)."""
    parts = [r.scheduler.spec_stats.as_dict() for r in replicas
             if getattr(r.scheduler, "spec_stats", None) is not None]
    if not parts:
        return None
    k = max(p["num_speculative_tokens"] for p in parts)
    out: dict = {"num_speculative_tokens": k}
    for name in ("num_steps", "num_verifications", "num_drafts", "num_draft_tokens",
                 "num_accepted_tokens", "num_skipped"):
        out[name] = sum(p[name] for p in parts)
    for name, size in (("accepted_per_pos", k), ("accepted_hist", k + 1)):
        total = [0] * size
        for p in parts:
            for i, v in enumerate(p[name]):
                total[i] += v
        out[name] = total
    out["chunk_gaps"] = np.concatenate([p["chunk_gaps"] for p in parts])
    out["chunk_tokens"] = np.concatenate([p["chunk_tokens"] for p in parts])
    out["per_replica_accepted"] = {r.index: r.scheduler.spec_stats.num_accepted_tokens
                                   for r in replicas
                                   if getattr(r.scheduler, "spec_stats", None) is not None}
    return out


class SpeculativeScheduler(Scheduler):
    """The scheduler with eager, speculative decoding (see the module docstring).

    ``rng`` draws the acceptances (the run's Generator; a fixed seed's if None).
    """

    __slots__ = ()

    def __init__(self, cfg, kv, max_model_len: int | None = None,
                 rng: np.random.Generator | None = None, **kwargs) -> None:
        super().__init__(cfg, kv, max_model_len, rng, **kwargs)
        spec = cfg.speculative
        self.spec = spec
        self._k = spec.num_speculative_tokens
        # Decode and spec tokens are counted in planned_tokens: admission's budget arithmetic
        # (planned_tokens + decoders if _decodes_count) then counts every token once.
        self._decodes_count = False
        self.acceptance = Acceptance(spec, rng if rng is not None else np.random.default_rng(0))
        self.spec_stats = SpecStats(self._k)
        self._grants: dict[int, tuple] = {}     # this step: request id -> (request, tokens)
        self._chunk_at: dict[int, float] = {}   # decoder id -> when its last token came
        self._lag: dict[int, int] = {}          # decoder id -> proposals its last step accepted

    @property
    def decode_grants(self) -> dict[int, int]:
        """This step's decode grants: request id -> tokens (1 + the proposals verified)."""
        return {rid: n for rid, (_, n) in self._grants.items()}

    # ----------------------------------------------------------------- eager decode layer
    def num_generated(self, req: Request) -> int:
        """Output tokens ``req`` has emitted so far (exact: progress is eager)."""
        return req.num_generated

    def num_cached(self, req: Request) -> int:
        """Tokens of ``req`` whose KV is computed (exact)."""
        return req.num_computed_tokens

    def _start_run(self, req: Request, resumed: bool = False) -> None:
        """Make ``req`` a decoder from the next decode step on; swapped back in (``resumed``,
        during this step's planning, after the grants) it decodes one token in this step."""
        rid = req.id
        req.run_start_step = self.step + 1
        req.finish_step = -1
        self.decoding[rid] = req
        self._chunk_at[rid] = req.last_token_at
        if self.meter is not None:
            self.meter.start_decoding(req, self.step)
        if resumed:
            self._take(req, 1)         # _swap_in checked the block and the budget

    def _close_run(self, req: Request, last_step: int) -> None:
        """End ``req``'s decode run after step ``last_step`` (the latest step)."""
        if last_step >= req.run_start_step:
            req.runs += (req.last_token_at, req.run_start_step, last_step)
            req.last_token_at = self.step_ended_at
        del self.decoding[req.id]
        self._chunk_at.pop(req.id, None)
        req.run_start_step = -1
        if self.meter is not None:
            self.meter.stop_decoding(req, last_step)

    def _stop(self, victim: Request, cached: int, scheduled: bool = False) -> None:
        """Preemption: a victim granted tokens this step gives them back to the budget (its KV
        slots, proposals' included, go with its blocks); its cacheable tokens lag as vLLM's."""
        grant = self._grants.pop(victim.id, None)
        lag = self._lag.pop(victim.id, 0)
        if grant is not None:
            self.planned_tokens -= grant[1]
            lag = 0
        # vLLM caches a request's full blocks when it allocates its next step's slots, up to
        # the tokens known then: until then the tokens its last verification accepted are not
        # cached (a victim granted slots in this step had them cached first, up to every token
        # known: the bonus token too).
        super()._stop(victim, cached - lag if cached else 0, grant is not None)

    def _release(self, req: Request, in_flight: bool = False) -> None:
        """A finished request's slot and blocks go back; as vLLM caches blocks at allocation,
        the tokens its last verification accepted are not cached (released first with the
        shorter count: the plain release then finds nothing left to free)."""
        lag = self._lag.pop(req.id, 0)
        if lag and req.content is not None:
            self.kv.free(req.id, req.num_prompt_tokens + req.num_output_tokens - 1 - lag
                         - in_flight)
        super()._release(req, in_flight)

    def _take(self, req: Request, n: int) -> None:
        """Grant ``req`` ``n`` tokens this step; the caller made sure their KV blocks are free.
        Blocks are added unregistered: a prefix cache registers decode blocks when freed."""
        kv = self.kv
        for _ in range(kv.blocks_for(req.num_computed_tokens + n) - kv.num_held(req.id)):
            kv.add_block(req.id)
        self._grants[req.id] = (req, n)
        self.planned_tokens += n

    def _grant_decodes(self) -> None:
        """Each decoder, in admission order (vLLM's running list), gets 1 + K tokens, trimmed
        by the budget left and by its remaining output; with no budget left the rest wait. KV
        for them, or preempt."""
        budget = self.cfg.max_num_batched_tokens
        k1 = 1 + self._k
        kv, decoding = self.kv, self.decoding
        for req in [r for r in self.running.values() if r.id in decoding]:
            if req.id not in decoding:
                continue                        # preempted for an earlier decoder's blocks
            left = budget - self.planned_tokens
            if left <= 0:
                return
            n = req.num_output_tokens - req.num_generated
            if n > k1:
                n = k1
            if n > left:
                n = left
            need = kv.blocks_for(req.num_computed_tokens + n) - kv.num_held(req.id)
            if need > kv.num_free and not self._make_room(req, need):
                continue                        # req itself was the victim
            self._take(req, n)

    # ----------------------------------------------------------------- one iteration
    def _update_special(self) -> None:
        super()._update_special()
        self._special = True        # every step starts in _prepare, which grants the decodes

    def _prepare(self, now: float) -> None:
        """The plain step's start, then this step's decode grants (before prefill chunks and
        admissions, which the plain ``schedule`` plans next under the same budget)."""
        super()._prepare(now)
        self._grants = {}
        if self.decoding:
            self._grant_decodes()

    def schedule(self, now: float) -> SpecBatch:
        """Decide the next iteration's batch: decode grants, prefill chunks, admissions (the
        plain scheduler's step, whose decodes are this one's grants)."""
        plain = Scheduler.schedule(self, now)      # no lazy decoder: its batch has prefills only
        batch = _new_batch(SpecBatch)
        grants = self._grants
        n_dec = len(grants)
        tokens = ctx = 0
        if n_dec:
            self.decode_step = self.step + 1
            for req, n in grants.values():
                tokens += n
                ctx += req.num_computed_tokens
        batch.num_decode_seqs = n_dec
        batch.decode_context_sum = ctx
        batch.num_spec_tokens = tokens - n_dec
        batch.prefill_new_tokens = plain.prefill_new_tokens
        batch.prefill_cached_tokens = plain.prefill_cached_tokens
        batch.swap_out_bytes = plain.swap_out_bytes
        batch.swap_in_bytes = plain.swap_in_bytes
        return batch

    def commit(self, now: float):
        """Apply the iteration that ended at ``now``: verifications, then prefill chunks."""
        finished = _NONE
        s = self.decode_step
        if s:
            prev_end = self.step_ended_at
            self.step = s
            self.step_ended_at = now
            finished = self._advance(s, now, prev_end)
        firsts, more = super().commit(now)    # prefill chunks (no lazy decoder is ever due)
        if more:
            if finished is _NONE:
                return firsts, more
            finished.extend(more)
        return firsts, finished

    def _advance(self, s: int, now: float, prev_end: float):
        """Step ``s``'s verifications: accepted + 1 tokens each (the rejected slots' blocks are
        kept, as vLLM keeps them)."""
        granted = self._grants
        grants = list(granted.values())
        self._grants = {}
        stats = self.spec_stats
        stats.num_steps += 1
        stats.num_verifications += len(grants)
        if len(grants) < len(self.decoding):
            self._split_skipped(s, prev_end, granted)
        accepted = self.acceptance.sample(grants)
        chunk_at, meter = self._chunk_at, self.meter
        per_pos, hist = stats.accepted_per_pos, stats.accepted_hist
        gaps, sizes = stats.chunk_gaps, stats.chunk_tokens
        finished = _NONE
        for (req, n), a in zip(grants, accepted):
            rid = req.id
            k = n - 1
            if k:
                stats.num_drafts += 1
                stats.num_draft_tokens += k
                stats.num_accepted_tokens += a
                hist[a] += 1
                for i in range(a):
                    per_pos[i] += 1
            req.num_generated += a + 1
            req.num_computed_tokens += a + 1
            self._lag[rid] = a
            if a and meter is not None:
                for _ in range(a):      # the meter counts one token per decode step: the rest
                    meter.first_token(req)
            gaps.append(now - chunk_at[rid])
            sizes.append(a + 1)
            chunk_at[rid] = now
            if req.num_generated >= req.num_output_tokens:
                if finished is _NONE:
                    finished = []
                self._close_run(req, s)
                self._finish(req, now, finished)
                self.acceptance.forget(rid)
        return finished

    def _split_skipped(self, s: int, prev_end: float, granted: dict) -> None:
        """Decoders the budget left out of step ``s``: their runs (consecutive steps) end at
        step ``s - 1`` and resume at ``s + 1``."""
        for req in self.decoding.values():
            if req.id in granted:
                continue
            self.spec_stats.num_skipped += 1
            r = req.run_start_step
            if r <= s - 1:
                req.runs += (req.last_token_at, r, s - 1)
                req.last_token_at = prev_end
            req.run_start_step = s + 1
