"""Requests created at arrival from workload columns and recorded into arrays when done.

A big run need not hold a million :class:`~simsched.request.Request` objects: :class:`LazyRequests`
keeps the workload as columns (struct of arrays), creates each request object when the arrival
process reaches it, and, when its process ends (finished, rejected or shed), copies what the
request frame needs into preallocated arrays and lets the object go. Only requests in flight are
objects. Recording is :mod:`simsched.cluster.records`' (the one path: a run that keeps its
request objects records them there too), so both build identical frames.

It serves plain requests (no prefix-cache :class:`~simsched.request.Content`, no closed-loop
sessions, no invariant checks, which read every request object): the runner picks it only then.
"""

from __future__ import annotations

import numpy as np

from simsched.cluster.records import PREFIX_FIELDS, WORKLOAD_COLUMNS, RequestRecords
from simsched.request import Request, awaits_release

_CHUNK = 4096                       # requests converted to Python values at a time
# Ended requests copied into the arrays at a time: few enough that they are still in the CPU
# caches when copied (a 1,024 batch made the copy 5 % of a busy replay), enough to amortise it.
_BATCH = 256


class LazyRequests:
    """The requests of a run as columns, sorted by arrival (ids 0..n-1), created as they arrive.

    Iterating creates the request objects in id order (the arrival process does this once);
    :meth:`record` stores a request whose process has ended (into a
    :class:`~simsched.cluster.records.RequestRecords`, by id). ``tenant`` is a list (or None: no
    tenants).
    """

    def __init__(self, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                 priority: np.ndarray, tenant: list | None) -> None:
        n = len(arrival)
        self.arrival = np.asarray(arrival, dtype=float)
        self.prompt = np.asarray(prompt, dtype=np.int64)
        self.output = np.asarray(output, dtype=np.int64)
        self.priority = np.asarray(priority, dtype=np.int64)
        self.tenant = tenant
        self.n = n
        self.live: dict[int, Request] = {}        # arrived, not yet recorded
        self._done: list[Request] = []            # ended, not yet copied
        self.records = RequestRecords(n, given=dict(zip(WORKLOAD_COLUMNS, (
            np.arange(n, dtype=np.int64), self.arrival, self.prompt, self.output, self.priority,
            tenant))))

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        live, tenant = self.live, self.tenant
        for lo in range(0, self.n, _CHUNK):
            hi = min(lo + _CHUNK, self.n)
            tenants = tenant[lo:hi] if tenant is not None else [None] * (hi - lo)
            for rid, a, p, o, pr, t in zip(range(lo, hi), self.arrival[lo:hi].tolist(),
                                           self.prompt[lo:hi].tolist(),
                                           self.output[lo:hi].tolist(),
                                           self.priority[lo:hi].tolist(), tenants):
                req = Request(rid, a, p, o, pr, t)
                live[rid] = req
                yield req

    def record(self, req: Request) -> None:
        """Note that ``req``'s process has ended; it is copied and forgotten with the next
        batch (copying a batch of requests field by field costs less than one at a time)."""
        done = self._done
        done.append(req)
        if len(done) >= _BATCH:
            self._flush()

    def _flush(self, final: bool = False) -> None:
        """Copy the noted requests into the records, then drop them (until ``final``, those
        that still await their release, :func:`~simsched.request.awaits_release`, wait for the
        next batch)."""
        done = self._done
        if not done:
            return
        if not final:
            held = [r for r in done if awaits_release(r)]
            if held:
                done = [r for r in done if not awaits_release(r)]
                self._done = held
        live = self.live
        ids = [r.id for r in done]
        for rid in ids:
            del live[rid]
        self.records.record(done, ids)
        if done is self._done:
            done.clear()

    def columns(self, prefix: bool = False, extra: tuple = ()) -> dict:
        """What the request frame needs (:meth:`RequestRecords.columns`); empties this store.

        Requests still in flight are recorded as they stand (call after the schedulers'
        ``close``); requests that never arrived keep status ``pending``. ``prefix`` adds the
        prefix-cache columns and ``extra`` more fields, at their defaults (these requests carry
        no prompt contents, no adapters).
        """
        self._flush(final=True)
        self._done.extend(self.live.values())
        self._flush(final=True)
        out = self.records.columns()
        self.records = None
        for column, _, kind, default in (PREFIX_FIELDS if prefix else ()) + extra:
            out[column] = np.full(self.n, default, dtype=np.int64)
        return out
