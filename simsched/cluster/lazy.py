"""Requests created at arrival from workload columns and recorded into arrays when done.

A big run need not hold a million :class:`~simsched.request.Request` objects: :class:`LazyRequests`
keeps the workload as columns (struct of arrays), creates each request object when the arrival
process reaches it, and, when its process ends (finished, rejected or shed), copies what the
request frame needs into preallocated arrays and lets the object go. Only requests in flight are
objects. :meth:`LazyRequests.columns` then gives exactly what
:func:`simsched.analysis.frames.build_requests_frame` reads from a list of request objects, so
both paths build identical frames.

It serves plain requests (no prefix-cache :class:`~simsched.request.Content`, no closed-loop
sessions, no invariant checks, which read every request object): the runner picks it only then.
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from simsched.request import Request, Status

_CHUNK = 4096                       # requests converted to Python values at a time
# Ended requests copied into the arrays at a time: few enough that they are still in the CPU
# caches when copied (a 1,024 batch made the copy 5 % of a busy replay), enough to amortise it.
_BATCH = 256
_STATUS = tuple(Status)
_CODE = {status: i for i, status in enumerate(_STATUS)}
PENDING = _CODE[Status.PENDING]


def _floats(n: int) -> array:
    return array("d", [math.nan]) * n


def _ints(n: int) -> array:
    return array("q", [0]) * n


def _statuses(codes: array) -> list:
    values = [s.value for s in _STATUS]
    return [values[c] for c in codes]      # no object array besides the list


class LazyRequests:
    """The requests of a run as columns, sorted by arrival (ids 0..n-1), created as they arrive.

    Iterating creates the request objects in id order (the arrival process does this once);
    :meth:`record` stores a request whose process has ended. ``tenant`` is a list (or None: no
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
        self.first_scheduled_at, self.first_token_at = _floats(n), _floats(n)
        self.finished_at, self.swapped_bytes = _floats(n), array("d", [0.0]) * n
        self.num_generated, self.num_preemptions = _ints(n), _ints(n)
        self.num_recomputed_tokens, self.num_swaps = _ints(n), _ints(n)
        self.status = array("b", [PENDING]) * n
        # Each request's first decode run by id; later runs (after a preemption) in record order.
        self.num_runs = _ints(n)
        self.run_prev, self.run_a, self.run_b = _floats(n), _ints(n), _ints(n)
        self._extra = array("d")                  # later runs, flat (prev_token_at, a, b)
        self._extra_owner = array("q")            # their request ids
        self.reject_reason: dict[int, str] = {}
        self._gaps: list[tuple] = []              # (id, gap) in record order
        self._causes: list[tuple] = []            # (id, cause row) in record order
        self._done: list[Request] = []            # ended, not yet copied
        self._views = {name: np.frombuffer(getattr(self, name), dtype=dtype) for name, dtype in (
            ("first_scheduled_at", float), ("first_token_at", float), ("finished_at", float),
            ("swapped_bytes", float), ("num_generated", np.int64),
            ("num_preemptions", np.int64), ("num_recomputed_tokens", np.int64),
            ("num_swaps", np.int64), ("status", np.int8))}

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

    def _flush(self) -> None:
        """Copy what the frames need from the noted requests, then drop them."""
        done = self._done
        if not done:
            return
        live = self.live
        ids = np.fromiter([r.id for r in done], dtype=np.int64, count=len(done))
        for r in done:
            del live[r.id]
        views = self._views
        views["first_scheduled_at"][ids] = [r.first_scheduled_at for r in done]
        views["first_token_at"][ids] = [r.first_token_at for r in done]
        views["finished_at"][ids] = [r.finished_at for r in done]
        views["swapped_bytes"][ids] = [r.swapped_bytes for r in done]
        views["num_generated"][ids] = [r.num_generated for r in done]
        views["num_preemptions"][ids] = [r.num_preemptions for r in done]
        views["num_recomputed_tokens"][ids] = [r.num_recomputed_tokens for r in done]
        views["num_swaps"][ids] = [r.num_swaps for r in done]
        views["status"][ids] = [_CODE[r.status] for r in done]
        for req in done:
            i = req.id
            if req.reject_reason:
                self.reject_reason[i] = req.reject_reason
            runs = req.runs
            if runs:
                k = len(runs) // 3
                self.num_runs[i] = k
                self.run_prev[i], self.run_a[i], self.run_b[i] = runs[0], runs[1], runs[2]
                if k > 1:
                    self._extra.extend(runs[3:])
                    self._extra_owner.extend([i] * (k - 1))
            if req.gaps:
                self._gaps.extend((i, g) for g in req.gaps)
            if req.causes:
                self._causes.extend((i, (c.request_id, c.at, c.reason, c.preempted_by,
                                         c.num_lost_tokens, c.mode)) for c in req.causes)
        done.clear()

    def columns(self, prefix: bool = False) -> dict:
        """What the request frame needs, as ``frames._extract`` gives it; empties this store.

        Requests still in flight are recorded as they stand (call after the schedulers'
        ``close``); requests that never arrived keep status ``pending``.
        """
        self._flush()
        self._done.extend(self.live.values())
        self._flush()
        self._views = {}
        n = self.n
        counts = np.frombuffer(self.num_runs, dtype=np.int64)
        prev = np.frombuffer(self.run_prev, dtype=float)
        a = np.frombuffer(self.run_a, dtype=np.int64)
        b = np.frombuffer(self.run_b, dtype=np.int64)
        if not self._extra:
            owner = np.flatnonzero(counts)
            if len(owner) < n:
                prev, a, b = prev[owner], a[owner], b[owner]
        else:
            # First runs, then later ones; a stable sort by request keeps each request's runs in
            # their order, as the request objects list them.
            extra = np.frombuffer(self._extra, dtype=float).reshape(-1, 3)
            first = np.flatnonzero(counts)
            owner = np.concatenate([first, np.frombuffer(self._extra_owner, dtype=np.int64)])
            order = np.argsort(owner, kind="stable")
            owner = owner[order]
            prev = np.concatenate([prev[first], extra[:, 0]])[order]
            a = np.concatenate([a[first], extra[:, 1].astype(np.int64)])[order]
            b = np.concatenate([b[first], extra[:, 2].astype(np.int64)])[order]
        self.run_prev = self.run_a = self.run_b = self._extra = self._extra_owner = None

        def f(a):
            return np.frombuffer(a, dtype=float)

        def i(a):
            return np.frombuffer(a, dtype=np.int64)

        reasons = [""] * n
        for k, reason in self.reject_reason.items():
            reasons[k] = reason
        out = {
            "request_id": np.arange(n, dtype=np.int64), "arrival_at": self.arrival,
            "first_scheduled_at": f(self.first_scheduled_at),
            "first_token_at": f(self.first_token_at), "finished_at": f(self.finished_at),
            "num_prompt_tokens": self.prompt, "num_output_tokens": self.output,
            "num_generated_tokens": i(self.num_generated), "priority": self.priority,
            "tenant": self.tenant if self.tenant is not None else np.full(n, None, dtype=object),
            "num_preemptions": i(self.num_preemptions),
            "num_recomputed_tokens": i(self.num_recomputed_tokens),
            "num_swaps": i(self.num_swaps), "swapped_bytes": f(self.swapped_bytes),
            "reject_reason": reasons,
            "status": _statuses(self.status),
            "runs3": (prev, a, b, owner),
            "gaps": sorted(self._gaps, key=lambda x: x[0]),
            "causes": [c for _, c in sorted(self._causes, key=lambda x: x[0])],
            "n": n,
        }
        if prefix:
            out["num_cached_tokens"] = np.zeros(n, dtype=np.int64)
            out["session_id"] = np.full(n, -1, dtype=np.int64)
        # What the columns do not share goes now (a big run's peak is the frame's building).
        self.num_runs = self.status = self.reject_reason = self._gaps = self._causes = None
        return out
