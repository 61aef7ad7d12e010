"""The one path by which requests are recorded for the request frame.

:data:`REQUEST_FIELDS` names, once, every per-request value the request frame takes from a
:class:`~simsched.request.Request` (frame column, request attribute, kind, value for a request
never recorded); :class:`RequestRecords` copies them out of request objects into preallocated
arrays, a batch at a time, together with each request's decode runs, irregular token gaps and
preemption causes. Both ways a run keeps its requests use it:

* created at arrival and recorded when each one ends (:class:`~simsched.cluster.lazy.LazyRequests`,
  the workload's columns given up front), so a big run holds only the requests in flight;
* request objects kept to the end (invariant checks, prefix-cache contents, closed-loop sessions),
  recorded in chunks when the frame is built (:func:`record_all`).

:meth:`RequestRecords.columns` gives what :func:`simsched.analysis.frames.build_requests_frame`
reads, the same either way.
"""

from __future__ import annotations

import math
from array import array
from operator import attrgetter

import numpy as np

from simsched.request import Status

# (frame column, Request attribute, kind, value of a request never recorded). Kinds: "d" float64,
# "q" int64, "o" a Python object (text or None). Frame column order.
REQUEST_FIELDS = (
    ("request_id", "id", "q", 0),
    ("arrival_at", "arrival_at", "d", math.nan),
    ("first_scheduled_at", "first_scheduled_at", "d", math.nan),
    ("first_token_at", "first_token_at", "d", math.nan),
    ("finished_at", "finished_at", "d", math.nan),
    ("num_prompt_tokens", "num_prompt_tokens", "q", 0),
    ("num_output_tokens", "num_output_tokens", "q", 0),
    ("num_generated_tokens", "num_generated", "q", 0),
    ("priority", "priority", "q", 0),
    ("tenant", "tenant", "o", None),
    ("num_preemptions", "num_preemptions", "q", 0),
    ("num_recomputed_tokens", "num_recomputed_tokens", "q", 0),
    ("num_swaps", "num_swaps", "q", 0),
    ("swapped_bytes", "swapped_bytes", "d", 0.0),
    ("reject_reason", "reject_reason", "o", ""),
)
# Only for runs with a prefix cache or prompt identities (memory: a million-request run stays lean).
PREFIX_FIELDS = (
    ("num_cached_tokens", "num_cached_tokens", "q", 0),
    ("session_id", "session_id", "q", -1),
)
# Only for runs serving LoRA adapters (simsched.engine.lora): each request's adapter, -1 the base.
LORA_FIELDS = (("adapter", "adapter", "q", -1),)
# The columns a workload gives before the run (LazyRequests passes them as ``given``).
WORKLOAD_COLUMNS = ("request_id", "arrival_at", "num_prompt_tokens", "num_output_tokens",
                    "priority", "tenant")

_STATUS = tuple(Status)
_CODE = {status: i for i, status in enumerate(_STATUS)}
PENDING = _CODE[Status.PENDING]
_DTYPE = {"d": np.float64, "q": np.int64}
_RECORD_CHUNK = 65536       # request objects recorded at a time by record_all


class RequestRecords:
    """Recorded values of ``n`` requests, by position 0..n-1 (struct of arrays).

    ``given`` maps columns known before the run (see :data:`WORKLOAD_COLUMNS`) to their arrays
    (``tenant``: a list, or None for no tenants); the other fields are copied from the request
    objects by :meth:`record`. ``prefix`` adds :data:`PREFIX_FIELDS`, ``extra`` more fields of
    the same form (e.g. :data:`LORA_FIELDS`). A position never recorded keeps each field's default
    and status ``pending``.
    """

    def __init__(self, n: int, prefix: bool = False, given: dict | None = None,
                 extra: tuple = ()) -> None:
        self.n = n
        self.fields = (REQUEST_FIELDS + PREFIX_FIELDS if prefix else REQUEST_FIELDS) + extra
        self.given = dict(given or {})
        if "tenant" in self.given and self.given["tenant"] is None:
            self.given["tenant"] = np.full(n, None, dtype=object)
        self._arrays: dict[str, array] = {}
        self._numeric: list[tuple] = []          # (view, getter) of recorded numbers
        self._objects: list[tuple] = []          # (column, getter, default) of recorded objects
        self._values: dict[str, object] = {}
        for column, attr, kind, default in self.fields:
            if column in self.given:
                continue
            if kind == "o":
                # Sparse: only values other than the default are kept.
                self._values[column] = {}
                self._objects.append((column, attrgetter(attr), default))
                continue
            buffer = array(kind, [default]) * n
            self._arrays[column] = buffer
            self._numeric.append((np.frombuffer(buffer, dtype=_DTYPE[kind]), attrgetter(attr)))
        self.status = array("b", [PENDING]) * n
        # Each request's first decode run by position; later runs (after a preemption) in record
        # order, with their positions.
        self.num_runs = array("q", [0]) * n
        self.run_prev = array("d", [math.nan]) * n
        self.run_a, self.run_b = array("q", [0]) * n, array("q", [0]) * n
        self._extra, self._extra_owner = array("d"), array("q")
        self._gaps: list[tuple] = []              # (position, gap) in record order
        self._causes: list[tuple] = []            # (position, cause row) in record order

    def record(self, reqs: list, positions) -> None:
        """Copy the fields of ``reqs`` (request objects) into the rows at ``positions``."""
        if not reqs:
            return
        where = np.fromiter(positions, dtype=np.int64, count=len(reqs))
        at = where.tolist()
        for view, get in self._numeric:
            view[where] = list(map(get, reqs))
        for column, get, default in self._objects:
            kept = self._values[column]
            for i, value in zip(at, map(get, reqs)):
                if value != default:
                    kept[i] = value
        status = np.frombuffer(self.status, dtype=np.int8)
        status[where] = [_CODE[r.status] for r in reqs]
        num_runs, run_prev, run_a, run_b = self.num_runs, self.run_prev, self.run_a, self.run_b
        for i, req in zip(at, reqs):
            runs = req.runs
            if runs:
                k = len(runs) // 3
                num_runs[i] = k
                run_prev[i], run_a[i], run_b[i] = runs[0], runs[1], runs[2]
                if k > 1:
                    self._extra.extend(runs[3:])
                    self._extra_owner.extend([i] * (k - 1))
            if req.gaps:
                self._gaps.extend((i, g) for g in req.gaps)
            if req.causes:
                self._causes.extend((i, (c.request_id, c.at, c.reason, c.preempted_by,
                                         c.num_lost_tokens, c.mode)) for c in req.causes)

    def export(self, positions) -> dict:
        """The recorded values at ``positions`` (ascending), as plain picklable data that
        :meth:`absorb` writes into another store of the same run (a sharded run's shards record
        their requests apart: :mod:`simsched.cluster.shards`)."""
        where = np.asarray(positions, dtype=np.int64)
        keep = set(where.tolist())
        numeric = {column: np.frombuffer(buffer, dtype=_DTYPE[buffer.typecode])[where].copy()
                   for column, buffer in self._arrays.items()}
        objects = {column: {i: v for i, v in kept.items() if i in keep}
                   for column, kept in self._values.items()}
        runs = tuple(np.frombuffer(a, dtype=np.int64 if a.typecode == "q" else float)[where]
                     .copy() for a in (self.num_runs, self.run_prev, self.run_a, self.run_b))
        return {"where": where, "numeric": numeric, "objects": objects,
                "status": np.frombuffer(self.status, dtype=np.int8)[where].copy(), "runs": runs,
                "extra": (bytes(self._extra), bytes(self._extra_owner)),
                "gaps": [g for g in self._gaps if g[0] in keep],
                "causes": [c for c in self._causes if c[0] in keep]}

    def absorb(self, part: dict) -> None:
        """Write :meth:`export`'s values into the same positions here (fields this store was
        given before the run are not overwritten). Each position's later decode runs, gaps and
        causes come in their order, so :meth:`columns` builds the same frame as one store that
        recorded every request."""
        where = part["where"]
        for column, values in part["numeric"].items():
            if column in self._arrays:
                np.frombuffer(self._arrays[column], dtype=values.dtype)[where] = values
        for column, kept in part["objects"].items():
            if column in self._values:
                self._values[column].update(kept)
        np.frombuffer(self.status, dtype=np.int8)[where] = part["status"]
        for mine, values in zip((self.num_runs, self.run_prev, self.run_a, self.run_b),
                                part["runs"]):
            np.frombuffer(mine, dtype=values.dtype)[where] = values
        extra, owner = part["extra"]
        self._extra.frombytes(extra)
        self._extra_owner.frombytes(owner)
        self._gaps.extend(part["gaps"])
        self._causes.extend(part["causes"])

    def columns(self) -> dict:
        """What the request frame needs: each field's column, ``status`` (text), ``runs3``
        (``(prev_token_at, a, b, position)`` per decode run, in position order), ``gaps``
        (``(position, gap)``), ``causes`` (rows in position order) and ``n``. Empties this store:
        the columns share its arrays, and what they do not share is dropped."""
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
            # First runs, then later ones; a stable sort by position keeps each request's runs
            # in their order.
            extra = np.frombuffer(self._extra, dtype=float).reshape(-1, 3)
            first = np.flatnonzero(counts)
            owner = np.concatenate([first, np.frombuffer(self._extra_owner, dtype=np.int64)])
            order = np.argsort(owner, kind="stable")
            owner = owner[order]
            prev = np.concatenate([prev[first], extra[:, 0]])[order]
            a = np.concatenate([a[first], extra[:, 1].astype(np.int64)])[order]
            b = np.concatenate([b[first], extra[:, 2].astype(np.int64)])[order]
        out: dict = {}
        for column, _, kind, default in self.fields:
            if column in self.given:
                out[column] = self.given[column]
            elif kind == "o":
                values = [default] * n
                for i, value in self._values[column].items():
                    values[i] = value
                out[column] = values
            else:
                out[column] = np.frombuffer(self._arrays[column], dtype=_DTYPE[kind])
        names = [s.value for s in _STATUS]
        out["status"] = [names[c] for c in self.status]
        out["runs3"] = (prev, a, b, owner)
        out["gaps"] = sorted(self._gaps, key=lambda x: x[0])
        out["causes"] = [c for _, c in sorted(self._causes, key=lambda x: x[0])]
        out["n"] = n
        # What the columns do not share goes now (a big run's peak is the frame's building).
        self.num_runs = self.run_prev = self.run_a = self.run_b = None
        self._extra = self._extra_owner = self.status = None
        self._values = self._gaps = self._causes = self._arrays = self._numeric = None
        return out


def record_all(requests: list, prefix: bool = False, release: bool = False,
               extra: tuple = ()) -> dict:
    """Record a list of request objects (position = list index) and return the columns
    (``prefix``, ``extra``: as :class:`RequestRecords`).

    With ``release`` each chunk's list entries are dropped once read, so a big run never holds its
    request objects and the finished frame at the same time.
    """
    n = len(requests)
    records = RequestRecords(n, prefix, extra=extra)
    for lo in range(0, n, _RECORD_CHUNK):
        chunk = requests[lo:lo + _RECORD_CHUNK]
        records.record(chunk, range(lo, lo + len(chunk)))
        del chunk
        if release:
            requests[lo:lo + _RECORD_CHUNK] = [None] * min(_RECORD_CHUNK, n - lo)
    return records.columns()
