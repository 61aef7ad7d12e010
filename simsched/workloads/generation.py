"""The draws behind :func:`simsched.workloads.workload.generate`: synthetic arrival times,
length pairs, tenant and priority mixes, and the turns of closed-loop sessions.

Each function reads what it needs from ``cfg``, a
:class:`~simsched.workloads.workload.WorkloadConfig` (not imported: that module builds on this
one), and draws from the run's ``numpy.random.Generator``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simsched.workloads import arrivals
from simsched.workloads import lengths
from simsched.workloads import rate_schedule
from simsched.workloads import sessions
from simsched.workloads import traces
from simsched.workloads.traces import LoadReport


def synthetic_arrivals(cfg, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of ``cfg``'s synthetic arrival process."""
    kind, n, d, rate = (cfg.arrival_process, cfg.resolved_num_requests, cfg.duration,
                        cfg.resolved_rate)
    if kind == "poisson":
        return arrivals.poisson(rng, rate, n, d)
    if kind == "gamma":
        return arrivals.gamma(rng, rate, cfg.cv, n, d)
    if kind == "deterministic":
        return arrivals.deterministic(rate, n, d)
    if kind == "onoff":
        return arrivals.onoff(rng, rate, cfg.on_seconds, cfg.off_seconds, n, d)
    if kind in ("windows", "servegen"):
        return rate_schedule.windowed(rng, cfg.window_table(), rate, d, n)
    return arrivals.piecewise(rng, cfg.rate_schedule, n, d, rate)


def draw_lengths(cfg, rng: np.random.Generator, n: int):
    """``n`` (prompt, output) length pairs from ``cfg``'s length distribution, as two arrays."""
    kind = cfg.length_distribution
    if kind == "lognormal":
        return lengths.lognormal(rng, n)
    if kind == "fixed":
        return lengths.fixed(n, cfg.prompt_len, cfg.output_len)
    if kind == "uniform":
        return lengths.uniform(rng, n, cfg.prompt_range, cfg.output_range)
    pairs, _ = traces.read_trace(cfg.lengths_source(), require_times=False)
    return lengths.empirical(rng, n, pairs["num_prompt_tokens"].to_numpy(),
                             pairs["num_output_tokens"].to_numpy())


def _mix(rng: np.random.Generator, n: int, count: int, weights) -> np.ndarray:
    p = None if weights is None else np.asarray(weights) / sum(weights)
    return rng.choice(count, size=n, p=p)


def draw_classes(cfg, rng: np.random.Generator, n: int, priority: np.ndarray,
             tenant: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``n`` priorities and tenants: drawn from the config's mixes where it has several, else the
    given ones (a trace's own columns, or none)."""
    if cfg.num_priorities > 1:
        priority = _mix(rng, n, cfg.num_priorities, cfg.priority_weights).astype(np.int64)
    if cfg.num_tenants > 1:
        tenant = np.array([f"t{i}" for i in range(cfg.num_tenants)], dtype=object)[
            _mix(rng, n, cfg.num_tenants, cfg.tenant_weights)]
    return priority, tenant


def session_turns(cfg, rng: np.random.Generator) -> pd.DataFrame:
    """The turns of closed-loop sessions (``name='sessions'``), one row each."""
    starts = synthetic_arrivals(cfg, rng)
    n = len(starts)
    turns = sessions.draw(cfg.num_turns, rng, n, integer=True)
    total = int(turns.sum())
    user, output = draw_lengths(cfg, rng, total)
    think = sessions.draw(cfg.think_time, rng, total, integer=False)
    groups = rng.integers(0, cfg.num_prefix_groups, n, dtype=np.int64) \
        if cfg.system_prompt_len else None
    frame = sessions.session_table(starts, turns, user, output, think, cfg.system_prompt_len,
                                   groups)
    priority, tenant = draw_classes(cfg, rng, n, np.zeros(n, dtype=np.int64),
                                np.full(n, None, dtype=object))
    frame.insert(3, "priority", np.repeat(priority, turns))
    frame.insert(4, "tenant", pd.Series(np.repeat(tenant, turns), dtype=object))
    frame.attrs["load_report"] = LoadReport(source=f"workload {cfg.name!r}", format="sessions",
                                            num_rows=total, num_in_window=total,
                                            num_returned=total)
    frame.attrs["hash_block_size"] = cfg.hash_block_size
    return frame
