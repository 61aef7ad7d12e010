"""A per-step record of a replica's scheduling decisions (opt-in: ``simulate(record_steps=True)``).

One row per request per step: which requests a step scheduled, with how many prompt (prefill) and
decode tokens, the prompt tokens an admission took from the prefix cache, who was preempted and
who finished. It is what an engine's own scheduler can be compared with step by step
(``benchmarks/vllm_parity.py`` compares vLLM's), and it is public, so such checks never read
the scheduler's private state.

A :class:`StepRecorder` wraps one scheduler's ``schedule`` and ``commit`` (instance attributes
that shadow the methods), so a run without it pays nothing, not even a test per iteration. It
must be installed before the replica's GPU loop first runs (the loop looks the methods up once).
A ``schedule`` call that plans nothing (every runnable request was just preempted) is followed at
once by another: its preemptions are reported with the step that runs.
"""

from __future__ import annotations

import pandas as pd

STEP_COLUMNS = ("step", "started_at", "replica", "request_id", "num_prefill_tokens",
                "num_decode_tokens", "num_cached_tokens", "preempted", "finished")


class StepRecorder:
    """Records the steps of one replica's scheduler; :meth:`frame` gives them as a DataFrame.

    ``step`` counts the replica's iterations from 0; ``started_at`` is the iteration's start.
    ``num_cached_tokens`` is non-zero only in the step that admitted the request (also a
    re-admission after a preemption): the prompt tokens served from the prefix cache.
    """

    def __init__(self, scheduler, replica: int = 0) -> None:
        self.scheduler = scheduler
        self.replica = replica
        self._schedule = scheduler.schedule
        self._commit = scheduler.commit
        scheduler.schedule = self.schedule
        scheduler.commit = self.commit
        self.num_steps = 0
        self.rows: list[tuple] = []            # STEP_COLUMNS values, step by step
        self._admitted_before: int | None = None    # num_admitted when this step began
        self._preempted: list[int] = []
        self._planned: list[tuple] = []
        self._decoding: list[int] = []
        self._started_at = 0.0

    def schedule(self, now: float):
        """The scheduler's ``schedule``, noting what the step decided."""
        sched = self.scheduler
        if self._admitted_before is None:
            self._admitted_before = sched.num_admitted
        batch = self._schedule(now)
        if sched.preempted:
            self._preempted.extend(req.id for req, _ in sched.preempted)
        if not batch.prefill_new_tokens and not batch.num_decode_seqs:
            return batch        # nothing runs: the engine plans again; victims go with that step
        first = self._admitted_before
        # A request admitted in this step has computed only its cached tokens so far.
        self._planned = [(req.id, chunk, req.num_computed_tokens if req.admitted_seq >= first else 0)
                         for req, chunk in sched.planned.values()]
        # Speculative decoding grants a decoder 1 + K tokens, or none (simsched.engine.scheduler.speculative).
        grants = getattr(sched, "decode_grants", None)
        self._decoding = ([] if not batch.num_decode_seqs else list(grants.items())
                          if grants is not None else [(rid, 1) for rid in sched.decoding])
        self._started_at = now
        return batch

    def commit(self, now: float):
        """The scheduler's ``commit``, writing the step's rows."""
        firsts, finished = self._commit(now)
        done = {req.id for req in finished}
        step, at, replica = self.num_steps, self._started_at, self.replica
        rows: dict[int, list] = {}
        for rid, chunk, cached in self._planned:
            rows[rid] = [step, at, replica, rid, chunk, 0, cached, False, rid in done]
        for rid, n in self._decoding:
            rows[rid] = [step, at, replica, rid, 0, n, 0, False, rid in done]
        for rid in self._preempted:
            row = rows.get(rid)
            if row is None:
                rows[rid] = [step, at, replica, rid, 0, 0, 0, True, False]
            else:
                row[7] = True
        self.rows.extend(tuple(rows[rid]) for rid in sorted(rows))
        self.num_steps += 1
        self._admitted_before = None
        self._preempted = []
        self._planned = []
        self._decoding = []
        return firsts, finished

    def frame(self) -> pd.DataFrame:
        """The recorded rows (columns :data:`STEP_COLUMNS`), by step, then request id."""
        return steps_frame(self.rows)


def steps_frame(rows: list) -> pd.DataFrame:
    """Rows of :data:`STEP_COLUMNS` as a typed DataFrame."""
    df = pd.DataFrame(rows, columns=list(STEP_COLUMNS))
    types = {"step": "int64", "started_at": "float64", "replica": "int64", "request_id": "int64",
             "num_prefill_tokens": "int64", "num_decode_tokens": "int64",
             "num_cached_tokens": "int64", "preempted": "bool", "finished": "bool"}
    return df.astype(types)
