"""Request tables given to a run: checked and turned into requests in arrival order.

:func:`make_requests` (re-exported by :mod:`simsched.api`) takes a DataFrame or tuples or dicts;
every value is validated (the first bad row is named in the error) as the trace loader validates
a file, and a table out of arrival order is sorted with the loader's warning.
"""

from __future__ import annotations

import math
import operator
import sys
import warnings
from itertools import repeat
from typing import Any

import numpy as np
import pandas as pd

from simsched.cluster.sessions import UNIQUE, SYSTEM_PROMPT
from simsched.request import Content, Request
from simsched.workloads.hash_ids import merged_hash_segments, parse_hash_ids
from simsched.workloads.tables import (INT64_MAX, PREFIX_COLUMNS, adapter_column,
                                       numbers as _numbers, prefix_columns, session_columns)
from simsched.workloads.trace_files import TraceWarning
from simsched.workloads.traces import check_hash_ids

_FIELDS = ("arrival_at", "num_prompt_tokens", "num_output_tokens", "priority", "tenant")


def as_frame(table: Any) -> pd.DataFrame:
    """A request table as a DataFrame with at least the three required columns."""
    if isinstance(table, pd.DataFrame):
        df = table
    else:
        items = list(table)
        if items and all(isinstance(item, dict) for item in items):
            df = pd.DataFrame(items)
        else:
            rows = []
            for i, item in enumerate(items):
                if isinstance(item, dict) or not hasattr(item, "__len__") \
                        or not 3 <= len(item) <= 5:
                    raise ValueError(f"requests[{i}]: expected (arrival_at, prompt, output"
                                     f"[, priority[, tenant]]), got {item!r}")
                rows.append(tuple(item))
            width = max((len(r) for r in rows), default=3)
            df = pd.DataFrame(rows, columns=list(_FIELDS[:width]))
    missing = [c for c in _FIELDS[:3] if c not in df.columns]
    if missing:
        raise ValueError(f"requests table lacks column(s) {missing}")
    return df


def _tenants(df: pd.DataFrame) -> list:
    """The tenant column as hashable labels or None (NaN means none)."""
    if "tenant" not in df.columns:
        return [None] * len(df)
    tenant = [None if t is None or (isinstance(t, float) and math.isnan(t)) else t
              for t in df["tenant"].tolist()]
    for i, t in enumerate(tenant):
        if t is not None and not isinstance(t, str):
            try:
                hash(t)
            except TypeError:
                raise ValueError(f"requests[{i}].tenant must be a hashable label (a string or "
                                 f"an integer), got {t!r}") from None
    return tenant


def _no_tenants(df: pd.DataFrame) -> bool:
    """Whether the table has no tenant column or no request in it has a tenant (all None)."""
    if "tenant" not in df.columns:
        return True
    values = df["tenant"].to_numpy()
    if values.dtype != object:
        return False
    # A slice at a time: a drawn fleet's day has tens of millions of None tenants.
    return not any(any(map(operator.is_not, values[lo:lo + 65536].tolist(), repeat(None)))
                   for lo in range(0, len(values), 65536))


def _priorities(df: pd.DataFrame, copy: bool = True) -> np.ndarray:
    """The priority column as int64 (missing: 0), each value checked as an integer in int64."""
    if "priority" not in df.columns:
        return np.zeros(len(df), dtype=np.int64)
    prio = df["priority"]
    if isinstance(prio.dtype, np.dtype) and prio.dtype.kind in "iu":
        return _numbers(df, "priority", True, -INT64_MAX - 1, copy=copy)    # no NaN to fill
    prio_frame = pd.DataFrame({"priority": prio.where(prio.notna(), 0)
                               if prio.dtype == object else prio.fillna(0)})
    return _numbers(prio_frame, "priority", True, -INT64_MAX - 1)


def validated_sessions(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its length, time, priority and tenant columns checked as
    :func:`make_requests` checks them (a closed-loop session table)."""
    if "adapter" in df.columns:
        raise ValueError("requests table: an adapter column is not supported in a closed-loop "
                         "session table (one with think_time)")
    out = df.copy()
    out["arrival_at"] = _numbers(df, "arrival_at", False, 0)
    out["num_prompt_tokens"] = _numbers(df, "num_prompt_tokens", True, 1).astype(np.int64)
    out["num_output_tokens"] = _numbers(df, "num_output_tokens", True, 1).astype(np.int64)
    if "priority" in df.columns:
        out["priority"] = _priorities(df)
    if "tenant" in df.columns:
        out["tenant"] = pd.Series(_tenants(df), index=df.index, dtype=object)
    for column, values in session_columns(df).items():
        out[column] = values
    return out


def _contents(df: pd.DataFrame, order: np.ndarray, prompt: list,
              hash_block_size: int) -> list | None:
    """Each request's :class:`~simsched.request.Content` (None without prefix columns).

    ``hash_ids`` give trace blocks; ``prefix_group``/``prefix_len`` a shared system prompt
    followed by the request's own tokens; ``session_id`` alone only labels the request.
    """
    columns = [c for c in PREFIX_COLUMNS if c in df.columns]
    if not columns:
        return None

    checked = prefix_columns(df)

    def values(name, default):
        if name in checked:
            return checked[name][order].tolist()
        if name not in df.columns:
            return [default] * len(order)
        col = df[name].to_numpy(dtype=object)[order]
        return [default if v is None or (isinstance(v, float) and v != v) else v
                for v in col.tolist()]

    hashes, groups = values("hash_ids", None), values("prefix_group", -1)
    shared, sessions = values("prefix_len", 0), values("session_id", -1)
    if "hash_ids" in df.columns:
        parsed = [None if h is None else parse_hash_ids(h) for h in hashes]
        bad = [i for i, (h, ids) in enumerate(zip(hashes, parsed)) if h is not None and ids is None]
        if bad:
            raise ValueError(f"requests[{int(order[bad[0]])}].hash_ids must be a non-empty list "
                             f"of integers >= 0, got {hashes[bad[0]]!r}")
        given = np.array([ids is not None for ids in parsed], dtype=bool)
        check = pd.DataFrame({"hash_ids": pd.Series(parsed, dtype=object)[given].to_numpy(),
                              "num_prompt_tokens": np.asarray(prompt)[given]})
        check_hash_ids(check, hash_block_size, "requests (in arrival order)")
        hashes = merged_hash_segments(parsed, prompt, hash_block_size)
    out = []
    for rid, (p, segs, g, s, sess) in enumerate(zip(prompt, hashes, groups, shared, sessions)):
        sess = int(sess)
        if segs is not None:
            out.append(Content.from_segments(segs, (UNIQUE, -1, rid), sess))
        elif int(g) >= 0 and int(s) > 0:
            s = min(int(s), p)
            segments = [((SYSTEM_PROMPT, int(g)), s), ((UNIQUE, rid), p - s)]
            out.append(Content.from_segments(segments, (UNIQUE, -1, rid), sess))
        elif sess >= 0:
            out.append(Content(session_id=sess))
        else:
            out.append(None)
    return out


def make_requests(table: Any, hash_block_size: int | None = None) -> list[Request]:
    """Turn a request table into ``Request`` objects sorted by arrival, ids 0..n-1 in that order.

    ``table`` may be a DataFrame with columns ``arrival_at, num_prompt_tokens,
    num_output_tokens`` (optional ``priority``, ``tenant``), or an iterable of tuples
    ``(arrival_at, prompt, output[, priority[, tenant]])`` or of dicts with those keys.
    Optional prefix-identity columns (``hash_ids`` in blocks of ``hash_block_size`` tokens,
    default ``table.attrs["hash_block_size"]`` or 512; ``prefix_group`` and ``prefix_len``;
    ``session_id``) give each request a :class:`~simsched.request.Content`; an ``adapter``
    column its LoRA adapter (``Request.adapter``: an integer >= 0, -1 or missing: none).
    Validation is vectorised; the first bad row is named in the error. Token counts and
    priorities must be integers within int64 (booleans and strings are refused), arrival times
    finite numbers >= 0, tenants hashable labels. A table out of arrival order is sorted with a
    :class:`~simsched.workloads.trace_files.TraceWarning`, as the trace loader sorts a file.
    """
    df = as_frame(table)
    arrival, prompt, output, priority, tenant, contents = request_columns(df, hash_block_size)
    arrival, prompt, output, priority = (arrival.tolist(), prompt.tolist(), output.tolist(),
                                         priority.tolist())
    if tenant is None:
        tenant = [None] * len(arrival)
    if contents is None:
        reqs = [Request(n, a, p, o, pr, t)
                for n, (a, p, o, pr, t) in enumerate(zip(arrival, prompt, output, priority,
                                                         tenant))]
    else:
        reqs = [Request(n, a, p, o, pr, t, c) for n, (a, p, o, pr, t, c)
                in enumerate(zip(arrival, prompt, output, priority, tenant, contents))]
    if "adapter" in df.columns:
        # LoRA adapter ids, in the arrival order the requests were built in.
        order = np.argsort(_numbers(df, "arrival_at", False, 0), kind="stable")
        for req, adapter in zip(reqs, adapter_column(df)[order].tolist()):
            req.adapter = adapter
    return reqs


def request_columns(table: Any, hash_block_size: int | None, lazy: bool = False,
                    copy: bool = True) -> tuple:
    """The validated columns of a request table in arrival order: arrays of arrival, prompt,
    output and priority, the tenants (a list, or None when no request has one) and the
    contents (a list, or None without prefix columns).

    With ``lazy`` the contents are not built: None if there are no prefix columns, else False
    (also for an ``adapter`` column: requests with adapters are built by :func:`make_requests`).
    With ``copy`` False the arrays may be the table's own columns (views, not to be written to
    or kept past the table's life, which a streamed run does not: see
    :class:`~simsched.analysis.stream.StreamingRequests`).
    """
    df = as_frame(table)
    if hash_block_size is None:
        hash_block_size = int(df.attrs.get("hash_block_size", 512))
    arrival = _numbers(df, "arrival_at", False, 0, copy=copy)
    prompt = _numbers(df, "num_prompt_tokens", True, 1, copy=copy)
    output = _numbers(df, "num_output_tokens", True, 1, copy=copy)
    priority = _priorities(df, copy)
    tenant = None if _no_tenants(df) else _tenants(df)
    num_unsorted = int(np.count_nonzero(arrival[1:] < arrival[:-1]))
    if num_unsorted:
        # As the trace loader warns about a file out of time order.
        warnings.warn(f"requests: {num_unsorted} arrival times out of order; sorted by arrival",
                      TraceWarning, stacklevel=_outside_stacklevel())
    if num_unsorted:
        order = np.argsort(arrival, kind="stable")
        arrival, prompt, output, priority = arrival[order], prompt[order], output[order], \
            priority[order]
        if tenant is not None:
            tenant = [tenant[i] for i in order.tolist()]
    if lazy and any(c in df.columns for c in PREFIX_COLUMNS + ("adapter",)):
        return arrival, prompt, output, priority, tenant, False
    if not any(c in df.columns for c in PREFIX_COLUMNS):
        # No contents: nothing to list (a fleet's day would list tens of millions of prompts).
        return arrival, prompt, output, priority, tenant, None
    if not num_unsorted:
        # Already in order (a drawn workload): the stable sort is the identity, and a big table
        # is not copied again.
        order = np.arange(len(arrival))
    contents = _contents(df, order, prompt.tolist(), hash_block_size)
    return arrival, prompt, output, priority, tenant, contents


def _outside_stacklevel() -> int:
    """The ``stacklevel`` that points a warning raised by the caller at the first frame outside
    simsched (the user's call, however deep the call came in)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("simsched."):
        frame, level = frame.f_back, level + 1
    return level
