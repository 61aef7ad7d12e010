"""The replicas frame (one row per replica: what it served, how busy, queued and full it was)
and the cluster figures of a run's summary (:func:`cluster_summary`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simsched.request import Status


def cluster_summary(replicas: pd.DataFrame | None, info: dict) -> dict:
    """``num_replicas``, ``num_shed`` and the load imbalance over replicas; ``num_aborted``
    and ``num_migrations`` where removed replicas abort or migrate their requests (autoscaling).

    A replica's load is the tokens it computed (prefill + decode); ``load_imbalance`` is the
    largest load over the mean (1 = even) and ``load_cv`` their coefficient of variation.
    """
    if replicas is None or not len(replicas):
        return {}
    load = replicas["num_tokens"].to_numpy(dtype=float)
    mean = load.mean()
    out = {"num_replicas": len(replicas), "num_shed": int(info.get("num_shed", 0)),
           "load_imbalance": float(load.max() / mean) if mean > 0 else math.nan,
           "load_cv": float(load.std() / mean) if mean > 0 else math.nan}
    # An autoscaled run whose removed replicas abort or migrate their requests.
    out.update((key, info[key]) for key in ("num_aborted", "num_migrations") if key in info)
    return out


def build_replicas_frame(requests: pd.DataFrame, iterations: pd.DataFrame,
                         replicas: list[dict]) -> pd.DataFrame:
    """One row per replica: what it is, what it served, how busy, queued and full it was.

    ``replicas`` holds each replica's description (``model``, ``gpu``,
    ``tensor_parallel_size``, ``num_blocks``). ``num_requests`` counts the requests routed there;
    a disaggregated run also counts prefills and decodes apart (see :func:`_count_phases`).
    Throughputs and the busy fraction use the cluster's span (first arrival to last finish), as
    the summary's throughputs do.
    """
    n = len(replicas)
    owner = requests["replica"].to_numpy()
    routed = owner >= 0
    # Views, not copies, when every request was routed (a big single-replica run's memory).
    every = bool(routed.all())
    who = owner if every else owner[routed]
    # Compare the status column in place: to_numpy() of a string column makes a Python string
    # per row (about 60 bytes each).
    finished = (requests["status"] == Status.FINISHED.value).to_numpy(dtype=bool)
    rejected = (requests["status"] == Status.REJECTED.value).to_numpy(dtype=bool)
    if not every:
        finished, rejected = finished[routed], rejected[routed]
    span = _span(requests)

    def per_replica(mask=None, weights=None, rows=who):
        if n == 1 and weights is None:
            # Every row is replica 0's: count without bincount's copy of the rows.
            return np.array([len(rows) if mask is None else np.count_nonzero(mask)],
                            dtype=np.int64)
        if mask is not None:
            rows = rows[mask]
            weights = None if weights is None else weights[mask]
        return np.bincount(rows, weights=weights, minlength=n)[:n]

    def total(values, mask, rows=who):
        # Integer-valued sums per replica, exactly (the float sums they replace were exact too).
        if n == 1:
            return np.array([int(np.sum(values, where=mask)) if mask is not None
                             else int(values.sum())], dtype=np.int64)
        return per_replica(mask, values.astype(float), rows).astype(np.int64)

    out_tokens = requests["num_output_tokens"].to_numpy()
    out_tokens = out_tokens if every else out_tokens[routed]
    it_owner = iterations["replica"].to_numpy()
    duration = iterations["duration"].to_numpy()
    blocks = np.array([r["num_blocks"] for r in replicas], dtype=float)
    kv_used = iterations["kv_blocks_used"].to_numpy()
    if n == 1:
        busy = _sum_in_order(duration)
        used = _sum_in_order(duration, kv_used)
    else:
        busy = per_replica(weights=duration, rows=it_owner)
        used = per_replica(weights=kv_used * duration, rows=it_owner)
    num_tokens = total(iterations["num_prefill_tokens"].to_numpy(), None, it_owner) \
        + total(iterations["num_decode_tokens"].to_numpy(), None, it_owner)
    preemptions = requests["num_preemptions"].to_numpy()
    num_finished = per_replica(finished)
    frame = pd.DataFrame({
        "replica": np.arange(n),
        "model": [r["model"] for r in replicas], "gpu": [r["gpu"] for r in replicas],
        "tensor_parallel_size": [r["tensor_parallel_size"] for r in replicas],
        "num_blocks": blocks.astype(np.int64),
        "num_requests": per_replica().astype(np.int64),
        "num_finished": num_finished.astype(np.int64),
        "num_rejected": per_replica(rejected).astype(np.int64),
        "num_preemptions": total(preemptions if every else preemptions[routed], None),
        "num_iterations": per_replica(rows=it_owner).astype(np.int64),
        "num_tokens": num_tokens,
        "num_waiting_max": _group_max(iterations["num_waiting"].to_numpy(), it_owner, n),
        "busy_time": busy,
        "busy_fraction": busy / span if span > 0 else np.nan,
        "request_throughput": num_finished / span if span > 0 else np.nan,
        "output_throughput": (total(out_tokens, finished).astype(float) / span
                              if span > 0 else np.nan),
    })
    with np.errstate(invalid="ignore", divide="ignore"):
        frame["kv_usage_mean"] = used / busy / blocks
    if "prefill_replica" in requests.columns:
        _count_phases(frame, requests, n)
    return frame


def _count_phases(frame: pd.DataFrame, requests: pd.DataFrame, n: int) -> None:
    """A disaggregated run's request counts per replica, by phase (in place).

    ``replica`` says where a request ended, so a prefill replica would show none of the prefills
    it served. Instead ``num_prefills`` counts the requests routed to a replica for their prefill,
    ``num_decodes`` those decoded there (handed over, or served whole) and ``num_requests`` those
    it served any part of, each once; ``num_finished`` stays where requests finished.
    """
    prefill = requests["prefill_replica"].to_numpy()
    decode = requests["decode_replica"].to_numpy()

    def count(owner):
        return np.bincount(owner[owner >= 0], minlength=n)[:n].astype(np.int64)

    both = count(np.where(prefill == decode, prefill, -1))
    num_prefills, num_decodes = count(prefill), count(decode)
    at = frame.columns.get_loc("num_requests")
    frame["num_requests"] = num_prefills + num_decodes - both
    frame.insert(at + 1, "num_prefills", num_prefills)
    frame.insert(at + 2, "num_decodes", num_decodes)


def _group_max(values: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=np.int64)
    np.maximum.at(out, owner, values)
    return out
def _sum_in_order(values: np.ndarray, factor: np.ndarray | None = None) -> np.ndarray:
    """``[sum(factor * values)]`` added in order, as ``np.bincount`` adds its weights, a chunk
    at a time (no full-length temporary; a pairwise sum would differ in the last bits)."""
    acc = np.zeros(1)
    step = 1 << 16
    for lo in range(0, len(values), step):
        part = values[lo:lo + step]
        if factor is not None:
            part = factor[lo:lo + step] * part
        acc = np.cumsum(np.concatenate([acc, part]))[-1:]
    return acc


def _span(requests: pd.DataFrame) -> float:
    done = (requests["status"] == Status.FINISHED.value).to_numpy(dtype=bool)
    if not done.any():
        return math.nan
    return float(np.max(requests["finished_at"].to_numpy(), where=done, initial=-np.inf)
                 - requests["arrival_at"].min())
