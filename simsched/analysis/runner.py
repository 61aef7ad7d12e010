"""Run one simulation: ``simulate(config, requests=None, cost_model=None) -> Results``.

Lives below the executors so sweeps can run it; :mod:`simsched.api` re-exports it."""

from __future__ import annotations

import ctypes
import math
import sys
import warnings
from typing import Any, Iterable

import numpy as np
import pandas as pd

from simsched.config import SimConfig
from simsched.cost import hardware
from simsched.cluster.cluster import Cluster, replica_specs
from simsched.cluster.lazy import LazyRequests
from simsched.cluster.sessions import UNIQUE, SYSTEM_PROMPT, build_sessions, is_closed_loop
from simsched.analysis.frames import build_requests_frame
from simsched.analysis.metrics import Results, build_replicas_frame, rejection_note
from simsched.engine.log import concat_frames, decode_step_ends
from simsched.engine.steps import StepRecorder, steps_frame
from simsched.request import Content, Request
from simsched.workloads.hash_ids import merged_hash_segments, parse_hash_ids
from simsched.workloads.tables import (INT64_MAX, PREFIX_COLUMNS, numbers as _numbers,
                                       prefix_columns, session_columns)
from simsched.workloads.traces import apply_long_prompt_policy, check_hash_ids
from simsched.workloads.workload import generate


class RejectionWarning(UserWarning):
    """Some requests of a run were rejected (they can never fit the model's context or cache)."""

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


def _priorities(df: pd.DataFrame) -> np.ndarray:
    """The priority column as int64 (missing: 0), each value checked as an integer in int64."""
    if "priority" not in df.columns:
        return np.zeros(len(df), dtype=np.int64)
    prio = df["priority"]
    prio_frame = pd.DataFrame({"priority": prio.where(prio.notna(), 0)
                               if prio.dtype == object else prio.fillna(0)})
    return _numbers(prio_frame, "priority", True, -INT64_MAX - 1)


def _validated(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its length, time, priority and tenant columns checked as
    :func:`make_requests` checks them (a closed-loop session table)."""
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
    ``session_id``) give each request a :class:`~simsched.request.Content`.
    Validation is vectorised; the first bad row is named in the error. Token counts and
    priorities must be integers within int64 (booleans are refused), arrival times finite
    numbers >= 0, tenants hashable labels.
    """
    arrival, prompt, output, priority, tenant, contents = _columns(table, hash_block_size)
    arrival, prompt, output, priority = (arrival.tolist(), prompt.tolist(), output.tolist(),
                                         priority.tolist())
    if tenant is None:
        tenant = [None] * len(arrival)
    if contents is None:
        return [Request(n, a, p, o, pr, t)
                for n, (a, p, o, pr, t) in enumerate(zip(arrival, prompt, output, priority,
                                                         tenant))]
    return [Request(n, a, p, o, pr, t, c) for n, (a, p, o, pr, t, c)
            in enumerate(zip(arrival, prompt, output, priority, tenant, contents))]


def _columns(table: Any, hash_block_size: int | None, lazy: bool = False) -> tuple:
    """The validated columns of a request table in arrival order: arrays of arrival, prompt,
    output and priority, the tenants (a list, or None when there is no tenant column) and the
    contents (a list, or None without prefix columns).

    With ``lazy`` the contents are not built: None if there are no prefix columns, else False.
    """
    df = _as_frame(table)
    if hash_block_size is None:
        hash_block_size = int(df.attrs.get("hash_block_size", 512))
    arrival = _numbers(df, "arrival_at", False, 0)
    prompt = _numbers(df, "num_prompt_tokens", True, 1)
    output = _numbers(df, "num_output_tokens", True, 1)
    priority = _priorities(df)
    tenant = _tenants(df) if "tenant" in df.columns else None
    order = np.argsort(arrival, kind="stable")
    arrival, prompt, output, priority = arrival[order], prompt[order], output[order], \
        priority[order]
    if tenant is not None:
        tenant = [tenant[i] for i in order.tolist()]
    if lazy and any(c in df.columns for c in PREFIX_COLUMNS):
        return arrival, prompt, output, priority, tenant, False
    contents = _contents(df, order, prompt.tolist(), hash_block_size)
    return arrival, prompt, output, priority, tenant, contents


_MALLOC_TUNED = False


def return_freed_buffers() -> None:
    """Have glibc give freed multi-megabyte buffers back to the OS at once (once per process).

    glibc raises its mmap threshold each time a large buffer is freed (up to 32 MiB); buffers
    below it then come from the heap and, once freed, mostly stay in the process. A big run
    frees many such buffers (the workload table, per-run temporaries) before building its
    frames, which then peak about 90 MiB higher at a million requests. A fixed threshold (glibc's
    initial 128 KiB) keeps large buffers mapped, and freeing one unmaps it. Elsewhere a no-op.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(ctypes.c_int(-3), ctypes.c_int(128 * 1024))   # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass                                                          # not glibc


def workload_requests(config: SimConfig) -> pd.DataFrame:
    """The request table of ``config``'s workload, drawn from its seed.

    With ``long_prompt_policy`` ``clip`` or ``drop`` the workload is also fitted to the model's
    context: a request whose prompt plus output exceeds the context length (``max_model_len``)
    is clipped or dropped, as an over-long prompt is. With ``error`` such requests are left to
    the engine, which rejects them with a reason.
    """
    table = generate(config.workload, np.random.default_rng(config.seed))
    policy = config.workload.long_prompt_policy
    if policy != "error" and len(table):
        load_report = table.attrs.get("load_report")
        table, _ = apply_long_prompt_policy(table, None, policy,
                                            f"workload {config.workload.name!r}",
                                            max_total_tokens=hardware.max_model_len(
                                                config.hardware))
        if load_report is not None:
            table.attrs["load_report"] = load_report
    return table


def simulate(config: SimConfig | None = None, requests: Iterable | pd.DataFrame | None = None,
             cost_model=None, record_steps: bool = False) -> Results:
    """Run one simulation and return its :class:`~simsched.analysis.metrics.Results`.

    ``requests`` overrides the configured workload (a table or tuples, see
    :func:`make_requests`); ``cost_model`` overrides the one named by ``config.hardware``.
    ``record_steps`` also records every scheduling step (``Results.steps``: one row per request
    per step, see :mod:`simsched.engine.steps`); off, it costs nothing.
    The same config and seed give identical frames.
    """
    return run(config, requests, cost_model, record_steps=record_steps)[0]


def run(config: SimConfig | None = None, requests: Iterable | pd.DataFrame | None = None,
        cost_model=None, keep_engine: bool = False,
        from_workload: bool | None = None,
        record_steps: bool = False) -> tuple[Results, Cluster | None]:
    """:func:`simulate`, also returning the finished engine when ``keep_engine`` (for checks).

    ``from_workload`` says ``requests`` is the config's own workload table (drawn ahead by the
    caller), so a rejection warning may suggest the workload's ``long_prompt_policy``.
    """
    config = config or SimConfig()
    return_freed_buffers()
    if not isinstance(config, SimConfig):
        raise ValueError(f"config must be a SimConfig, got {type(config).__name__}")
    from_workload = requests is None if from_workload is None else from_workload
    table = workload_requests(config) if from_workload else requests
    sessions = None
    frame = _as_frame(table)
    # Prefix-cache columns in the frames only where they can say something (memory of big runs).
    prefix = config.cache.enable_prefix_caching or any(
        c in frame.columns for c in ("hash_ids", "prefix_group", "session_id"))
    block = int(frame.attrs.get("hash_block_size", config.workload.hash_block_size))
    if is_closed_loop(frame):
        # Closed-loop sessions: turns are created as they arrive (appended to reqs).
        sessions, reqs = build_sessions(_validated(frame), block), []
    elif config.check_invariants or keep_engine:
        reqs = make_requests(frame, block)     # the checks read every request object
    else:
        columns = _columns(frame, block, lazy=True)
        if columns[-1] is None:
            # Plain requests: created at arrival and recorded into arrays when done, so a big
            # run holds only the requests in flight.
            reqs = LazyRequests(*columns[:-1])
        else:
            reqs = make_requests(frame, block)
        del columns
    del table, frame  # the Request objects now hold everything; keep a big run's peak memory down
    if cost_model is not None and not callable(getattr(cost_model, "iteration_time", None)):
        raise ValueError("cost_model must have an iteration_time(batch) method")
    specs = replica_specs(config, cost_model)
    engine = Cluster(config, reqs, specs=specs, sessions=sessions)
    # Installed before the run starts (the GPU loops look the scheduler's methods up once).
    recorders = [StepRecorder(r.scheduler, r.index) for r in engine.replicas] \
        if record_steps else None
    engine.run()
    steps = None
    if recorders is not None:
        steps = steps_frame([row for rec in recorders for row in rec.rows])
        del recorders
    replicas = engine.replicas
    info = {"num_blocks": sum(s.num_blocks for s in specs),
            "replica_num_blocks": [s.num_blocks for s in specs],
            "num_events": engine.num_events, "num_shed": engine.num_shed,
            "num_waiting_at_end": sum(r.scheduler.num_waiting for r in replicas),
            "num_running_at_end": sum(len(r.scheduler.running) for r in replicas),
            "kv_blocks_used_at_end": sum(r.kv.num_used for r in replicas)}
    described = [{"model": s.config.hardware.model, "gpu": s.config.hardware.gpu,
                  "tensor_parallel_size": s.config.hardware.tensor_parallel_size,
                  "num_blocks": s.num_blocks} for s in specs]
    iterations = concat_frames([r.iteration_rows for r in replicas])
    for r in replicas:
        r.iteration_rows = None
    step_ends = decode_step_ends(iterations, len(replicas))
    sim_time = engine.env.now
    disagg = engine.disagg.columns() if engine.disagg is not None else None
    info["num_gpus"] = sum(s.config.hardware.tensor_parallel_size for s in specs)
    if engine.replica_of is None:
        owner = np.zeros(len(reqs), dtype=np.int64)
    else:
        owner = np.frombuffer(engine.replica_of, dtype=np.int32).astype(np.int64)
    if len(step_ends) == 1:
        step_end, step_offset = step_ends[0], None
    else:
        # Each request's decode steps index its own replica's array: shift them into one.
        starts = np.cumsum([0] + [len(s) for s in step_ends[:-1]])
        step_end, step_offset = np.concatenate(step_ends), starts[np.maximum(owner, 0)]
    del step_ends, replicas
    # Without end-of-run checks nothing needs the request objects once read: let them go while
    # the request frame is built, so a big run's peak memory is the simulation's, not twice it.
    release = not (config.check_invariants or keep_engine)
    if release:
        del engine
    req_df, itl, causes = build_requests_frame(reqs, step_end, release=release,
                                               step_offset=step_offset, prefix=prefix,
                                               replica=owner)
    if disagg is not None:
        ids = req_df["request_id"].to_numpy()
        for k, (name, values) in enumerate(disagg.items()):
            req_df.insert(2 + k, name, np.asarray(values)[ids])
    results = Results(req_df, iterations, itl, causes, config=config, sim_time=sim_time,
                      info=info, replicas=build_replicas_frame(req_df, iterations, described),
                      steps=steps)
    note = rejection_note(req_df, hint=from_workload)
    if note:
        warnings.warn(note, RejectionWarning, stacklevel=3)
    return results, (None if release else engine)
