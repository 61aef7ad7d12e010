"""Figures from sweep and run frames, saved as PNG (matplotlib, Agg backend).

* :func:`latency_vs_load`: TTFT p50/p99 and TPOT p99 against the arrival rate, one line per
  policy, each line's saturation point (first rate not labelled ``stable``) marked;
* :func:`ttft_cdf`: the TTFT distribution per policy at one rate;
* :func:`run_timeline`: KV cache use and queue length over time for one run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plots need matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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


def latency_vs_load(runs: pd.DataFrame, path, x: str = "rate",
                    by: Sequence[str] = ("policy",), dpi: int = 90) -> Path:
    """TTFT p50, TTFT p99 and TPOT p99 against ``x``, one line per ``by`` group; saved to ``path``.

    Runs with equal ``x`` and group (several seeds) are averaged. A hollow marker on each line
    marks its saturation point (see :func:`saturation_rate`).
    """
    plt = _pyplot()
    labels = _labels(runs, by)
    metrics = (("ttft_p50", "TTFT p50 (s)"), ("ttft_p99", "TTFT p99 (s)"),
               ("tpot_p99", "TPOT p99 (s)"))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for label, group in runs.groupby(labels, sort=False):
        mean = group.groupby(x)[[m for m, _ in metrics]].mean().sort_index()
        sat = saturation_rate(group, x)
        for ax, (metric, title) in zip(axes, metrics):
            line, = ax.plot(mean.index, mean[metric], marker=".", label=label)
            if sat == sat and sat in mean.index:
                ax.plot([sat], [mean.loc[sat, metric]], marker="o", markersize=10,
                        markerfacecolor="none", color=line.get_color())
    for ax, (_, title) in zip(axes, metrics):
        ax.set_xlabel(f"{x} (req/s)" if x.endswith("rate") else x)
        ax.set_title(title)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, title="o = saturation", title_fontsize=8)
    fig.tight_layout()
    return _save(fig, path, dpi)


def ttft_cdf(requests: pd.DataFrame, runs: pd.DataFrame, path, by: Sequence[str] = ("policy",),
             where: dict | None = None, dpi: int = 90) -> Path:
    """Empirical CDF of TTFT per ``by`` group (over the runs matching ``where``); saved."""
    plt = _pyplot()
    chosen = runs
    for key, value in (where or {}).items():
        chosen = chosen[chosen[key] == value]
    labels = _labels(chosen, by)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for label, ids in chosen.groupby(labels, sort=False)["run_id"]:
        ttft = np.sort(requests.loc[requests["run_id"].isin(ids), "ttft"].dropna().to_numpy())
        if len(ttft):
            ax.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("share of requests")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path, dpi)


def run_timeline(iterations: pd.DataFrame, num_blocks: int, path, title: str = "",
                 dpi: int = 90) -> Path:
    """KV cache use (share of blocks) and waiting/running counts over time for one run."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 4.5), sharex=True)
    t = iterations["started_at"].to_numpy()
    top.plot(t, iterations["kv_blocks_used"].to_numpy() / num_blocks, lw=0.8)
    top.set_ylabel("KV blocks used")
    top.set_ylim(0, 1.05)
    bottom.plot(t, iterations["num_waiting"].to_numpy(), lw=0.8, label="waiting")
    bottom.plot(t, iterations["num_seqs"].to_numpy(), lw=0.8, label="in batch")
    bottom.set_ylabel("requests")
    bottom.set_xlabel("time (s)")
    bottom.legend(fontsize=8)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    if title:
        top.set_title(title)
    fig.tight_layout()
    return _save(fig, path, dpi)


def _save(fig, path, dpi: int) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
