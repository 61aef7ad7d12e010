"""What an autoscaled run's fleet did: replicas, cost and SLO attainment over time.

:class:`FleetResults` (``Results.fleet``, None for a fixed fleet) holds the run's replica units
(one per replica lifecycle: requested, routable, drained, stopped, with its price) and the
autoscaler's timeline; :meth:`FleetResults.windows` bins a run into windows with the load, the
replicas, the cost and the SLO attainment of each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass
class FleetResults:
    """``units``: one row per replica lifecycle (:data:`simsched.cluster.fleet.UNIT_COLUMNS`
    plus ``billed_time`` and ``cost``); ``timeline``: one row per autoscaler sample
    (:data:`simsched.cluster.autoscaler.TIMELINE_COLUMNS`); ``end``: when billing was closed."""

    units: pd.DataFrame
    timeline: pd.DataFrame
    end: float

    @property
    def cost(self) -> float:
        """Money spent over the run (each unit's billed seconds times its price per hour)."""
        return float(self.units["cost"].sum())

    @property
    def replica_hours(self) -> float:
        """Billed replica-hours over the run."""
        return float(self.units["billed_time"].sum() / 3600.0)

    def replicas_at(self, times) -> pd.DataFrame:
        """Billed, routable and draining replicas at each of ``times`` (exact, from the units)."""
        u = self.units
        t = np.asarray(times, dtype=float)[:, None]
        stop = u["stopped_at"].fillna(math.inf).to_numpy()[None, :]
        ready = u["routable_at"].fillna(math.inf).to_numpy()[None, :]
        drain = u["drain_at"].fillna(math.inf).to_numpy()[None, :]
        billed = (u["requested_at"].to_numpy()[None, :] <= t) & (t < stop)
        return pd.DataFrame({"at": t[:, 0], "billed": billed.sum(1),
                             "routable": (billed & (ready <= t) & (t < drain)).sum(1),
                             "draining": (billed & (drain <= t)).sum(1)})

    def cost_between(self, start: float, end: float) -> float:
        """Money spent in ``[start, end)``."""
        u = self.units
        lo = np.maximum(u["requested_at"].to_numpy(), start)
        hi = np.minimum(u["stopped_at"].fillna(self.end).to_numpy(), min(end, self.end))
        return float((np.clip(hi - lo, 0, None) * u["price_per_hour"].to_numpy()).sum() / 3600)

    def windows(self, requests: pd.DataFrame, window: float = 600.0,
                ttft_slo: float = 2.0, tpot_slo: float = 0.1) -> pd.DataFrame:
        """Per window of ``window`` seconds (by arrival): requests, rate, SLO attainment (share
        of requests finished with TTFT <= ``ttft_slo`` and TPOT <= ``tpot_slo``; a rejected or
        unfinished request misses), mean routable replicas and cost."""
        return window_table(requests, window, ttft_slo, tpot_slo, self)


def slo_met(requests: pd.DataFrame, ttft_slo: float, tpot_slo: float) -> np.ndarray:
    """Whether each request finished within both SLOs (TPOT of one-token outputs is 0)."""
    ttft = requests["ttft"].to_numpy(float)
    tpot = np.nan_to_num(requests["tpot"].to_numpy(float), nan=0.0)
    done = requests["status"].to_numpy() == "finished"
    return done & (ttft <= ttft_slo) & (tpot <= tpot_slo)


def window_table(requests: pd.DataFrame, window: float, ttft_slo: float, tpot_slo: float,
                 fleet: FleetResults | None = None) -> pd.DataFrame:
    """:meth:`FleetResults.windows`; without ``fleet`` the replica and cost columns are left
    out (a fixed fleet's are constant)."""
    if not (window > 0 and math.isfinite(window)):
        raise ValueError(f"window must be a finite number of seconds > 0, got {window!r}")
    arrival = requests["arrival_at"].to_numpy(float)
    k = np.floor(arrival / window).astype(np.int64)
    num = int(k.max()) + 1 if len(k) else 0
    met = slo_met(requests, ttft_slo, tpot_slo)
    count = np.bincount(k, minlength=num)
    hits = np.bincount(k, weights=met, minlength=num)
    starts = np.arange(num) * window
    out = pd.DataFrame({"start": starts, "num_requests": count, "rate": count / window,
                        "attainment": np.divide(hits, count, out=np.full(num, np.nan),
                                                where=count > 0)})
    if fleet is not None:
        mids = starts + window / 2
        out["routable"] = fleet.replicas_at(mids)["routable"].to_numpy()
        out["cost"] = [fleet.cost_between(s, s + window) for s in starts]
    return out


def removal_info(fleet) -> tuple[dict, dict | None]:
    """An autoscaled run's removal figures for its info (``num_aborted``, the KV tokens aborts
    threw away (``num_aborted_kv_tokens``, and by replica), and with migration
    ``num_migrations``; nothing when removed replicas drain) and the migrations per request id
    (None unless requests migrate). ``fleet`` is the run's :class:`~simsched.cluster.fleet.Fleet`."""
    remover = fleet.remover
    if remover is None:
        return {}, None
    info = {"num_aborted": remover.num_aborted,
            # The KV aborted requests had computed, thrown away (work lost, not recomputed),
            # and by replica as [replica, tokens] pairs (the result checks balance the work).
            "num_aborted_kv_tokens": sum(remover.lost.values()),
            "aborted_kv_tokens_by_replica": sorted([g, n] for g, n in remover.lost.items())}
    if remover.mode != "migrate":
        return info, None
    info["num_migrations"] = sum(remover.moves.values())
    return info, remover.moves


def migrations_column(request_ids: np.ndarray, moves: dict) -> np.ndarray:
    """Each request's number of migrations (``moves``: request id -> count, others 0)."""
    out = np.zeros(len(request_ids), dtype=np.int64)
    if moves:
        ids = np.fromiter(moves.keys(), dtype=np.int64, count=len(moves))
        counts = np.fromiter(moves.values(), dtype=np.int64, count=len(moves))
        order = np.argsort(request_ids)
        out[order[np.searchsorted(request_ids, ids, sorter=order)]] = counts
    return out
