"""The search behind :func:`simsched.analysis.plan.plan`: the fewest replicas of one candidate
meeting the target, rate after rate, and what counts as meeting it.

A probe meets the target when its runs (one per seed) meet the :class:`SLOTarget` and rejected no
request. A request the candidate can never serve (longer than its model's context or KV cache,
as opposed to one shed by admission control) ends the candidate's search: no replica count
serves it.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import pandas as pd

from simsched.analysis.capacity import SLOTarget


class ReplicaSearch:
    """Fewest replicas meeting the target, for one candidate, over increasing rates."""

    def __init__(self, candidate, rates: Sequence[float]) -> None:
        self.candidate = candidate
        self.rates = list(rates)
        self.k = 0                                   # index of the rate being searched
        self.answers: dict[float, int | None] = {}
        self.statuses: dict[float, str] = {}
        self.last: dict[float, int] = {}             # the last replica count probed per rate
        self._start(candidate.min_replicas)

    def _start(self, low: int) -> None:
        self.ok: int | None = None                   # fewest replicas known to hold
        self.fail = low - 1                          # most replicas known to fail
        self.probe: int | None = low

    @property
    def rate(self) -> float:
        return self.rates[self.k]

    def update(self, holds: bool, rejects: bool = False) -> None:
        """Record the probe's outcome; ``rejects``: it rejected requests no replica count can
        serve (the candidate is then infeasible at this rate and above)."""
        n, top = self.probe, self.candidate.max_replicas
        self.last[self.rate] = n
        if rejects:
            self.ok = self.probe = None
        else:
            if holds:
                self.ok = n
            else:
                self.fail = n
            if self.ok is None:
                self.probe = min(2 * n, top) if n < top else None
            elif self.ok - self.fail > 1:
                self.probe = (self.ok + self.fail) // 2
            else:
                self.probe = None
        if self.probe is None:
            self.answers[self.rate] = self.ok
            status = "rejects" if rejects else ("ok" if self.ok else "infeasible")
            self.statuses[self.rate] = status
            self.k += 1
            if self.k < len(self.rates) and self.ok is not None:
                self._start(self.ok)                 # more load never needs fewer replicas
            elif self.k < len(self.rates):           # infeasible here: infeasible above too
                for rate in self.rates[self.k:]:
                    self.answers[rate] = None
                    self.statuses[rate] = status
                self.k = len(self.rates)


def probe_holds(target: SLOTarget, rows: pd.DataFrame) -> bool:
    """Whether a probe's runs (one per seed) meet the target and served every request."""
    return target.holds(rows) and not (rows["num_rejected"] > 0).any()


def warn_rejections(searches, notes, seeds) -> None:
    """One warning naming every candidate that cannot serve some requests, and why."""
    bad = []
    for s in searches:
        rate = next((r for r in s.rates if s.statuses.get(r) == "rejects"
                     and r in s.last), None)
        if rate is not None:
            key = next((k for k in ((s.candidate.label, rate, s.last[rate], seed)
                                    for seed in seeds) if k in notes), None)
            bad.append((s.candidate.label, notes.get(key, "")))
    if bad:
        labels = ", ".join(repr(label) for label, _ in bad)
        warnings.warn(f"plan: {len(bad)} candidate(s) reject requests they can never serve, so "
                      f"none of their deployments is feasible (status 'rejects'): {labels}. "
                      f"{bad[0][0]}: {bad[0][1]}. Fit such requests with the workload's "
                      "long_prompt_policy ('clip', 'drop') or plan a model with a longer "
                      "context or a larger KV cache", UserWarning, stacklevel=3)


def candidate_draws(cands, base, rate, seeds, ensemble, confidence):
    """label -> (the (seed, terms) draws, the profile) of an ensemble plan; None without one."""
    if ensemble is None:
        return None
    from simsched.analysis.ensemble import check_draws, draws_of

    check_draws(ensemble, confidence)
    if len(seeds) != 1:
        raise ValueError(f"plan: ensemble varies the seed itself (draw k runs seed + k); give "
                         f"one seed, got seeds={list(seeds)}")
    return {c.label: draws_of(c.config(base, c.min_replicas, rate, seeds[0]), ensemble,
                              f"plan candidate {c.label!r}: ensemble") for c in cands}
