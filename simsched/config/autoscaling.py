"""The autoscaling part of a cluster config: policy, delays, pools with prices and limits.

``ClusterConfig.autoscaling`` holds one :class:`AutoscalingConfig` (None: a fixed fleet, the
default). The mechanism lives in :mod:`simsched.cluster.fleet` and :mod:`simsched.cluster.autoscaler`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from simsched.config.checks import check_choice, check_float, check_int, plain
from simsched.config.parts import replica_fields
from simsched.config.serialize import _tuples
from simsched.workloads.sessions import parse_distribution

POLICIES = ("threshold", "saturation", "scheduled")
# Per-replica load figures the threshold policy can target (means over routable replicas).
METRICS = ("running", "waiting", "outstanding", "kv_use", "ttft")
POOL_KEYS = ("name", "price_per_hour", "min_replicas", "max_replicas")
# What a removed replica does with the requests it holds (simsched.cluster.removal).
ON_REMOVE = ("drain", "migrate", "abort")
# The shortest sampling interval, in seconds. Each sample is one event and a pass over the
# routable replicas (tens of microseconds), so a shorter one only slows the run: 1e-9 would be
# a billion samples per simulated second. Real autoscalers decide every 15-60 s (HPA's default
# sync period is 15 s), so 1 ms leaves room for a day compressed 10,000 times.
MIN_INTERVAL = 1e-3
# The longest migration (a number, or a distribution's mean or upper end), in seconds. While a
# request is in transit the run goes on and the autoscaler samples every interval, so a
# migration that never lands (1e17 s) would sample for ever; a migration re-prefills a request
# elsewhere, seconds of work, and one of an hour is no longer a migration: an hour bounds the
# run's extra samples at 3,600 / interval.
MAX_MIGRATION_TIME = 3600.0


def _delay(name: str, value) -> tuple:
    try:
        return parse_distribution(name, value, False)
    except ValueError as exc:
        raise ValueError(str(exc).replace("workload.", "cluster.autoscaling.")) from None


@dataclass(frozen=True)
class AutoscalingConfig:
    """How a fleet grows and shrinks during a run.

    Every ``interval`` seconds (at least :data:`MIN_INTERVAL`, 1 ms: each sample is an event
    and a pass over the replicas) the autoscaler samples the replicas (waiting and running requests,
    KV use, recent TTFT) and decides a target replica count with ``policy``:

    - ``threshold`` (HPA-style): ``desired = ceil(routable * value / target)`` where ``value`` is
      the mean of ``metric`` over routable replicas (``running``, ``waiting``, ``outstanding``
      requests, ``kv_use`` share, or ``ttft``: the mean TTFT in seconds of the requests whose
      first token came in the last interval); within ``tolerance`` of the target nothing changes.
      A scale-up takes the smallest desired count of the last ``scale_up_window`` seconds, a
      scale-down the largest of the last ``scale_down_window`` (HPA's stabilisation windows).
    - ``saturation`` (llm-d's analyser): the fleet's KV demand (blocks in use plus the prompt
      blocks of waiting requests) against capacity: ``desired = ceil(demand / (blocks per
      replica * kv_target))``, with the same windows.
    - ``scheduled``: ``plan`` is ``((at, count), ...)``; at each ``at`` the target becomes
      ``count`` (exactly at that time, not at the next sample).

    ``max_step`` caps replicas added or removed per decision (None: no cap). A new replica bills
    from the decision but is routable only after ``provisioning_time`` plus ``model_load_time``
    seconds (numbers, or distributions as ``("uniform", lo, hi)``, ``("exponential", mean)``,
    ``("lognormal", mu, sigma)``). A removed replica stops receiving requests at once; a replica
    still provisioning is cancelled instead. What happens to the requests a removed replica holds
    (waiting and running) is ``on_remove``:

    - ``drain`` (the default): it finishes them and stops billing when empty.
    - ``abort``: they end at once, status ``aborted`` with a ``reject_reason`` naming the replica
      and the time (the tokens they already received stay counted); the replica stops billing
      at once, an iteration in progress is lost.
    - ``migrate``: they leave at once and, ``migration_time`` seconds later (a number or a
      distribution as above, drawn per request; at most :data:`MAX_MIGRATION_TIME`, an hour, as a
      value, upper end or mean), are routed by the cluster's router to a routable
      replica, where they continue as after a recompute preemption: the prompt and the tokens
      generated so far are prefilled again (vLLM's recompute; emitted tokens keep their times,
      and TTFT is unchanged once the first token was out). The replica stops billing at once;
      the request frame gains ``num_migrations``.

    ``pools`` are replica pools: mappings with ``name``, ``price_per_hour``, ``min_replicas``,
    ``max_replicas`` and any per-replica scheduler, cache or hardware fields (``gpu``,
    ``tensor_parallel_size``, ``num_blocks``, ...). Without pools there is one pool of the base
    replica at ``price_per_hour`` between ``min_replicas`` and ``max_replicas``. The run starts
    with ``cluster.num_replicas`` routable replicas, each pool first getting its minimum, then in
    pool order. Scale-up adds to the cheapest pool with room (per replica-hour), scale-down
    removes the newest replica of the dearest pool.

    ``power_budget_watts`` (None: no budget) caps the fleet's provisioned power, as a rack or
    row's power budget does: every replica not yet stopped (provisioning, routable or draining)
    counts its GPUs' board power (TDP x tensor-parallel size,
    :data:`simsched.cost.power.POWER_SPECS`), and a scale-up adds no replica that would take the
    total over the budget (it adds to the next cheapest pool that fits, or waits). The starting
    fleet and every pool's minimum must fit.
    """

    policy: str = "threshold"
    interval: float = 30.0
    metric: str = "running"
    target: float = 32.0
    tolerance: float = 0.1
    kv_target: float = 0.8
    scale_up_window: float = 0.0
    scale_down_window: float = 300.0
    max_step: int | None = None
    plan: tuple = ()
    provisioning_time: float | tuple = 60.0
    model_load_time: float | tuple = 60.0
    min_replicas: int = 1
    max_replicas: int = 64
    price_per_hour: float = 0.0
    pools: tuple = ()
    on_remove: str = "drain"
    migration_time: float | tuple = 0.0
    power_budget_watts: float | None = None

    def __post_init__(self) -> None:
        plain(self)
        o = "cluster.autoscaling"
        check_choice(o, "policy", self.policy, POLICIES)
        check_float(o, "interval", self.interval, 0.0, low_open=True, finite=True)
        if self.interval < MIN_INTERVAL:
            raise ValueError(f"{o}.interval must be >= {MIN_INTERVAL:g} s, got {self.interval!r}: "
                             "each sample is one event and a pass over the replicas, so a "
                             "shorter interval only slows the run (without end, near 0)")
        check_choice(o, "metric", self.metric, METRICS)
        check_float(o, "target", self.target, 0.0, low_open=True, finite=True)
        check_float(o, "tolerance", self.tolerance, 0.0, 1.0)
        check_float(o, "kv_target", self.kv_target, 0.0, 1.0, low_open=True)
        check_float(o, "scale_up_window", self.scale_up_window, 0.0, finite=True)
        check_float(o, "scale_down_window", self.scale_down_window, 0.0, finite=True)
        if self.max_step is not None:
            check_int(o, "max_step", self.max_step, 1)
        check_choice(o, "on_remove", self.on_remove, ON_REMOVE)
        if self.power_budget_watts is not None:
            check_float(o, "power_budget_watts", self.power_budget_watts, 0.0, low_open=True,
                        finite=True)
        for name in ("provisioning_time", "model_load_time", "migration_time"):
            object.__setattr__(self, name, _delay(name, _tuples(getattr(self, name))))
        # fixed: the value; uniform: its upper end; exponential, lognormal: the mean.
        kind, *params = self.migration_time
        longest = params[1] if kind == "uniform" else params[0]
        if longest > MAX_MIGRATION_TIME:
            raise ValueError(f"{o}.migration_time {self.migration_time!r} must be at most "
                             f"{MAX_MIGRATION_TIME:g} s (its value, upper end or mean): the run "
                             "samples every interval while a request is in transit, so a "
                             "migration that (almost) never lands would not let it end")
        check_int(o, "min_replicas", self.min_replicas, 0, 100_000)
        check_int(o, "max_replicas", self.max_replicas, 1, 100_000)
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"{o}.min_replicas={self.min_replicas} exceeds "
                             f"max_replicas={self.max_replicas}")
        check_float(o, "price_per_hour", self.price_per_hour, 0.0, finite=True)
        self._check_plan(o)
        self._check_pools(o)

    def _check_plan(self, o: str) -> None:
        plan = _tuples(self.plan)
        usage = f"{o}.plan must be ((at seconds, count), ...) with increasing at >= 0, got {plan!r}"
        if not isinstance(plan, tuple):
            raise ValueError(usage)
        out, last = [], -math.inf
        for entry in plan:
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise ValueError(usage)
            at, count = entry
            if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) \
                    or at < 0 or at <= last or isinstance(count, bool) \
                    or not isinstance(count, int) or count < 0:
                raise ValueError(usage)
            last = at
            out.append((float(at), count))
        if self.policy == "scheduled" and not out:
            raise ValueError(f"{o}.plan is required for policy='scheduled'")
        object.__setattr__(self, "plan", tuple(out))

    def _check_pools(self, o: str) -> None:
        pools = self.pools
        if isinstance(pools, Mapping) or not isinstance(pools, (tuple, list)):
            raise ValueError(f"{o}.pools must be a tuple of mappings, got {pools!r}")
        known = replica_fields()
        names, out = set(), []
        for i, pool in enumerate(pools):
            where = f"{o}.pools[{i}]"
            if not isinstance(pool, Mapping):
                raise ValueError(f"{where} must be a mapping, got {pool!r}")
            for key in pool:
                if key not in POOL_KEYS and key.split(".", 1)[-1] not in known:
                    raise ValueError(f"{where} has unknown field {key!r}; a pool sets "
                                     f"{', '.join(POOL_KEYS)} and replica fields")
            name = pool.get("name", f"pool{i}")
            if not isinstance(name, str) or not name or name in names:
                raise ValueError(f"{where}.name must be a unique non-empty string, got {name!r}")
            names.add(name)
            check_float(where, "price_per_hour", pool.get("price_per_hour", 0.0), 0.0,
                        finite=True)
            low, high = pool.get("min_replicas", 0), pool.get("max_replicas", 64)
            check_int(where, "min_replicas", low, 0, 100_000)
            check_int(where, "max_replicas", high, 1, 100_000)
            if low > high:
                raise ValueError(f"{where}.min_replicas={low} exceeds max_replicas={high}")
            out.append(dict(pool))
        object.__setattr__(self, "pools", tuple(out))

    def pool_specs(self) -> list[dict[str, Any]]:
        """One mapping per pool: ``name``, ``price_per_hour``, ``min_replicas``,
        ``max_replicas`` and ``overrides`` (the replica fields it sets)."""
        if not self.pools:
            return [{"name": "default", "price_per_hour": float(self.price_per_hour),
                     "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                     "overrides": {}}]
        return [{"name": p.get("name", f"pool{i}"),
                 "price_per_hour": float(p.get("price_per_hour", 0.0)),
                 "min_replicas": p.get("min_replicas", 0), "max_replicas": p.get("max_replicas", 64),
                 "overrides": {k: v for k, v in p.items() if k not in POOL_KEYS}}
                for i, p in enumerate(self.pools)]


def initial_pools(pools, num_replicas: int) -> list[int]:
    """The pool of each replica at the start: every pool's minimum, then in pool order."""
    counts = [p["min_replicas"] for p in pools]
    left = num_replicas - sum(counts)
    for k, pool in enumerate(pools):
        extra = min(left, pool["max_replicas"] - counts[k])
        counts[k] += extra
        left -= extra
    return [k for k, c in enumerate(counts) for _ in range(c)]
