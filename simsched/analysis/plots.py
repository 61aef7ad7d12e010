"""Figures from run and sweep results (matplotlib).

Every function returns a :class:`matplotlib.figure.Figure`, draws into ``ax`` when given (an Axes,
or a sequence of Axes for the multi-panel figures) and saves a PNG when ``path`` is given.
Figures are made without pyplot, so nothing needs closing and no backend is switched; in a
notebook a returned Figure displays itself.

* :func:`timeline`: one run over time: KV cache use, queue length, batch composition;
* :func:`gantt`: one run's first requests, each a bar of its phases (queued, prefill, decode)
  with its preemptions marked;
* :func:`latency_vs_load`: TTFT p50/p99 and TPOT p99 against the arrival rate, one line per
  group, each line's saturation point marked;
* :func:`ttft_cdf`: the TTFT distribution per group, one panel per value of a factor (e.g. rate).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

# Above this many iterations a timeline is averaged into this many time bins.
TIMELINE_BINS = 2000


def _figure(ax, num: int, figsize, nrows: int = 1, ncols: int | None = None, sharex=False):
    """A figure with ``num`` axes, or the figure of the given ``ax`` (one Axes or a sequence)."""
    if ax is not None:
        axes = list(ax) if isinstance(ax, (list, tuple, np.ndarray)) else [ax]
        if len(axes) < num:
            raise ValueError(f"ax must be {num} Axes for this figure, got {len(axes)}")
        return axes[0].figure, axes[:num]
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plots need matplotlib: pip install matplotlib") from None
    ncols = ncols or num
    fig = Figure(figsize=figsize)
    grid = fig.subplots(nrows, ncols, sharex=sharex, squeeze=False)
    return fig, list(grid.flat)[:num]


def _finish(fig, path, dpi: int, layout: bool = True):
    if layout:
        fig.tight_layout()
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    return fig


def _labels(frame: pd.DataFrame, by: Sequence[str]) -> pd.Series:
    by = [b for b in by if b in frame.columns]
    if not by:
        return pd.Series(["all"] * len(frame), index=frame.index)
    return frame[by].astype(str).agg("/".join, axis=1)


def saturation_rate(runs: pd.DataFrame, x: str = "rate") -> float:
    """The lowest ``x`` whose runs are mostly not ``stable`` (NaN if all are stable)."""
    share = (runs["saturation"] != "stable").groupby(runs[x]).mean()
    bad = share[share > 0.5]
    return float(bad.index.min()) if len(bad) else float("nan")


def latency_vs_load(runs: pd.DataFrame, path=None, x: str = "rate",
                    by: Sequence[str] = ("policy",), ax=None, dpi: int = 90):
    """TTFT p50, TTFT p99 and TPOT p99 against ``x``, one line per ``by`` group.

    Runs with equal ``x`` and group (several seeds) are averaged, and the band around each line
    is the Student-t 95 % interval of that mean over them (drawn where a point has two or more
    runs); the runs of an ensemble sweep (``sweep(..., ensemble=N)``: columns ``m_lo`` and
    ``m_hi``) draw their prediction intervals instead. A hollow marker on each line marks its
    saturation point (see :func:`saturation_rate`). ``ax``: three Axes.
    """
    from simsched.analysis.stats import t_quantile

    metrics = (("ttft_p50", "TTFT p50 (s)"), ("ttft_p99", "TTFT p99 (s)"),
               ("tpot_p99", "TPOT p99 (s)"))
    fig, axes = _figure(ax, 3, (12, 3.6))
    labels = _labels(runs, by)
    for label, group in runs.groupby(labels, sort=False):
        mean = group.groupby(x)[[m for m, _ in metrics]].mean().sort_index()
        sat = saturation_rate(group, x)
        spread = group.groupby(x)[[m for m, _ in metrics]].agg(["std", "count"]).sort_index()
        for axis, (metric, _) in zip(axes, metrics):
            line, = axis.plot(mean.index, mean[metric], marker=".", label=label)
            n = spread[(metric, "count")].to_numpy()
            if f"{metric}_lo" in group and f"{metric}_hi" in group:
                ends = group.groupby(x)[[f"{metric}_lo", f"{metric}_hi"]].mean().sort_index()
                axis.fill_between(mean.index, ends[f"{metric}_lo"], ends[f"{metric}_hi"],
                                  color=line.get_color(), alpha=0.2, lw=0)
            elif (n >= 2).any():
                half = np.array([t_quantile(0.975, k - 1) if k >= 2 else np.nan for k in n]) \
                    * spread[(metric, "std")].to_numpy() / np.sqrt(np.maximum(n, 1))
                axis.fill_between(mean.index, mean[metric] - half, mean[metric] + half,
                                  color=line.get_color(), alpha=0.2, lw=0)
            if sat == sat and sat in mean.index:
                axis.plot([sat], [mean.loc[sat, metric]], marker="o", markersize=10,
                          markerfacecolor="none", color=line.get_color())
    for axis, (_, title) in zip(axes, metrics):
        axis.set_xlabel(f"{x} (req/s)" if x.endswith("rate") else x)
        axis.set_title(title)
        axis.set_yscale("log")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8, title="o = saturation", title_fontsize=8)
    return _finish(fig, path, dpi, ax is None)


def ttft_cdf(requests: pd.DataFrame, runs: pd.DataFrame, path=None,
             by: Sequence[str] = ("policy",), where: dict | None = None,
             panel: str | None = None, ax=None, dpi: int = 90):
    """Empirical CDF of TTFT, one curve per ``by`` group, one panel per value of ``panel``.

    ``requests`` and ``runs`` are a sweep's frames (joined on ``run_id``); ``where`` keeps the
    runs whose columns equal the given values. Without ``panel`` all chosen runs of a group are
    pooled into one curve, so choose one load with ``where`` (or pass ``panel="rate"``: never
    pool different loads). ``ax``: one Axes per panel value. Each panel is titled with its value
    and ``where``.
    """
    chosen = runs
    for key, value in (where or {}).items():
        chosen = chosen[chosen[key] == value]
    values = sorted(chosen[panel].unique()) if panel is not None else [None]
    ncols = min(len(values), 4)
    nrows = math.ceil(len(values) / ncols)
    fig, axes = _figure(ax, len(values), (4.2 * ncols, 3.4 * nrows), nrows, ncols)
    fixed = ", ".join(f"{k} = {v}" for k, v in (where or {}).items())
    for axis, value in zip(axes, values):
        part = chosen if panel is None else chosen[chosen[panel] == value]
        labels = _labels(part, by)
        for label, ids in part.groupby(labels, sort=False)["run_id"]:
            ttft = np.sort(requests.loc[requests["run_id"].isin(ids), "ttft"].dropna()
                           .to_numpy())
            if len(ttft):
                axis.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post",
                          label=label)
        title = ", ".join(t for t in (f"{panel} = {value}" if panel else "", fixed) if t)
        axis.set_title(f"TTFT CDF{': ' + title if title else ''}", fontsize=9)
        axis.set_xscale("log")
        axis.set_xlabel("TTFT (s)")
        axis.set_ylabel("share of requests")
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    return _finish(fig, path, dpi, ax is None)


def _binned(t: np.ndarray, weight: np.ndarray, columns: dict, bins: int):
    """Time-weighted means of ``columns`` in ``bins`` equal time bins (for long runs)."""
    lo, hi = float(t.min()), float(t.max())
    idx = np.clip(((t - lo) / max(hi - lo, 1e-12) * bins).astype(np.int64), 0, bins - 1)
    total = np.bincount(idx, weights=weight, minlength=bins)
    keep = total > 0
    centers = lo + (np.arange(bins) + 0.5) * (hi - lo) / bins
    out = {name: np.bincount(idx, weights=v * weight, minlength=bins)[keep] / total[keep]
           for name, v in columns.items()}
    return centers[keep], out


def timeline(results, path=None, ax=None, title: str | None = None, dpi: int = 90,
             num_blocks: int | None = None):
    """One run over time: KV cache use, queue length and batch composition per iteration.

    Top: share of KV blocks in use. Middle: requests waiting and in the batch. Bottom: the
    batch's tokens by kind (prefill tokens, decode tokens). ``results`` is a
    :class:`~simsched.analysis.metrics.Results` (or an iterations frame, with ``num_blocks``).
    Runs of more than ``TIMELINE_BINS`` iterations are averaged over that many time bins
    (weighted by iteration time). ``ax``: three Axes.
    """
    if isinstance(results, pd.DataFrame):
        it = results
    else:
        it = results.iterations
        num_blocks = num_blocks or results.info.get("num_blocks")
    if not num_blocks:
        raise ValueError("timeline needs the number of KV blocks (num_blocks)")
    fig, (kv, queue, batch) = _figure(ax, 3, (8, 6.5), 3, 1, sharex=True)
    t = it["started_at"].to_numpy(dtype=float)
    cols = {"kv": it["kv_blocks_used"].to_numpy(dtype=float) / num_blocks,
            "waiting": it["num_waiting"].to_numpy(dtype=float),
            "running": it["num_seqs"].to_numpy(dtype=float),
            "prefill": it["num_prefill_tokens"].to_numpy(dtype=float),
            "decode": it["num_decode_tokens"].to_numpy(dtype=float)}
    note = ""
    if len(t) > TIMELINE_BINS:
        t, cols = _binned(t, it["duration"].to_numpy(dtype=float), cols, TIMELINE_BINS)
        note = f" (means over {TIMELINE_BINS} time bins)"
    if len(t):
        kv.step(t, cols["kv"], where="post", lw=0.8)
        queue.step(t, cols["waiting"], where="post", lw=0.8, label="waiting")
        queue.step(t, cols["running"], where="post", lw=0.8, label="in batch")
        batch.stackplot(t, cols["prefill"], cols["decode"], labels=["prefill", "decode"],
                        step="post", alpha=0.8)
    kv.set_ylabel("KV blocks used")
    kv.set_ylim(0, 1.05)
    queue.set_ylabel("requests")
    batch.set_ylabel("tokens / iteration")
    batch.set_xlabel("time (s)")
    for axis in (queue, batch):
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8, loc="upper right")
    for axis in (kv, queue, batch):
        axis.grid(alpha=0.3)
    kv.set_title((title or "Run timeline") + note, fontsize=10)
    return _finish(fig, path, dpi, ax is None)


PHASE_COLORS = {"queued": "0.75", "prefill": "tab:orange", "decode": "tab:blue"}


def gantt(results, max_requests: int = 50, path=None, ax=None, title: str | None = None,
          dpi: int = 90):
    """The first ``max_requests`` requests of a run (by id), one row each: when it was queued
    (arrival to first scheduled), prefilling (to its first token) and decoding (to its finish,
    or the end of the run); a red ``x`` marks each preemption and a black ``x`` a rejection.

    A preempted request waits and (with recompute) prefills again before decoding resumes;
    those times are not recorded per request, so the bar shows the preemption instant only.
    Meant for small runs; ``ax``: one Axes.
    """
    if isinstance(max_requests, bool) or not isinstance(max_requests, int) or max_requests < 1:
        raise ValueError(f"max_requests must be an integer >= 1, got {max_requests!r}")
    df = results.requests.sort_values("request_id").head(max_requests)
    end = results.sim_time if results.sim_time == results.sim_time else \
        float(df[["finished_at", "arrival_at"]].max().max())
    fig, (axis,) = _figure(ax, 1, (9, 0.9 + 0.22 * max(len(df), 1)))
    y = np.arange(len(df))
    start = df["arrival_at"].to_numpy()
    sched = df["first_scheduled_at"].to_numpy()
    first = df["first_token_at"].to_numpy()
    done = df["finished_at"].fillna(end).to_numpy()
    rejected = (df["status"] == "rejected").to_numpy()
    phases = (("queued", np.where(rejected, np.nan, start), np.where(np.isnan(sched), end, sched)),
              ("prefill", sched, np.where(np.isnan(first), end, first)),
              ("decode", first, done))
    for name, a, b in phases:
        ok = ~np.isnan(a)
        axis.barh(y[ok], (b - a)[ok], left=a[ok], height=0.7, color=PHASE_COLORS[name],
                  label=name)
    if rejected.any():
        axis.plot(start[rejected], y[rejected], "kx", label="rejected")
    pre = results.preemptions
    if len(pre):
        row_of = dict(zip(df["request_id"], y))
        pre = pre[pre["request_id"].isin(row_of)]
        if len(pre):
            axis.plot(pre["at"], pre["request_id"].map(row_of), "rx", markersize=6,
                      label="preempted")
    axis.set_yticks(y)
    axis.set_yticklabels(df["request_id"].astype(str), fontsize=6)
    axis.invert_yaxis()
    axis.set_xlabel("time (s)")
    axis.set_ylabel("request")
    axis.grid(alpha=0.3, axis="x")
    axis.legend(fontsize=7, loc="lower right")
    axis.set_title(title or f"Requests 0-{max(len(df) - 1, 0)}: phases over time", fontsize=10)
    return _finish(fig, path, dpi, ax is None)


def run_timeline(iterations: pd.DataFrame, num_blocks: int, path=None, title: str = "",
                 dpi: int = 90):
    """:func:`timeline` of an iterations frame (kept for older callers)."""
    return timeline(iterations, path=path, title=title or None, dpi=dpi, num_blocks=num_blocks)
