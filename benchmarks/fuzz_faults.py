"""The fuzz campaign's faults (``python -m benchmarks.fuzz --faults P``): client deadlines,
cancellations, retries, hedges and replica failures (times between failures and repair times
of any lifetime distribution), and, in disaggregated cases, degraded KV-transfer links, all
drawn on a case's time scale."""

from __future__ import annotations

import numpy as np

from simsched.config import SimConfig
from simsched.config.faults import FaultsConfig


def faults_variant(rng: np.random.Generator, cfg: SimConfig,
                   requests: list[tuple]) -> SimConfig:
    """The case with things going wrong: client deadlines (TTFT, total), cancellations, retries
    with backoff, jitter and a budget, hedges, and replica failures scheduled or drawn, on
    the case's time scale (an iteration: 1 s with the unit cost model, ~10 ms linear)."""
    step = 1.0 if cfg.hardware.cost_model == "unit" else 8e-3
    last = max(t for t, *_ in requests)

    def span(low: float, high: float) -> float:
        return float(step * rng.uniform(low, high))

    f: dict = {}
    if rng.random() < 0.5:
        f["ttft_timeout"] = span(0.5, 60)
    if rng.random() < 0.4:
        f["request_timeout"] = span(1, 300)
    if rng.random() < 0.3:
        f["cancel_fraction"] = float(rng.uniform(0, 0.6))
        f["cancel_time"] = ("exponential", span(1, 100)) if rng.random() < 0.5 \
            else span(0, 50)
    if rng.random() < 0.6:
        f["max_num_attempts"] = int(rng.integers(2, 5))
        f["backoff_base_time"] = span(0, 10)
        f["backoff_multiplier"] = float(rng.uniform(1, 3))
        f["backoff_max_time"] = span(0, 40)
        f["backoff_jitter"] = float(rng.uniform(0, 1))
        f["retry_on"] = tuple(o for o in ("failed", "timed_out", "shed") if rng.random() < 0.7)
        if rng.random() < 0.3:
            f["retry_budget"] = float(rng.uniform(0, 1))
        if rng.random() < 0.3:
            f["hedge_delay"] = span(0.5, 40)
    n = cfg.cluster.num_replicas
    if rng.random() < 0.5:
        k = int(rng.integers(1, 4))
        f["replica_failures"] = tuple((float(np.round(rng.uniform(0, last + 50 * step) * 1024)
                                             / 1024), int(rng.integers(n))) for _ in range(k))
    if rng.random() < 0.25:
        f["mtbf"] = _lifetime(rng, span(20, 400))
        if rng.random() < 0.3:      # per pool (a fixed cluster's one pool is "default")
            f["mtbf"] = (("default", f["mtbf"]),)
    if "replica_failures" in f or "mtbf" in f:
        f["restart_time"] = span(0, 30) if rng.random() < 0.7 else ("exponential", span(1, 30))
        f["model_load_time"] = span(0, 20)
        f["bill_while_down"] = bool(rng.random() < 0.5)
    if not f:
        f["ttft_timeout"] = span(0.5, 60)
    return cfg.replace(faults=FaultsConfig(**f))


def _lifetime(rng: np.random.Generator, mean: float):
    """A lifetime of about ``mean`` seconds: a number (exponential) or a Weibull or lognormal."""
    kind = rng.random()
    if kind < 0.4:
        return mean
    if kind < 0.7:
        shape = float(rng.uniform(0.5, 3.0))
        return ("weibull", shape, mean)
    return ("lognormal", mean, float(rng.uniform(0.1, 1.5)))


def links_variant(rng: np.random.Generator, cfg: SimConfig,
                  requests: list[tuple]) -> SimConfig:
    """A disaggregated case whose KV-transfer links slow down or go down: scheduled events on
    its prefill replicas' links (down, or a fraction of the bandwidth), drawn ones, either
    ``on_link_down`` rule; and in half the cases replica failures (scheduled, and drawn per
    role)."""
    step = 1.0 if cfg.hardware.cost_model == "unit" else 8e-3
    last = max(t for t, *_ in requests)
    prefill = [i for i, role in enumerate(cfg.cluster.replica_roles()) if role == "prefill"]
    f: dict = {"on_link_down": "retry" if rng.random() < 0.5 else "recompute"}
    events = []
    for _ in range(int(rng.integers(0, 4))):
        at = float(np.round(rng.uniform(0, last + 50 * step) * 1024) / 1024)
        duration = float(step * rng.uniform(0.1, 40))
        fraction = 0.0 if rng.random() < 0.5 else float(rng.uniform(0.01, 0.99))
        events.append((at, duration, int(rng.choice(prefill)), fraction))
    f["link_events"] = tuple(events)
    if not events or rng.random() < 0.3:
        f["link_mtbf"] = _lifetime(rng, float(step * rng.uniform(5, 200)))
        f["link_mttr"] = _lifetime(rng, float(step * rng.uniform(0.1, 20)))
        f["link_fraction"] = 0.0 if rng.random() < 0.5 else float(rng.uniform(0.05, 0.9))
    if rng.random() < 0.5:          # replicas of the pool fail too (any role)
        roles = cfg.cluster.replica_roles()
        n = len(roles)
        f["replica_failures"] = tuple(
            (float(np.round(rng.uniform(0, last + 50 * step) * 1024) / 1024),
             int(rng.integers(n))) for _ in range(int(rng.integers(1, 4))))
        if rng.random() < 0.3:      # drawn per role (the pools)
            f["mtbf"] = tuple((role, _lifetime(rng, span_(rng, step, 20, 400)))
                              for role in sorted(set(roles)) if rng.random() < 0.7) \
                or _lifetime(rng, span_(rng, step, 20, 400))
        f["restart_time"] = span_(rng, step, 0, 30)
        f["model_load_time"] = span_(rng, step, 0, 20)
    return cfg.replace(faults=FaultsConfig(**f))


def span_(rng: np.random.Generator, step: float, low: float, high: float) -> float:
    """A duration of ``low`` to ``high`` iterations."""
    return float(step * rng.uniform(low, high))


def faults_margin(cfg: SimConfig) -> float:
    """Simulated time retries, hedges and restarts may add to a run's livelock guard."""
    f = cfg.faults
    timeouts = max(f.ttft_timeout or 0.0, f.request_timeout or 0.0, f.hedge_delay or 0.0)
    restart = _longest(f.restart_time) + _longest(f.model_load_time or ("fixed", 60.0))
    down = sum(duration for _, duration, _, _ in f.link_events)
    if f.link_mtbf is not None:     # drawn link events: a down time per expected event
        down += 10 * _longest(f.link_mttr)
    return 10 * f.max_num_attempts * (f.backoff_max_time + timeouts + restart) \
        + 10 * restart * (len(f.replica_failures) + 1) + 10 * down


def _longest(spec: tuple) -> float:
    if spec and isinstance(spec[0], tuple):     # per pool: the longest pool's
        return max(_longest(value) for _, value in spec)
    kind, *params = spec
    if kind == "uniform":
        return params[1]
    if kind == "weibull":
        return 10 * params[1]
    return 10 * params[0] if kind != "fixed" else params[0]
