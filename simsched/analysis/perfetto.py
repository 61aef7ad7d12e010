"""A run as a Chrome/Perfetto trace: one process per replica with its iterations and its requests.

The trace is Chrome's JSON trace-event format (``{"traceEvents": [...]}``), which Perfetto
(ui.perfetto.dev), ``chrome://tracing`` and Speedscope open as they are. Times are microseconds
of simulated time from the run's start.

Layout:

- process 0, ``router``: an instant event per routed request (``route``, with the replica).
- process ``r + 1``, ``replica r``: thread 0, ``iterations``, one complete event per GPU
  iteration (its prefill and decode tokens, sequences, waiting requests and KV blocks as
  arguments) and counters ``kv_blocks_used``, ``num_seqs`` and ``num_waiting``; then one thread
  per request served there, holding a ``request`` span from arrival to the client's receipt of
  the last token with its phases nested inside: ``queued`` (arrival to first scheduling),
  ``prefill`` (to the engine's first token), ``decode`` (to the engine's last token) and
  ``output`` (the output path's delay to the client), plus an instant event per preemption
  and, for disaggregated runs, ``kv_transfer`` (waiting for and moving the prompt's KV). With
  ``record_steps=True`` each scheduling step of a request is a ``step`` span inside its phase.
- requests that were rejected or shed are instant events on the router's track.

Big runs are bounded: only requests arriving in ``[start_at, end_at)`` and iterations starting
there are written, at most ``max_num_requests`` and ``max_num_iterations`` of them; when a cap
binds the window is cut where it bound and a :class:`TraceWindowWarning` says so.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

MAX_NUM_REQUESTS = 20_000
MAX_NUM_ITERATIONS = 200_000
_US = 1e6


class TraceWindowWarning(UserWarning):
    """A trace was cut to fit its request or iteration cap (the message says where)."""


def _us(seconds: float) -> float:
    # Rounded to a nanosecond so that spans computed from the same times nest exactly.
    return round(float(seconds) * _US, 3)


def _meta(pid: int, tid: int | None, kind: str, name: str, sort: int | None = None) -> list:
    args = {"name": name}
    events = [{"ph": "M", "pid": pid, "name": kind, "args": args}]
    if tid is not None:
        events[0]["tid"] = tid
    if sort is not None:
        key = "thread_sort_index" if tid is not None else "process_sort_index"
        events.append({"ph": "M", "pid": pid, "name": key, "args": {"sort_index": sort},
                       **({"tid": tid} if tid is not None else {})})
    return events


def _span(name: str, pid: int, tid: int, start: float, end: float, args: dict | None = None,
          cat: str = "request") -> dict:
    ts = _us(start)
    event = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts,
             "dur": max(round(_us(end) - ts, 3), 0.0)}
    if args:
        event["args"] = args
    return event


def _instant(name: str, pid: int, tid: int, at: float, args: dict | None = None,
             cat: str = "request") -> dict:
    event = {"ph": "i", "s": "t", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": _us(at)}
    if args:
        event["args"] = args
    return event


def _window(res, start_at: float, end_at: float, max_num_requests: int,
            max_num_iterations: int) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """The requests and iterations inside the window, and the window's end after the caps."""
    reqs = res.requests
    arrival = reqs["arrival_at"].to_numpy()
    chosen = reqs[(arrival >= start_at) & (arrival < end_at)].sort_values(
        ["arrival_at", "request_id"], kind="stable")
    cut = []
    if len(chosen) > max_num_requests:
        end_at = float(chosen["arrival_at"].iloc[max_num_requests])
        cut.append(f"{len(chosen) - max_num_requests} requests past max_num_requests="
                   f"{max_num_requests}")
        chosen = chosen.iloc[:max_num_requests]
    its = res.iterations
    started = its["started_at"].to_numpy()
    inside = its[(started >= start_at) & (started < end_at)]
    if len(inside) > max_num_iterations:
        order = np.argsort(inside["started_at"].to_numpy(), kind="stable")
        end_at = float(inside["started_at"].to_numpy()[order[max_num_iterations]])
        cut.append(f"{len(inside) - max_num_iterations} iterations past max_num_iterations="
                   f"{max_num_iterations}")
        inside = inside[inside["started_at"].to_numpy() < end_at]
        chosen = chosen[chosen["arrival_at"].to_numpy() < end_at]
    if cut:
        warnings.warn(f"trace cut at {end_at:.6g} s ({'; '.join(cut)}): pass start_at/end_at "
                      "or larger caps to see another part", TraceWindowWarning, stacklevel=3)
    return chosen, inside, end_at


def _iteration_events(its: pd.DataFrame) -> list:
    out = []
    cols = {c: its[c].to_numpy() for c in ("replica", "started_at", "duration",
                                          "num_prefill_tokens", "num_decode_tokens", "num_seqs",
                                          "num_waiting", "kv_blocks_used", "num_preempted")}
    for k in range(len(its)):
        pid = int(cols["replica"][k]) + 1
        start, dur = float(cols["started_at"][k]), float(cols["duration"][k])
        prefill, decode = int(cols["num_prefill_tokens"][k]), int(cols["num_decode_tokens"][k])
        name = ("prefill+decode" if prefill and decode else "prefill" if prefill
                else "decode" if decode else "idle")
        args = {"num_prefill_tokens": prefill, "num_decode_tokens": decode,
                "num_seqs": int(cols["num_seqs"][k]), "num_waiting": int(cols["num_waiting"][k]),
                "kv_blocks_used": int(cols["kv_blocks_used"][k]),
                "num_preempted": int(cols["num_preempted"][k])}
        out.append(_span(name, pid, 0, start, start + dur, args, cat="iteration"))
        out.append({"ph": "C", "name": "replica", "pid": pid, "ts": _us(start),
                    "args": {"kv_blocks_used": args["kv_blocks_used"],
                             "num_seqs": args["num_seqs"], "num_waiting": args["num_waiting"]}})
    return out


def _phases(row, run_end: float) -> list[tuple[str, float, float]]:
    """A served request's phases in order: (name, start, end), each inside the request span."""
    arrival = row.arrival_at
    marks = [("queued", arrival, row.first_scheduled_at),
             ("prefill", row.first_scheduled_at, row.engine_first_token_at),
             ("decode", row.engine_first_token_at, row.engine_finished_at),
             ("output", row.engine_finished_at, row.finished_at)]
    out, last = [], arrival
    for name, start, end in marks:
        if not math.isfinite(start):
            break
        end = end if math.isfinite(end) else run_end
        start, end = max(start, last), max(end, last)
        if end > start:
            out.append((name, start, end))
        last = end
    return out


def _request_events(chosen: pd.DataFrame, res, run_end: float) -> list:
    out: list = []
    preempt = {}
    if len(res.preemptions):
        for rid, group in res.preemptions.groupby("request_id", sort=False):
            preempt[int(rid)] = group
    steps = {}
    if res.steps is not None and len(res.steps):
        ends = res.iterations.set_index(["replica", "started_at"])["duration"]
        s = res.steps
        key = pd.MultiIndex.from_arrays([s["replica"], s["started_at"]])
        s = s.assign(ended_at=s["started_at"].to_numpy() + ends.reindex(key).to_numpy())
        for rid, group in s.groupby("request_id", sort=False):
            steps[int(rid)] = group
    disagg = "kv_transfer_time" in chosen.columns
    for row in chosen.itertuples(index=False):
        rid = int(row.request_id)
        if row.status in ("rejected",) or int(row.replica) < 0:
            out.append(_instant(row.status, 0, 0, row.arrival_at,
                                {"request_id": rid, "reason": str(row.reject_reason)}))
            continue
        pid, tid = int(row.replica) + 1, rid + 1
        out.extend(_meta(pid, tid, "thread_name", f"request {rid}", sort=tid))
        out.append(_instant("route", 0, 0, row.arrival_at, {"request_id": rid,
                                                           "replica": int(row.replica)},
                            cat="router"))
        end = row.finished_at if math.isfinite(row.finished_at) else run_end
        out.append(_span("request", pid, tid, row.arrival_at, end,
                         {"request_id": rid, "status": row.status,
                          "num_prompt_tokens": int(row.num_prompt_tokens),
                          "num_output_tokens": int(row.num_output_tokens),
                          "num_preemptions": int(row.num_preemptions)}))
        phases = _phases(row, end)
        for name, start, stop in phases:
            out.append(_span(name, pid, tid, start, stop))
        if disagg and math.isfinite(row.engine_first_token_at) and phases:
            moved = float(row.kv_wait_time) + float(row.kv_transfer_time)
            start = row.engine_first_token_at
            decode_end = next((stop for n, _, stop in phases if n == "decode"), start)
            if moved > 0 and start + moved <= decode_end:
                out.append(_span("kv_transfer", pid, tid, start, start + moved,
                                 {"kv_transfer_bytes": float(row.kv_transfer_bytes)}))
        for p in (preempt[rid].itertuples(index=False) if rid in preempt else ()):
            out.append(_instant("preempted", pid, tid, p.at,
                                {"reason": p.reason, "mode": p.mode,
                                 "num_lost_tokens": int(p.num_lost_tokens)}))
        for s in (steps[rid].itertuples(index=False) if rid in steps else ()):
            phase = next(((a, b) for _, a, b in phases if a <= s.started_at < b), None)
            if phase is None or not math.isfinite(s.ended_at):
                continue
            out.append(_span("step", pid, tid, s.started_at, min(s.ended_at, phase[1]),
                             {"num_prefill_tokens": int(s.num_prefill_tokens),
                              "num_decode_tokens": int(s.num_decode_tokens),
                              "num_cached_tokens": int(s.num_cached_tokens)}))
    return out


def chrome_trace(res, start_at: float = 0.0, end_at: float = math.inf,
                 max_num_requests: int = MAX_NUM_REQUESTS,
                 max_num_iterations: int = MAX_NUM_ITERATIONS) -> dict:
    """The trace of ``res`` (a :class:`~simsched.analysis.metrics.Results`) as a dict in Chrome's
    JSON trace-event format; see the module docstring for its tracks and bounds."""
    for name, value in (("max_num_requests", max_num_requests),
                        ("max_num_iterations", max_num_iterations)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name, value in (("start_at", start_at), ("end_at", end_at)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    if not end_at > start_at:
        raise ValueError(f"end_at ({end_at}) must be after start_at ({start_at})")
    chosen, its, end_at = _window(res, start_at, end_at, max_num_requests, max_num_iterations)
    run_end = min(end_at, res.sim_time) if math.isfinite(res.sim_time) else end_at
    num_replicas = int(res.replicas["replica"].max()) + 1 if res.replicas is not None \
        and len(res.replicas) else int(res.requests["replica"].max()) + 1
    events = _meta(0, None, "process_name", "router", sort=0) + _meta(0, 0, "thread_name",
                                                                        "decisions")
    for r in range(num_replicas):
        events += _meta(r + 1, None, "process_name", f"replica {r}", sort=r + 1)
        events += _meta(r + 1, 0, "thread_name", "iterations", sort=0)
    events += _iteration_events(its)
    events += _request_events(chosen, res, run_end)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "simsched", "start_at": start_at,
                          "end_at": end_at if math.isfinite(end_at) else None,
                          "num_requests": len(chosen), "num_iterations": len(its)}}


def write_chrome_trace(res, path, **window) -> Path:
    """Write :func:`chrome_trace` of ``res`` as JSON to ``path`` (``.json``; Perfetto opens it);
    return the path. The path is checked before anything is computed."""
    if not isinstance(path, (str, Path)):
        raise TypeError(f"trace path must be a file path, got {type(path).__name__} {path!r}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"trace path {path} is a directory: give a file name")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise ValueError(f"trace path {path}: {parent} is a file, not a directory")
    trace = chrome_trace(res, **window)
    parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
    return path
