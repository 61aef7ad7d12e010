"""Capacity search: the largest arrival rate at which a latency target still holds, per policy.

For each policy and seed the search brackets the capacity (doubling the rate from ``low`` until
the target fails) and then bisects until the bracket is narrower than ``tol`` times its lower end;
each seed's capacity is the largest rate verified to hold for that seed. With one seed that is the
capacity reported, with the final bracket as its interval. With several, the capacity reported is
the mean of the per-seed capacities and its interval the Student-t 95 % interval around that mean
(clipped at 0: a rate is never negative), so the interval is always centred on the value it
qualifies. All runs of one round (every policy's and seed's probes) execute together on the chosen
executor; seeds share the runs where their probes coincide.

Without ``high`` the doubling is bounded by the engine itself: it stops once the rate held is
:data:`MAX_OVERLOAD` times the highest request throughput any probe achieved. Beyond that the
system is far past saturation and a target that still holds there (a finite run whose queue drains
too fast to break it) never binds; the search then reports status ``never_violated`` with the
largest rate tried, rather than doubling towards float limits.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from simsched.analysis.slo import SLO
from simsched.config import SimConfig
from simsched.analysis.executors import Job, execute, reraise_warnings
from simsched.analysis.runner import RejectionWarning

MAX_ROUNDS = 60
# Without ``high``, stop doubling once the rate held is this many times the highest request
# throughput measured: far past saturation, where more offered load only lengthens the queue.
MAX_OVERLOAD = 10.0


@dataclass(frozen=True)
class SLOTarget:
    """What must hold at a rate: upper limits on summary metrics and/or a minimum SLO attainment.

    ``limits`` maps a metric of the sweep rows (e.g. ``"ttft_p99"``, ``"tpot_p99"``,
    ``"e2el_mean"``, ``"queue_time_mean"``) to its largest allowed value (seconds); with ``slo``
    and ``min_attainment`` (0-1] at least that share of requests must meet ``slo``. A rate also
    fails if any run ended (``max_sim_time``) with requests unfinished, since their latencies are
    then missing from the metrics.
    """

    limits: Mapping[str, float] = field(default_factory=dict)
    slo: SLO | None = None
    min_attainment: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.limits, Mapping):
            raise ValueError(f"target.limits must be a mapping of metric to limit, "
                             f"got {self.limits!r}")
        for name, value in self.limits.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not value > 0 or not math.isfinite(value):
                raise ValueError(f"target limit {name!r} must be a finite number > 0, "
                                 f"got {value!r}")
        if self.min_attainment is not None:
            if not isinstance(self.min_attainment, (int, float)) \
                    or not 0 < self.min_attainment <= 1:
                raise ValueError(f"target.min_attainment must be in (0, 1], "
                                 f"got {self.min_attainment!r}")
            if not isinstance(self.slo, SLO):
                raise ValueError("target.min_attainment needs target.slo (an SLO)")
        if not self.limits and self.min_attainment is None:
            raise ValueError("a capacity target needs limits and/or min_attainment with an slo")

    def holds(self, rows: pd.DataFrame) -> bool:
        """Whether the target holds on the mean over ``rows`` (the runs of one rate)."""
        if (rows["num_unfinished"] > 0).any():
            return False
        for name, limit in self.limits.items():
            if name not in rows.columns:
                raise ValueError(f"target metric {name!r} is not a sweep column; try e.g. "
                                 "ttft_p99, tpot_p99, itl_p99, e2el_p90, ttft_mean")
            if not rows[name].mean() <= limit:      # NaN (no finished request) fails too
                return False
        if self.min_attainment is not None and not rows["slo_attainment"].mean() \
                >= self.min_attainment:
            return False
        return True


class _Track:
    """One bracketing-then-bisection search over the rate, for one policy and one seed."""

    def __init__(self, label: str, seed: int, low: float, high: float | None,
                 tol: float) -> None:
        self.label, self.seed, self.tol, self.high = label, seed, tol, high
        self.ok: float | None = None
        self.fail: float | None = None
        self.probe: float | None = low
        self.status = "ok"
        self.peak_throughput = 0.0

    def update(self, holds: bool, throughput: float) -> None:
        rate = self.probe
        if throughput > self.peak_throughput:        # NaN (nothing finished) compares False
            self.peak_throughput = float(throughput)
        if holds:
            self.ok = rate
        else:
            self.fail = rate
        if self.ok is None:                          # fails already at ``low``
            self.probe, self.status = None, "below_low"
        elif self.fail is None:
            if self.high is not None and self.ok >= self.high:
                self.probe, self.status = None, "at_high"
            elif self.high is None and self.ok >= MAX_OVERLOAD * self.peak_throughput:
                self.probe, self.status = None, "never_violated"
            else:
                self.probe = self.ok * 2 if self.high is None else min(self.ok * 2, self.high)
        elif self.fail - self.ok <= self.tol * self.ok:
            self.probe = None
        else:
            self.probe = (self.ok + self.fail) / 2

    @property
    def capacity(self) -> float:
        return self.ok if self.ok is not None else 0.0

    @property
    def bracket(self) -> tuple[float, float]:
        """The rates known to hold and to fail (0 and inf where none is known)."""
        return (self.ok if self.ok is not None else 0.0,
                self.fail if self.fail is not None else math.inf)


def _variants(policies) -> list[tuple[str, dict]]:
    if policies is None:
        return [("base", {})]
    if isinstance(policies, (str, bytes)):
        policies = [policies]
    if isinstance(policies, Mapping):
        items = list(policies.items())
    else:
        items = []
        for p in policies:
            if isinstance(p, str):
                items.append((p, {"policy": p}))
            elif isinstance(p, Mapping):
                changes = dict(p)
                label = changes.pop("label", None) or "+".join(
                    f"{k}={v}" for k, v in changes.items())
                items.append((label, changes))
            else:
                raise ValueError(f"policies items must be names or dicts of changes, got {p!r}")
    out = []
    for label, changes in items:
        if isinstance(changes, str):
            changes = {"policy": changes}
        out.append((str(label), dict(changes)))
    if len({label for label, _ in out}) != len(out):
        raise ValueError(f"policy labels must be distinct, got {[label for label, _ in out]}")
    return out


def run_probes(keys: list, jobs: list, cache: dict, desc: str, notes: dict | None = None,
               **execute_options) -> None:
    """Run ``jobs`` (one per key) on an executor and store each summary row in ``cache[key]``.

    A warning a worker raised is raised again here, except, when ``notes`` is given, rejection
    warnings: those are stored as ``notes[key]`` (the caller reports them in its own words).
    """
    outputs = execute(jobs, desc=desc, **execute_options)
    if notes is not None:
        for key, out in zip(keys, outputs):
            found = [m for c, m in out.warnings if issubclass(c, RejectionWarning)]
            if found:
                notes[key] = found[0]
            out.warnings = tuple((c, m) for c, m in out.warnings
                                 if not issubclass(c, RejectionWarning))
    reraise_warnings(outputs)
    for key, out in zip(keys, outputs):
        cache[key] = out.row


def capacity_search(base_config: SimConfig | None, slo_target: "SLOTarget | Mapping[str, float]",
                    policies: Iterable | Mapping | None = None, seeds: Iterable[int] = (0,),
                    low: float = 0.5, high: float | None = None, tol: float = 0.05,
                    rate_field: str = "rate", executor: str = "local",
                    max_workers: int | None = None, progress: bool = True,
                    ray_address: str | None = None) -> pd.DataFrame:
    """The largest arrival rate at which ``slo_target`` holds, for each policy.

    ``slo_target`` is an :class:`SLOTarget` or a mapping of metric to limit
    (``{"ttft_p99": 0.5, "tpot_p99": 0.1}``). ``policies`` lists policy names, dicts of config
    changes (an optional ``"label"`` key names them) or a mapping ``label -> changes``.
    ``low`` is the first rate probed, ``high`` (optional) caps it; without it the doubling stops
    at :data:`MAX_OVERLOAD` times the highest throughput measured. ``tol`` is the relative width
    at which bisection stops. Each seed is searched on its own.

    Returns one row per policy: ``policy``, ``capacity`` (one seed: the largest rate verified to
    hold; several: the mean of the per-seed capacities), ``ci_low``/``ci_high`` (one seed: the
    final bracket; several: the Student-t 95 % interval of that mean, clipped at 0, with
    ``ci_high`` infinite when some seed's capacity is only a lower bound), ``bracket_low`` and
    ``bracket_high`` (the lowest rate known to hold and the highest known to fail, over the
    seeds), ``status``, ``max_request_throughput`` (the highest request throughput a probe
    achieved), ``num_seeds`` and ``num_runs``. ``status`` is ``ok``; ``below_low`` if ``low``
    already fails (capacity 0); ``at_high`` if ``high`` holds; ``never_violated`` if, without
    ``high``, the target held at every rate up to :data:`MAX_OVERLOAD` times the highest
    throughput (the capacity is then that rate: the target does not bind on this run length);
    ``max_rounds`` if :data:`MAX_ROUNDS` rounds did not settle it; ``mixed`` if the seeds
    disagree (each seed's status is in ``seed_capacities``). The last four make the capacity a
    lower bound.

    Two tidy frames ride in ``result.attrs``: ``"runs"``, every run made (one row per policy,
    rate and seed, with ``holds``), and ``"seed_capacities"``, one row per policy and seed
    (``policy, seed, capacity, bracket_low, bracket_high, status``). ``progress`` shows a
    progress bar (tqdm) for each round of more than one run.
    """
    base_config = base_config or SimConfig()
    target = slo_target if isinstance(slo_target, SLOTarget) else SLOTarget(limits=slo_target)
    seeds = tuple(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0
                        for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {seeds!r}")
    for name, value in (("low", low), ("tol", tol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if high is not None and (isinstance(high, bool) or not isinstance(high, (int, float))
                             or not high >= low or not math.isfinite(high)):
        raise ValueError(f"high must be a finite number >= low ({low}), got {high!r}")
    variants = _variants(policies)
    for _, changes in variants:       # fail on bad fields before anything runs
        base_config.replace(**changes, **{rate_field: low})
    tracks = {label: [_Track(label, s, low, high, tol) for s in seeds] for label, _ in variants}
    changes_of = dict(variants)
    cache: dict[tuple, dict] = {}
    for _ in range(MAX_ROUNDS):
        live = [t for group in tracks.values() for t in group if t.probe is not None]
        if not live:
            break
        keys = sorted({(t.label, t.probe, t.seed) for t in live} - set(cache), key=str)
        jobs = [Job(base_config.replace(**changes_of[label], **{rate_field: rate, "seed": seed}),
                    target.slo, keep_frames=False) for label, rate, seed in keys]
        run_probes(keys, jobs, cache, executor=executor, max_workers=max_workers,
                   progress=progress, ray_address=ray_address, desc="capacity")
        for t in live:
            row = cache[(t.label, t.probe, t.seed)]
            t.update(target.holds(pd.DataFrame([row])), row.get("request_throughput", math.nan))
    for group in tracks.values():
        for t in group:
            if t.probe is not None:
                t.probe, t.status = None, "max_rounds"
    _warn_unbound(tracks)
    runs = _runs_frame(cache, target, seeds)
    table, seed_rows = [], []
    for label, group in tracks.items():
        seed_rows += [{"policy": label, "seed": int(t.seed), "capacity": float(t.capacity),
                       "bracket_low": t.bracket[0], "bracket_high": t.bracket[1],
                       "status": t.status} for t in group]
        capacity, ci_low, ci_high = _estimate(group)
        statuses = {t.status for t in group}
        table.append({"policy": label, "capacity": capacity, "ci_low": ci_low,
                      "ci_high": ci_high, "bracket_low": min(t.bracket[0] for t in group),
                      "bracket_high": max(t.bracket[1] for t in group),
                      "status": statuses.pop() if len(statuses) == 1 else "mixed",
                      "max_request_throughput": max(t.peak_throughput for t in group),
                      "num_seeds": len(seeds),
                      "num_runs": int((runs["policy"] == label).sum())})
    result = pd.DataFrame(table)
    result.attrs["runs"] = runs
    result.attrs["seed_capacities"] = pd.DataFrame(
        seed_rows, columns=["policy", "seed", "capacity", "bracket_low", "bracket_high",
                            "status"])
    return result


def _warn_unbound(tracks: Mapping[str, list[_Track]]) -> None:
    """One warning per policy whose target never failed before the overload bound."""
    for label, group in tracks.items():
        loose = [t for t in group if t.status == "never_violated"]
        if loose:
            rate = max(t.capacity for t in loose)
            peak = max(t.peak_throughput for t in loose)
            warnings.warn(
                f"capacity of {label!r}: the target held at every rate tried, up to {rate:.4g} "
                f"req/s ({MAX_OVERLOAD:g}x the highest throughput measured, {peak:.4g} req/s), "
                f"so it does not bind on runs this short; status 'never_violated'. Use more "
                f"requests (or a duration), a tighter target, or cap the rate (high)", UserWarning,
                stacklevel=3)


# Student-t 0.975 quantiles for 1..30 degrees of freedom (standard table), so a 95 % interval
# needs no scipy; above 30 the Cornish-Fisher expansion around z = 1.96 is within 1e-4.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def _estimate(group: list[_Track]) -> tuple[float, float, float]:
    """``(capacity, ci_low, ci_high)`` from one policy's per-seed searches.

    One seed: its capacity and final bracket. Several: the mean of the per-seed capacities and
    the Student-t 95 % interval around it, clipped at 0; the upper end is infinite when a seed's
    capacity is only a lower bound (``at_high``, ``never_violated``, ``max_rounds``).
    """
    if len(group) == 1:
        return (group[0].capacity, *group[0].bracket)
    values = np.array([t.capacity for t in group], dtype=float)
    mean = float(values.mean())
    half = t_quantile_975(len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    bounded = all(t.status in ("ok", "below_low") for t in group)
    return mean, max(0.0, mean - half), (mean + half if bounded else math.inf)


def _runs_frame(cache: Mapping[tuple, dict], target: SLOTarget, seeds: tuple) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for (label, rate, seed), row in sorted(cache.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                          kv[0][2])):
        one = pd.DataFrame([row])
        rows.append({"policy": label, "rate": rate, "seed": seed,
                     "holds": target.holds(one), **row})
    return pd.DataFrame(rows)
