"""A degraded KV-transfer link in a disaggregated pool (part of ``experiments.incidents``).

Eight Llama-3-8B replicas on A100-80GBs split 4P4D (least-tokens routing in each pool, ``ib200``
links: 25 GB/s per GPU), Poisson arrivals at ``LINK_LOAD`` of the pool's capacity with the
study's uniform lengths. Prefill replica 0's outgoing link degrades for ``LINK_DOWN_TIME``
seconds from ``LINK_AT``: it drops to 2 % of its bandwidth (``link at 2 %``), or goes down and
its transfers are retried when it is back (``link down, retry``) or recomputed on their decode
replicas (``link down, recompute``); ``no incident`` is the same pool without it. TTFT and ITL
p99 over time show where each costs: the second token's gap holds a slowed or retried transfer,
and KV waiting to leave prefill replica 0 holds its memory (backpressure on its admissions).

    python -m experiments.incidents [--quick]     # runs these with the failure scenarios
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

import simsched
from simsched import SimConfig
from simsched.analysis.plots import _figure
from simsched.config.faults import FaultsConfig

NUM_PREFILL, NUM_DECODE = 4, 4
LINK_LOAD = 0.7
LINK_AT, LINK_DOWN_TIME = 20.0, 20.0
LINK_FRACTION = 0.02
NUM_LINK_BINS = 24


def pool(base: SimConfig, quick: bool) -> tuple[SimConfig, dict]:
    """The 4P4D pool at ``LINK_LOAD`` of its capacity (what it serves offered far above it),
    and the incident's times (``--quick``: a shorter run)."""
    cfg = base.replace(model="llama-3-8b", gpu="a100-80gb", num_replicas=NUM_PREFILL + NUM_DECODE,
                       num_prefill_replicas=NUM_PREFILL, num_decode_replicas=NUM_DECODE,
                       router="least_tokens", decode_router="least_tokens", link="ib200",
                       disagg_min_prompt_tokens=0)
    probe = simsched.simulate(cfg.replace(rate=200.0, num_requests=1500 if quick else 4000,
                                          seed=2))
    cap = probe.summary()["request_throughput"]
    duration = 60.0 if quick else 120.0
    rate = LINK_LOAD * cap
    return cfg.replace(rate=rate, num_requests=int(rate * duration), seed=1), {
        "capacity": cap, "rate": rate, "duration": duration, "at": LINK_AT,
        "until": LINK_AT + LINK_DOWN_TIME}


def link_scenarios() -> dict[str, FaultsConfig | None]:
    """Name -> faults of each link scenario (None: no incident)."""
    event = (LINK_AT, LINK_DOWN_TIME, 0)
    return {"no incident": None,
            f"link at {LINK_FRACTION:.0%}": FaultsConfig(link_events=(event + (LINK_FRACTION,),)),
            "link down, retry": FaultsConfig(link_events=(event + (0.0,),), on_link_down="retry"),
            "link down, recompute": FaultsConfig(link_events=(event + (0.0,),),
                                                 on_link_down="recompute"),
            # The same outage as a failure of the replica itself (restart + model load).
            "prefill replica 0 fails": FaultsConfig(
                replica_failures=((LINK_AT, 0),), restart_time=LINK_DOWN_TIME / 2,
                model_load_time=LINK_DOWN_TIME / 2)}


def run_link(name: str, cfg: SimConfig, faults, times: dict):
    """One scenario: its summary row and its timeline (p99 TTFT and ITL by arrival bin)."""
    res = simsched.simulate(cfg if faults is None else cfg.replace(faults=faults))
    df, s = res.requests, res.summary()
    info = res.info
    row = {"scenario": name, "num_requests": len(df), "ttft_p99": s["ttft_p99"],
           "itl_p99": s["itl_p99"], "tpot_p99": s["tpot_p99"],
           "kv_transfer_time_max": float(df["kv_transfer_time"].max()),
           "num_transfer_failures": info.get("num_kv_transfer_failures", 0),
           "num_recomputed": info.get("num_kv_transfer_recomputes", 0),
           "num_failed": int((df["status"] == "failed").sum()),
           "ttft_p99_on_0": _p99(df.loc[df["prefill_replica"] == 0, "ttft"].to_numpy())}
    span = times["duration"]
    edges = np.linspace(0.0, span, NUM_LINK_BINS + 1)
    arrival = df["arrival_at"].to_numpy()
    bins = np.clip(np.digitize(arrival, edges) - 1, 0, NUM_LINK_BINS - 1)
    ttft, tpot = df["ttft"].to_numpy(), df["tpot"].to_numpy()
    # Each request's longest inter-token gap (the second token's holds the hand-off: the KV
    # wait and transfer, or a recomputation), and its p99 per bin.
    gap = df["itl_max"].to_numpy()
    rows = []
    for b in range(NUM_LINK_BINS):
        mask = bins == b
        rows.append({"scenario": name, "at": edges[b], "num_requests": int(mask.sum()),
                     "ttft_p99": _p99(ttft[mask]), "itl_max_p99": _p99(gap[mask]),
                     "tpot_p99": _p99(tpot[mask])})
    return row, pd.DataFrame(rows)


def _p99(values: np.ndarray) -> float:
    values = values[np.isfinite(values)]
    return float(np.percentile(values, 99)) if len(values) else math.nan


def run_links(base: SimConfig, quick: bool, say=print):
    """Every link scenario: ``(runs, timeline, times)``."""
    cfg, times = pool(base, quick)
    rows, frames = [], []
    for name, faults in link_scenarios().items():
        if say is not None:
            say(f"running {name} ...")
        row, timeline = run_link(name, cfg, faults, times)
        rows.append(row)
        frames.append(timeline)
    runs = pd.DataFrame(rows)
    runs.attrs.update({f"link_{k}": v for k, v in times.items()})
    return runs, pd.concat(frames, ignore_index=True), times


def plot_links(timeline: pd.DataFrame, times: dict):
    """p99 TTFT, longest inter-token gap and TPOT over time (by arrival), per scenario."""
    fig, axes = _figure(None, 3, (10, 8), nrows=3, ncols=1, sharex=True)
    for name in timeline["scenario"].unique():
        t = timeline[timeline["scenario"] == name]
        for ax, col in zip(axes, ("ttft_p99", "itl_max_p99", "tpot_p99")):
            ax.plot(t["at"], t[col], label=name, drawstyle="steps-post")
    for ax in axes:
        ax.axvspan(times["at"], times["until"], color="0.9", zorder=0)
        ax.set_yscale("log")
    axes[0].set_ylabel("TTFT p99 (s)")
    axes[1].set_ylabel("longest ITL p99 (s)")
    axes[2].set_ylabel("TPOT p99 (s)")
    axes[2].set_xlabel("arrival, simulated s (shaded: prefill replica 0's link degraded)")
    axes[0].set_title("a degraded KV-transfer link in a 4P4D pool")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig
