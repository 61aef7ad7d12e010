"""Judging a run: goodput and SLO attainment, and whether the engine kept up with its load.

Goodput follows ``vllm bench serve --goodput``: a request is *good* if it finished and meets every
SLO that is given (TTFT, TPOT, E2EL, each in seconds); rejected and unfinished requests are never
good. Goodput is good requests per second over the same span as request throughput (last finish
minus first arrival); SLO attainment is good requests over all requests.

The saturation label (:func:`saturation_label`) sorts a run into ``stable``, ``backlogged`` or
``overloaded`` from signals any run records (see :func:`saturation_signals`), or ``failed`` when
no request finished and none was left in flight (e.g. every request was rejected).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

SATURATION_LABELS = ("stable", "backlogged", "overloaded", "failed")
# Queue growth (waiting requests added per second, as a share of the offered arrival rate) above
# which a run counts as overloaded / backlogged; see saturation_label.
OVERLOAD_GROWTH = 0.10
BACKLOG_GROWTH = 0.02
# Achieved/offered throughput below which a run that drained counts as backlogged.
BACKLOG_THROUGHPUT_RATIO = 0.80
# Mean queue time over mean service time above which a run counts as backlogged: a continuously
# batching engine admits at once while it has room, so a stable run queues almost not at all.
BACKLOG_QUEUE_RATIO = 0.10


@dataclass(frozen=True)
class SLO:
    """Per-request latency objectives in seconds (each optional), as ``vllm bench serve --goodput``.

    A request meets the SLO if it finished and every given bound holds: ``ttft`` on time to first
    token, ``tpot`` on time per output token, ``e2el`` on end-to-end latency. A finished request
    with a single output token has no TPOT and meets any TPOT bound (vLLM counts its TPOT as 0).
    """

    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft", "tpot", "e2el"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(f"slo.{name} must be a finite number of seconds > 0 or None, "
                                 f"got {value!r}")
        if self.ttft is None and self.tpot is None and self.e2el is None:
            raise ValueError("an SLO needs at least one of ttft, tpot, e2el")

    def good_mask(self, requests: pd.DataFrame) -> np.ndarray:
        """Boolean array: which rows of a requests frame are good requests."""
        good = (requests["status"] == "finished").to_numpy(copy=True)
        if self.ttft is not None:
            good = good & (requests["ttft"] <= self.ttft).to_numpy()
        if self.tpot is not None:
            tpot = requests["tpot"].fillna(0.0).to_numpy()
            good = good & (tpot <= self.tpot)
        if self.e2el is not None:
            good = good & (requests["e2el"] <= self.e2el).to_numpy()
        return good


def throughput_span(requests: pd.DataFrame) -> float:
    """Seconds from the first arrival to the last finish (NaN if nothing finished)."""
    done = requests[requests["status"] == "finished"]
    if not len(done):
        return math.nan
    return float(done["finished_at"].max() - requests["arrival_at"].min())


def goodput(requests: pd.DataFrame, slo: SLO) -> dict[str, float]:
    """``num_good``, ``goodput`` (good requests/s) and ``slo_attainment`` (share, 0-1)."""
    num_good = int(slo.good_mask(requests).sum())
    span = throughput_span(requests)
    return {"num_good": num_good,
            "goodput": num_good / span if span > 0 else math.nan,
            "slo_attainment": num_good / len(requests) if len(requests) else math.nan}


def offered_rate(requests: pd.DataFrame) -> float:
    """Rate of accepted (not rejected) arrivals over the arrival window, per second."""
    times = requests["arrival_at"].to_numpy(dtype=float)
    if len(times) < 2 or times.max() <= times.min():
        return math.nan
    accepted = int((requests["status"] != "rejected").sum())
    return max(accepted - 1, 0) / float(times.max() - times.min())


def queue_growth(requests: pd.DataFrame, iterations: pd.DataFrame) -> float:
    """How fast requests piled up in the engine, as a share of the offered rate.

    The slope of a least-squares line (each iteration weighted by its duration) through the
    number of requests in the engine (``num_waiting + num_seqs`` of the iterations frame) against
    time, over the second half of the arrival window (the first half lets a stable queue reach its
    steady level), divided by :func:`offered_rate`. About 0 when the engine keeps up; about
    ``1 - service rate / arrival rate`` when it does not (0.3: 30 % of arrivals accumulate).
    """
    return _growth_fit(requests, iterations)[0]


def _growth_fit(requests: pd.DataFrame, iterations: pd.DataFrame) -> tuple[float, bool]:
    """Queue growth and whether it is significant.

    Significant means the pile-up over the fitted half-window exceeds three times the Poisson-like
    noise of the count (3 * sqrt(mean count + 1)), so short runs do not read noise as growth.
    """
    rate = offered_rate(requests)
    if not len(iterations) or not rate > 0:
        return 0.0, False
    first, last = requests["arrival_at"].min(), requests["arrival_at"].max()
    start = (first + last) / 2
    window = iterations[(iterations["started_at"] >= start) & (iterations["started_at"] <= last)]
    # A cluster's count is the sum of its replicas': fit each replica, add slopes and levels.
    groups = ([g for _, g in window.groupby("replica")] if "replica" in window
              and window["replica"].nunique() > 1 else [window])
    slope = level = 0.0
    for part in groups:
        if len(part) < 3:
            continue
        t = part["started_at"].to_numpy(dtype=float)
        q = (part["num_waiting"] + part["num_seqs"]).to_numpy(dtype=float)
        w = part["duration"].to_numpy(dtype=float)
        tm, qm = np.average(t, weights=w), np.average(q, weights=w)
        var = np.average((t - tm) ** 2, weights=w)
        if var > 0:
            slope += np.average((t - tm) * (q - qm), weights=w) / var
            level += qm
    if not slope and not level:
        return 0.0, False
    pileup = slope * (last - start)
    return float(slope / rate), bool(pileup > 3 * math.sqrt(level + 1))


def saturation_signals(requests: pd.DataFrame, iterations: pd.DataFrame) -> dict[str, float]:
    """The measurable signals the saturation label is computed from.

    * ``offered_rate``: accepted arrivals per second over the arrival window;
    * ``achieved_rate``: finished requests per second over the throughput span minus the median
      E2EL (the last arrivals' own service time, which a stable engine needs too);
    * ``throughput_ratio``: achieved / offered (about 1 when the engine keeps up);
    * ``completion``: finished / accepted (an aborted request is accepted and not finished);
      ``num_finished``; ``num_unfinished``: accepted but neither finished nor aborted when the
      run ended (accepted: arrived before the run ended and not rejected);
    * ``queue_growth``: see :func:`queue_growth`; ``growth_significant``: whether the pile-up
      over the fitted half-window exceeds three times the count's noise, 3 * sqrt(mean + 1);
    * ``queue_ratio``: mean queue time over mean service time (E2EL minus queue time) of the
      finished requests.
    """
    status = requests["status"]
    finished = status == "finished"
    num_finished = int(finished.sum())
    # A request due after the run ended (max_sim_time) never arrived: not accepted, not unfinished.
    accepted = len(requests) - int((status == "rejected").sum()) \
        - int((status == "pending").sum())
    span = throughput_span(requests)
    if num_finished:
        span -= float(requests.loc[finished, "e2el"].median())
    offered = offered_rate(requests)
    achieved = num_finished / span if span > 0 else math.nan
    growth, significant = _growth_fit(requests, iterations)
    done = requests[finished]
    service = (done["e2el"] - done["queue_time"]).mean() if num_finished else math.nan
    queue_ratio = float(done["queue_time"].mean() / service) if service > 0 else math.nan
    return {"offered_rate": offered,
            "achieved_rate": achieved,
            "throughput_ratio": achieved / offered if offered > 0 else math.nan,
            "completion": num_finished / accepted if accepted else math.nan,
            "num_finished": num_finished,
            # Aborted (an autoscaled fleet's removed replica): ended, not left unfinished.
            "num_unfinished": accepted - num_finished - int((status == "aborted").sum()),
            "queue_growth": growth,
            "growth_significant": significant,
            "queue_ratio": queue_ratio}


def label_from_signals(signals: Mapping[str, Any]) -> str:
    """``stable``, ``backlogged``, ``overloaded`` or ``failed`` from :func:`saturation_signals`.

    * ``overloaded``: the run ended (``max_sim_time``) with accepted requests unfinished, or the
      number of requests in the engine grew by more than 10 % of the offered rate over the second
      half of the arrival window, significantly (the engine serves less than ~90 % of what
      arrives; its queue would grow without bound).
    * ``backlogged``: not overloaded, but the count grew significantly by more than 2 % of the
      offered rate, or the achieved throughput fell below 80 % of the offered rate, or requests
      spent on average more than 10 % of their service time queued (a queue built up and was
      worked off; near saturation).
    * ``failed``: not overloaded and no request finished (every request was rejected, or there
      were none): there is nothing to call stable.
    * ``stable``: otherwise (the engine kept up; the queue stayed flat).

    Short runs (tens of requests) are noisy; label runs of a few hundred requests or more.
    """
    growth = signals["queue_growth"] if signals.get("growth_significant", True) else 0.0
    if signals["num_unfinished"] > 0 or growth > OVERLOAD_GROWTH:
        return "overloaded"
    if not signals.get("num_finished", 1):
        return "failed"
    ratio = signals["throughput_ratio"]
    if growth > BACKLOG_GROWTH or (ratio == ratio and ratio < BACKLOG_THROUGHPUT_RATIO) \
            or signals.get("queue_ratio", 0.0) > BACKLOG_QUEUE_RATIO:
        return "backlogged"
    return "stable"


def saturation_label(results) -> str:
    """The saturation label of a :class:`~simsched.analysis.metrics.Results`.

    The rule is :func:`label_from_signals` applied to :func:`saturation_signals`.
    """
    return label_from_signals(saturation_signals(results.requests, results.iterations))


def summarize(results, slos: "SLO | Mapping[str, SLO] | None" = None) -> dict[str, Any]:
    """One flat row for a run: the summary, saturation signals and label, goodput per SLO.

    Keys follow the summary's scheme (``ttft_p50``, ...; see ``Results.summary``). With one ``SLO`` the goodput columns are
    ``num_good``, ``goodput``, ``slo_attainment``; with a mapping ``{name: SLO}`` each is suffixed
    ``_{name}``.
    """
    row = results.summary()
    row["num_waiting_at_end"] = results.info.get("num_waiting_at_end", 0)
    signals = saturation_signals(results.requests, results.iterations)
    row.update({k: v for k, v in signals.items() if k not in ("num_unfinished", "num_finished")})
    row["saturation"] = label_from_signals(signals)
    row["sim_time"] = results.sim_time
    for suffix, slo in _named_slos(slos):
        for key, value in goodput(results.requests, slo).items():
            row[key + suffix] = value
        gpus = results.info.get("num_gpus")
        if gpus:
            row["goodput_per_gpu" + suffix] = row["goodput" + suffix] / gpus
    return row


def _named_slos(slos) -> list[tuple[str, SLO]]:
    if slos is None:
        return []
    if isinstance(slos, SLO):
        return [("", slos)]
    if isinstance(slos, Mapping):
        for name, slo in slos.items():
            if not isinstance(slo, SLO):
                raise ValueError(f"slos[{name!r}] must be an SLO, got {slo!r}")
        return [(f"_{name}", slo) for name, slo in slos.items()]
    raise ValueError(f"slos must be an SLO or a mapping of name to SLO, got {slos!r}")
