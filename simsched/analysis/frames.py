"""The request frame: one row per request, built once from the run's request records.

Per-token gaps are never stored one Python object per token: a decode run of a request emits one
token per decode step, so its gaps are differences of the step end times, rebuilt here with numpy
(pooled into :class:`~simsched.analysis.itl.ItlSamples`, maxima per request).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simsched.analysis.itl import ItlSamples
from simsched.cluster.records import PREFIX_FIELDS, REQUEST_FIELDS, record_all

_CHUNK = 65536
_RUN_SLICE = 1 << 18      # decode runs whose gaps are reduced at a time
# pandas >= 3 infers a str dtype for text, stored by pyarrow when it is installed. The frames store
# theirs as Python strings whatever is installed: the same frame either way, and no pyarrow pool
# that keeps a million-row conversion's freed memory (a big run's peak).
_STR = (pd.StringDtype("python", na_value=np.nan)
        if isinstance(pd.Series(["a"]).dtype, pd.StringDtype) else None)
_TEXT_COLUMNS = ("reject_reason", "status")


def _text(values: list):
    """A text column: Python-stored ``str`` under pandas 3, the plain list (object) before."""
    return values if _STR is None else pd.array(values, dtype=_STR)


def build_requests_frame(requests, step_end_at: np.ndarray, release: bool = False,
                         step_offset: np.ndarray | None = None, prefix: bool = False,
                         replica: np.ndarray | None = None,
                         output_delay: np.ndarray | None = None, extra_fields: tuple = ()
                         ) -> tuple[pd.DataFrame, ItlSamples, pd.DataFrame]:
    """One row per request, the pooled ITL samples and one row per preemption cause.

    ``req.runs`` is a flat tuple of triples ``(prev_token_at, a, b)``: a decode run that emitted
    tokens at decode steps ``a..b``. Its first gap is ``end[a] - prev_token_at`` and the others
    are the step gaps ``end[s] - end[s-1]`` for ``s`` in ``a+1..b``. A list of request objects is
    recorded by :func:`~simsched.cluster.records.record_all` (with ``release`` its entries are
    set to None as they are read). ``prefix`` adds the prefix-cache columns ``num_cached_tokens``
    and ``session_id``, ``extra_fields`` more recorded fields (e.g.
    :data:`~simsched.cluster.records.LORA_FIELDS`). ``requests`` may also be a
    :class:`~simsched.cluster.lazy.LazyRequests` store: its recorded columns give the same frame.
    ``replica``, if given, becomes the second column (each request's replica).

    ``output_delay``, if given (seconds per request: its replica's cost model's delay from a
    step's end to the client), makes ``first_token_at`` and ``finished_at`` the times the client
    sees, and keeps the engine's as ``engine_first_token_at`` and ``engine_finished_at``; TTFT,
    E2EL and TPOT follow the client's times, per-token gaps are the same either way.

    Several replicas: ``step_end_at`` concatenates their step arrays (each starting with its NaN
    placeholder) and ``step_offset[k]`` is where request ``k``'s replica's array starts.
    """
    fields = (REQUEST_FIELDS + PREFIX_FIELDS if prefix else REQUEST_FIELDS) + extra_fields
    if hasattr(requests, "columns"):
        # Requests recorded into arrays as they finished (simsched.cluster.lazy).
        data = requests.columns(prefix, extra_fields)
    else:
        data = record_all(requests, prefix, release, extra_fields)
    n = data["n"]
    n_steps = len(step_end_at)
    step_gap = np.zeros(n_steps + 1)              # one spare slot for reduceat's end index
    if n_steps > 2:
        # np.diff's values, written in place (no step-sized temporary).
        np.subtract(step_end_at[2:], step_end_at[1:-1], out=step_gap[2:n_steps])
    if step_offset is not None:
        # Gaps across two replicas' arrays touch a NaN placeholder; no decode run spans them.
        step_gap[np.isnan(step_gap)] = 0.0
    # (prev_token_at, a, b, owner) per decode run, in request order.
    prev, a, b, owner = data.pop("runs3")
    if step_offset is not None:
        shift = step_offset[owner]
        a += shift
        b += shift
    gaps = data.pop("gaps")
    first_gaps = step_end_at[a]
    first_gaps -= prev
    del step_end_at         # the caller may have handed it over (simulate does): free it now
    itl_max = np.full(n, -np.inf)
    np.maximum.at(itl_max, owner, first_gaps)
    long = b > a
    delta = np.zeros(n_steps + 1, dtype=np.int64)
    runs = np.flatnonzero(long)
    del long
    if step_offset is not None and len(runs):
        # reduceat also reduces the stretch from one run's end to the next run's start;
        # in order of start these never overlap, but replicas' runs interleave: sort them.
        runs = runs[np.argsort(a[runs], kind="stable")]
    # A slice of runs at a time (a big run's peak memory): maxima and counts are the same
    # whatever the order they are taken in; each slice's last reduction runs to the array's end.
    for lo in range(0, len(runs), _RUN_SLICE):
        part = runs[lo:lo + _RUN_SLICE]
        starts, ends = a[part], b[part]
        starts += 1
        ends += 1
        np.add.at(delta, starts, 1)
        np.add.at(delta, ends, -1)
        bounds = np.empty(2 * len(part), dtype=np.int64)
        bounds[0::2] = starts
        bounds[1::2] = ends
        del starts, ends
        np.maximum.at(itl_max, owner[part], np.maximum.reduceat(step_gap, bounds)[0::2])
        del part, bounds
    del runs
    gap_arr = np.array(gaps, dtype=float).reshape(-1, 2)
    np.maximum.at(itl_max, gap_arr[:, 0].astype(np.int64), gap_arr[:, 1])
    itl_max[np.isinf(itl_max)] = np.nan
    counts = np.cumsum(delta, out=delta)[:n_steps]
    if n_steps and counts.max() < 2**31:
        counts = counts.astype(np.int32)    # decoders per step: half the memory, same values
    other_owner = np.concatenate([owner, gap_arr[:, 0]]).astype(np.int32)
    itl = ItlSamples(step_gap[:n_steps], counts, np.concatenate([first_gaps, gap_arr[:, 1]]),
                     other_owner)
    # Per-run temporaries go before the frame's columns come (a big run's peak memory).
    del prev, a, b, owner, first_gaps, gap_arr, gaps, delta, counts, other_owner
    cols = {}
    for name, *_ in fields:
        cols[name] = _text(data[name]) if name in _TEXT_COLUMNS else data[name]
        if name == "request_id" and replica is not None:
            cols["replica"] = replica     # placed here: an insert would copy it
    cols["status"] = _text(data["status"])
    df = pd.DataFrame(cols, copy=False)   # fresh arrays of ours: no consolidation copy
    del cols
    causes = data.pop("causes")
    data.clear()
    df.insert(df.columns.get_loc("num_preemptions"), "itl_max", itl_max)
    del itl_max
    if output_delay is not None:
        for col in ("first_token_at", "finished_at"):
            engine = df[col].to_numpy()
            df.insert(df.columns.get_loc(col) + 1, f"engine_{col}", engine)
            df[col] = engine + output_delay
    arrival = df["arrival_at"].to_numpy()
    df["ttft"] = df["first_token_at"].to_numpy() - arrival
    df["e2el"] = df["finished_at"].to_numpy() - arrival
    df["queue_time"] = df["first_scheduled_at"].to_numpy() - arrival
    # tpot = (e2el - ttft) / (output - 1) for multi-token outputs, else NaN, a chunk at a time.
    output = df["num_output_tokens"].to_numpy()
    tpot = df["e2el"].to_numpy() - df["ttft"].to_numpy()
    for lo in range(0, len(tpot), _CHUNK):
        part = output[lo:lo + _CHUNK]
        tpot[lo:lo + _CHUNK] /= np.maximum(part - 1, 1)
        tpot[lo:lo + _CHUNK][part <= 1] = np.nan
    df["tpot"] = tpot
    del tpot, output, arrival           # the frame holds its own copy
    df["itl_mean"] = df["tpot"]
    cause_df = pd.DataFrame(causes, columns=["request_id", "at", "reason", "preempted_by",
                                             "num_lost_tokens", "mode"])
    # A request id, or <NA> when no request caused the preemption (the cache ran out).
    cause_df["preempted_by"] = cause_df["preempted_by"].astype("Int64")
    return df, itl, cause_df
