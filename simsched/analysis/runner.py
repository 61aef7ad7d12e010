"""Run one simulation: ``simulate(config, requests=None, cost_model=None) -> Results``.

Lives below the executors so sweeps can run it; :mod:`simsched.api` re-exports it."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pandas as pd

from simsched.cost import factory, hardware
from simsched.config import SimConfig
from simsched.cluster.cluster import Cluster
from simsched.cluster.sessions import UNIQUE, SYSTEM_PROMPT, build_sessions, is_closed_loop
from simsched.analysis.metrics import Results, build_requests_frame
from simsched.request import Content, Request
from simsched.workloads.traces import check_hash_ids, merged_hash_segments, parse_hash_ids
from simsched.workloads.workload import generate

_FIELDS = ("arrival_at", "num_prompt_tokens", "num_output_tokens", "priority", "tenant")


def _as_frame(table: Any) -> pd.DataFrame:
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


def _numbers(df: pd.DataFrame, column: str, integer: bool, low: float) -> np.ndarray:
    """A numeric column as floats; the first bad row raises ValueError naming row and field."""
    raw = df[column]
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    bad = ~np.isfinite(values) | (values < low)
    if integer:
        bad |= values != np.round(values)
    if raw.dtype == bool:
        bad[:] = True
    if bad.any():
        i = int(np.argmax(bad))
        kind = "an integer" if integer else "a finite number"
        bound = f" >= {low:g}" if low > -2**62 else ""
        got = raw.iloc[i]
        got = got.item() if isinstance(got, np.generic) else got
        raise ValueError(f"requests[{i}].{column} must be {kind}{bound}, got {got!r}")
    return values


def _validated(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its length and time columns checked as :func:`make_requests` checks them."""
    out = df.copy()
    out["arrival_at"] = _numbers(df, "arrival_at", False, 0)
    out["num_prompt_tokens"] = _numbers(df, "num_prompt_tokens", True, 1).astype(np.int64)
    out["num_output_tokens"] = _numbers(df, "num_output_tokens", True, 1).astype(np.int64)
    return out


def _contents(df: pd.DataFrame, order: np.ndarray, prompt: list,
              hash_block_size: int) -> list | None:
    """Each request's :class:`~simsched.request.Content` (None without prefix columns).

    ``hash_ids`` give trace blocks; ``prefix_group``/``prefix_len`` a shared system prompt
    followed by the request's own tokens; ``session_id`` alone only labels the request.
    """
    columns = [c for c in ("hash_ids", "prefix_group", "session_id") if c in df.columns]
    if not columns:
        return None

    def values(name, default):
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
    ``session_id``) give each request a :class:`~simsched.request.Content`.
    Validation is vectorised; the first bad row is named in the error.
    """
    df = _as_frame(table)
    if hash_block_size is None:
        hash_block_size = int(df.attrs.get("hash_block_size", 512))
    arrival = _numbers(df, "arrival_at", False, 0)
    prompt = _numbers(df, "num_prompt_tokens", True, 1).astype(np.int64)
    output = _numbers(df, "num_output_tokens", True, 1).astype(np.int64)
    if "priority" in df.columns:
        prio_frame = pd.DataFrame({"priority": df["priority"].fillna(0)})
        priority = _numbers(prio_frame, "priority", True, -2**62).astype(np.int64)
    else:
        priority = np.zeros(len(df), dtype=np.int64)
    if "tenant" in df.columns:
        tenant = [None if t is None or (isinstance(t, float) and math.isnan(t)) else t
                  for t in df["tenant"].tolist()]
    else:
        tenant = [None] * len(df)
    order = np.argsort(arrival, kind="stable")
    arrival, prompt, output, priority = (arrival[order].tolist(), prompt[order].tolist(),
                                         output[order].tolist(), priority[order].tolist())
    tenant = [tenant[i] for i in order.tolist()]
    contents = _contents(df, order, prompt, hash_block_size)
    if contents is None:
        return [Request(n, a, p, o, pr, t)
                for n, (a, p, o, pr, t) in enumerate(zip(arrival, prompt, output, priority,
                                                         tenant))]
    return [Request(n, a, p, o, pr, t, c) for n, (a, p, o, pr, t, c)
            in enumerate(zip(arrival, prompt, output, priority, tenant, contents))]


def simulate(config: SimConfig | None = None, requests: Iterable | pd.DataFrame | None = None,
             cost_model=None) -> Results:
    """Run one simulation and return its :class:`~simsched.analysis.metrics.Results`.

    ``requests`` overrides the configured workload (a table or tuples, see
    :func:`make_requests`); ``cost_model`` overrides the one named by ``config.hardware``.
    The same config and seed give identical frames.
    """
    return run(config, requests, cost_model)[0]


def run(config: SimConfig | None = None, requests: Iterable | pd.DataFrame | None = None,
        cost_model=None, keep_engine: bool = False) -> tuple[Results, Cluster | None]:
    """:func:`simulate`, also returning the finished engine when ``keep_engine`` (for checks)."""
    config = config or SimConfig()
    if not isinstance(config, SimConfig):
        raise ValueError(f"config must be a SimConfig, got {type(config).__name__}")
    rng = np.random.default_rng(config.seed)
    table = generate(config.workload, rng) if requests is None else requests
    sessions = None
    frame = _as_frame(table)
    # Prefix-cache columns in the frames only where they can say something (memory of big runs).
    prefix = config.cache.enable_prefix_caching or any(
        c in frame.columns for c in ("hash_ids", "prefix_group", "session_id"))
    block = int(frame.attrs.get("hash_block_size", config.workload.hash_block_size))
    if is_closed_loop(frame):
        # Closed-loop sessions: turns are created as they arrive (appended to reqs).
        sessions, reqs = build_sessions(_validated(frame), block), []
    else:
        reqs = make_requests(frame, block)
    del table, frame  # the Request objects now hold everything; keep a big run's peak memory down
    if cost_model is None:
        cost_model = factory.make_cost_model(config.hardware)
    elif not callable(getattr(cost_model, "iteration_time", None)):
        raise ValueError("cost_model must have an iteration_time(batch) method")
    num_blocks = config.cache.num_blocks
    if num_blocks is None:
        num_blocks = hardware.kv_capacity_blocks(config.hardware, config.cache.block_size)
    engine = Cluster(config, reqs, cost_model, num_blocks, hardware.max_model_len(config.hardware),
                     sessions=sessions)
    engine.run()
    sched = engine.scheduler
    step_end = np.asarray(sched.step_end_at, dtype=float)
    info = {"num_blocks": num_blocks, "num_events": engine.num_events,
            "num_waiting_at_end": sched.num_waiting, "num_running_at_end": len(sched.running),
            "kv_blocks_used_at_end": engine.kv.num_used}
    replica = engine.replicas[0]
    iterations, sim_time = replica.iteration_rows.frame(), engine.env.now
    replica.iteration_rows = None
    del replica
    # Without end-of-run checks nothing needs the request objects once read: let them go while
    # the request frame is built, so a big run's peak memory is the simulation's, not twice it.
    release = not (config.check_invariants or keep_engine)
    if release:
        del engine, sched
    req_df, itl, causes = build_requests_frame(reqs, step_end, release=release, prefix=prefix)
    results = Results(req_df, iterations, itl, causes, config=config, sim_time=sim_time,
                      info=info)
    return results, (None if release else engine)
