"""A fleet whose replicas come and go during a run (autoscaling's mechanism).

:class:`Fleet` owns the replica lifecycle of an autoscaled cluster: a replica is *requested*
(billing starts), becomes *routable* after its provisioning and model-load delays, is
*drained* when removed (it leaves the routing set at once, finishes what it holds, and stops
billing when empty) or *cancelled* if removed while still provisioning. Each lifecycle is one
*unit* (a row of :meth:`Fleet.units_frame`). With ``on_remove`` ``"abort"`` or ``"migrate"`` a
removed replica empties at once instead of draining (:mod:`simsched.cluster.removal`) and stops
billing then.

Routers stay exact and fast: the router sees only the routable replicas, as a plain
:class:`~simsched.cluster.state.ReplicaLoad` over them (local indices 0..k-1) rebuilt when the
routing set changes (a scale event, O(replicas log replicas)); :class:`Fleet` takes the
cluster's per-request load updates by global replica index and forwards them in O(1) (or
O(log replicas) for an ordered figure) to the routable replica's local slot. So a router can
never pick a replica that is provisioning, draining or stopped, and a fixed-size cluster (no
autoscaling) never builds a Fleet. The policies deciding the target count live in
:mod:`simsched.cluster.autoscaler`.
"""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from simsched.cluster.removal import Remover
from simsched.config.autoscaling import initial_pools
from simsched.cost.power import power_spec
from simsched.cluster.flow import refuse_flow_control
from simsched.cluster.routers import RoundRobin, SessionAffinity, make_router
from simsched.cluster.state import ReplicaLoad, Snapshot, TokenBucket
from simsched.engine.kv.tiers import join_remote_tier
from simsched.engine.replica import Replica
from simsched.workloads.sessions import draw

UNIT_COLUMNS = ("unit", "pool", "replica", "requested_at", "routable_at", "drain_at",
                "stopped_at", "price_per_hour")


def pool_specs(config, base_specs, spec_builder) -> list[dict]:
    """The pools of ``config``'s autoscaling, each with the ReplicaSpec its replicas use.

    A pool without replica fields reuses ``base_specs[0]`` (the run's cost model override
    included); one with fields gets ``spec_builder(replica config)``.
    """
    pools = config.cluster.autoscaling.pool_specs()
    for pool, rcfg in zip(pools, config.pool_configs()):
        pool["spec"] = spec_builder(rcfg) if pool["overrides"] else base_specs[0]
    return pools


def prepare(config, specs: list, build) -> tuple[list[dict], list[int]]:
    """The pools and each initial replica's pool; ``specs`` is rewritten in place to the initial
    replicas' pool specs (a caller holding the list sees every replica's spec, new ones too).
    ``build(replica config)`` makes a pool's spec."""
    pools = pool_specs(config, specs, build)
    pool_of = initial_pools(pools, config.cluster.num_replicas)
    specs[:] = [pools[k]["spec"] for k in pool_of]
    return pools, pool_of


def fixed_fleet(cluster, router_rng) -> "Fleet":
    """A fleet for a fixed cluster whose replicas fail (:mod:`simsched.cluster.failures`): its
    replicas as they are, one pool, the autoscaling defaults and no autoscaler."""
    from simsched.config.autoscaling import AutoscalingConfig

    n = len(cluster.replicas)
    auto = AutoscalingConfig(min_replicas=n, max_replicas=max(n, 1))
    pools = [{"name": "default", "price_per_hour": 0.0, "min_replicas": n, "max_replicas": n,
              "overrides": {}, "spec": cluster.specs[0]}]
    return Fleet(cluster, pools, [0] * n, router_rng, None, auto)


class Fleet:
    """The replicas of an autoscaled cluster, their routing set, load and bill.

    Built by :class:`~simsched.cluster.cluster.Cluster` in place of its fixed routing setup;
    ``pools`` come from :func:`pool_specs` and ``pool_of`` gives the initial replicas' pools.
    """

    def __init__(self, cluster, pools, pool_of: list[int], router_rng, rng,
                 auto=None) -> None:
        cl = cluster.config.cluster
        self.cluster, self.env, self.pools = cluster, cluster.env, pools
        # ``auto``: a fixed cluster whose replicas fail routes through a fleet too (with the
        # autoscaling defaults, and no autoscaler).
        self.auto = cl.autoscaling if auto is None else auto
        self.failures = None    # simsched.cluster.failures, where replicas fail
        self.rng = rng                      # delays
        self.replicas = cluster.replicas    # grows: new replicas are appended
        self.pool_of = list(pool_of)
        self.state = ["routable"] * len(pool_of)
        self.unit_of = list(range(len(pool_of)))
        # Units: one per replica lifecycle, billed from requested_at to stopped_at.
        self.units: list[list] = [[k, p, k, 0.0, 0.0, np.nan, np.nan, pools[p]["price_per_hour"]]
                                  for k, p in enumerate(pool_of)]
        self.provisioning: list[int] = []   # unit ids waiting out their delays
        # A power budget counts each live unit's board power (its pool's GPUs' TDP x TP).
        self.budget = self.auto.power_budget_watts
        self.pool_watts = [power_spec(p["spec"].config.hardware.gpu).tdp_watts
                           * p["spec"].config.hardware.tensor_parallel_size for p in pools] \
            if self.budget is not None else None
        self.cancelled: set[int] = set()
        n = len(self.replicas)
        self.outstanding, self.tokens = [0] * n, [0] * n
        self.pending_prompt, self.kv_use = [0] * n, [0.0] * n
        self.ttft_sum, self.ttft_count = 0.0, 0
        self.routable: list[int] = list(range(n))
        self.local = array("q", range(n))
        router = make_router(cl.router, cl.router_options, n, router_rng)
        refuse_flow_control(router, "an autoscaled fleet or one with failing replicas")
        self.router = router
        self.needs = router.needs
        self.output_tokens = getattr(router, "output_tokens", None)
        for replica in self.replicas:
            self._hook(replica)
        self.inner = self._build_load()
        self.snapshot = Snapshot(self.inner) if cl.refresh_interval > 0 else None
        routable, choose = self.routable, router.choose
        cluster.load = self
        cluster.router = router
        cluster.view = self.snapshot or self.inner
        cluster._choose = lambda view, req: routable[choose(view, req)]
        cluster.replica_of = array("i", [-1]) * len(cluster.requests)
        cluster.bucket = TokenBucket(cl.rate_limit, cl.burst) if cl.rate_limit is not None \
            else None
        cluster.queue_cap = cl.max_num_queued_per_replica
        if self.snapshot is not None:
            self.env.process(self._refresh(cl.refresh_interval))
        # A removed replica drains (nothing to set up), or aborts or migrates its requests
        # (simsched.cluster.removal); decided here, once.
        self.remover = None
        if self.auto.on_remove != "drain":
            self.remover = Remover(self, self.auto.on_remove, cluster.config.seed)
        if self.auto.on_remove == "migrate":
            self.finished = self._finished_at_owner     # a request may end away from its first

    def _hook(self, replica) -> None:
        replica.on_first_token = self.first_token
        if self.cluster.clients is not None:    # the run's end waits for its iterations
            replica.on_idle = lambda r: self.cluster.work_end.idle(r)
        if self.router.reads_kv:
            replica.on_kv = self.kv_changed

    def _build_load(self) -> ReplicaLoad:
        """The router's view over the routable replicas (local indices), with their figures."""
        routable = self.routable
        load = ReplicaLoad([self.replicas[g] for g in routable], self.needs, self.output_tokens)
        load.outstanding = [self.outstanding[g] for g in routable]
        load.tokens = [self.tokens[g] for g in routable]
        load.kv_use = [self.kv_use[g] for g in routable]
        load.total_outstanding = sum(load.outstanding)
        load.reindex()
        return load

    def _routing_changed(self, old: list[int]) -> None:
        """Rebuild the router's view after the routing set changed from ``old``."""
        local = self.local
        for g in old:
            local[g] = -1
        for k, g in enumerate(self.routable):
            local[g] = k
        router, n = self.router, len(self.routable)
        router.num_replicas = n
        if isinstance(router, RoundRobin) and router.next >= n:
            router.next = 0
        if isinstance(router, SessionAffinity):     # keep sessions on their replica if routable
            router.home = {s: local[old[i]] for s, i in router.home.items()
                           if local[old[i]] >= 0}
        self.inner = self._build_load()
        if self.snapshot is not None:
            snap = self.snapshot
            snap._load, snap.replicas, snap.num_replicas = self.inner, self.inner.replicas, n
            snap.refresh(self.env.now)
        else:
            self.cluster.view = self.inner

    def _refresh(self, interval: float):
        env, cluster, total = self.env, self.cluster, len(self.cluster.requests)
        # With retries requests are sent until the work ends (the run stops there).
        while cluster.num_arrived < total or cluster.clients is not None:
            yield env.timeout(interval)
            self.snapshot.refresh(env.now)

    # ------------------------------------------------------------- load (global index)
    def routed(self, i: int, req) -> None:
        """``req`` was queued at replica ``i``."""
        out = req.num_output_tokens if self.output_tokens is None else self.output_tokens
        self.outstanding[i] += 1
        self.tokens[i] += req.num_prompt_tokens + out
        self.pending_prompt[i] += req.num_prompt_tokens
        k = self.local[i]
        if k >= 0:
            self.inner.routed(k, req)

    def first_token(self, i: int, req) -> None:
        """``req`` finished its prefill at replica ``i``."""
        self.tokens[i] -= req.num_prompt_tokens
        self.pending_prompt[i] -= req.num_prompt_tokens
        self.ttft_sum += req.first_token_at - req.arrival_at
        self.ttft_count += 1
        k = self.local[i]
        if k >= 0:
            self.inner.first_token(k, req)

    def finished(self, i: int, req) -> None:
        """``req`` finished at replica ``i`` (a drained replica stops when it empties)."""
        self.outstanding[i] -= 1
        self.tokens[i] -= req.num_output_tokens if self.output_tokens is None \
            else self.output_tokens
        k = self.local[i]
        if k >= 0:
            self.inner.finished(k, req)
        elif self.outstanding[i] == 0 and self.state[i] == "draining":
            self._stop(i)

    def aborted(self, i: int, req) -> None:
        """``req`` left replica ``i`` unfinished (its client gave up, or the replica failed):
        off its figures, its prompt too if its first token never came."""
        if req.first_token_at != req.first_token_at:        # NaN: its prompt was still due
            self.tokens[i] -= req.num_prompt_tokens
            self.pending_prompt[i] -= req.num_prompt_tokens
            k = self.local[i]
            if k >= 0:
                self.inner.first_token(k, req)
        self.finished(i, req)

    def _finished_at_owner(self, i: int, req) -> None:
        """:meth:`finished` with migrations: ``req`` finished where it is now, not at ``i``
        where it was first routed (an aborted migration left it nowhere: nothing to update)."""
        owner = self.cluster.replica_of[req.id]
        if owner >= 0:
            Fleet.finished(self, owner, req)

    def left(self, i: int, req) -> None:
        """``req`` left replica ``i`` (no longer routable) to migrate: off its figures."""
        self.outstanding[i] -= 1
        self.tokens[i] -= req.num_output_tokens if self.output_tokens is None \
            else self.output_tokens
        if req.first_token_at != req.first_token_at:        # NaN: its prompt was still due
            self.tokens[i] -= req.num_prompt_tokens
            self.pending_prompt[i] -= req.num_prompt_tokens

    def arrived(self, i: int, req) -> None:
        """Migrating ``req`` was queued at replica ``i``: routed there, its prompt counted only
        if its first token is still due."""
        self.routed(i, req)
        if req.first_token_at == req.first_token_at:
            self.tokens[i] -= req.num_prompt_tokens
            self.pending_prompt[i] -= req.num_prompt_tokens
            k = self.local[i]
            if k >= 0:
                self.inner.first_token(k, req)

    def kv_changed(self, i: int, num_used: int, num_blocks: int) -> None:
        """Replica ``i`` now holds ``num_used`` of its ``num_blocks`` KV blocks."""
        self.kv_use[i] = num_used / num_blocks
        k = self.local[i]
        if k >= 0:
            self.inner.kv_changed(k, num_used, num_blocks)

    # ------------------------------------------------------------- lifecycle
    def counts(self) -> tuple[int, int, int]:
        """``(routable, provisioning, draining)`` replicas now."""
        return (len(self.routable), len(self.provisioning),
                sum(1 for s in self.state if s == "draining"))

    def target(self) -> int:
        """Replicas the fleet is heading for: routable plus provisioning (plus restarting after
        a failure)."""
        if self.failures is not None:
            return len(self.routable) + len(self.provisioning) + len(self.failures.restarting)
        return len(self.routable) + len(self.provisioning)

    def _pool_count(self, k: int) -> int:
        return sum(1 for g, s in enumerate(self.state) if s == "routable" and self.pool_of[g] == k) \
            + sum(1 for u in self.provisioning if self.units[u][1] == k)

    def limits(self) -> tuple[int, int]:
        """The fleet's bounds: at least one routable replica and the pools' minima, at most their
        maxima."""
        return (max(1, sum(p["min_replicas"] for p in self.pools)),
                sum(p["max_replicas"] for p in self.pools))

    def scale_to(self, count: int) -> None:
        """Request or remove replicas until :meth:`target` is ``count`` (clamped to
        :meth:`limits`)."""
        low, high = self.limits()
        count = min(max(count, low), high)
        while self.target() < count:
            room = [k for k, p in enumerate(self.pools) if self._pool_count(k) < p["max_replicas"]]
            if self.budget is not None:
                spare = self.budget - self.provisioned_watts()
                room = [k for k in room if self.pool_watts[k] <= spare + 1e-9]
                if not room:        # at the power budget: the fleet waits for power to free
                    break
            self._request(min(room, key=lambda k: (self.pools[k]["price_per_hour"], k)))
        while self.target() > count:
            if not self._remove_one():
                break

    def _request(self, pool: int) -> None:
        now = self.env.now
        unit = len(self.units)
        self.units.append([unit, pool, -1, now, np.nan, np.nan, np.nan,
                           self.pools[pool]["price_per_hour"]])
        self.provisioning.append(unit)
        delay = float(draw(self.auto.provisioning_time, self.rng, 1, False)[0]
                      + draw(self.auto.model_load_time, self.rng, 1, False)[0])
        self.env.process(self._provision(unit, delay))

    def _provision(self, unit: int, delay: float):
        yield self.env.timeout(delay)
        if unit in self.cancelled:
            return
        self.provisioning.remove(unit)
        pool = self.units[unit][1]
        cluster, spec = self.cluster, self.pools[pool]["spec"]
        g = len(self.replicas)
        replica = Replica(self.env, spec.config, spec.cost_model, spec.num_blocks,
                          spec.max_model_len, cluster.replica_rng(g), index=g,
                          on_iteration=cluster.on_iteration)
        if cluster.remote_tier is not None:
            # It shares the cluster's remote KV store (the same check as at the start).
            join_remote_tier(replica.kv, cluster.remote_tier)
        self.replicas.append(replica)
        cluster.specs.append(spec)
        self._hook(replica)
        if cluster.on_replica_added is not None:
            cluster.on_replica_added(replica)
        for figures in (self.outstanding, self.tokens, self.pending_prompt):
            figures.append(0)
        self.kv_use.append(0.0)
        self.local.append(-1)
        self.pool_of.append(pool)
        self.state.append("routable")
        self.unit_of.append(unit)
        self.units[unit][2], self.units[unit][4] = g, self.env.now
        old = list(self.routable)
        self.routable.append(g)
        self._routing_changed(old)
        if self.failures is not None:
            self.failures.watch(g)

    def _remove_one(self) -> bool:
        """Cancel the newest provisioning unit of the dearest pool above its minimum, else drain
        the newest routable replica of such a pool; False if none may go."""
        def removable(k):
            return self._pool_count(k) > self.pools[k]["min_replicas"]

        def price(k):
            return self.pools[k]["price_per_hour"]

        now = self.env.now
        candidates = [u for u in self.provisioning if removable(self.units[u][1])]
        if candidates:
            unit = max(candidates, key=lambda u: (price(self.units[u][1]), u))
            self.provisioning.remove(unit)
            self.cancelled.add(unit)
            self.units[unit][6] = now
            return True
        candidates = [g for g in self.routable if removable(self.pool_of[g])]
        if len(self.routable) <= 1 or not candidates:
            return False
        g = max(candidates, key=lambda g: (price(self.pool_of[g]), g))
        old = list(self.routable)
        self.routable.remove(g)
        self.state[g] = "draining"
        self.units[self.unit_of[g]][5] = now
        self._routing_changed(old)
        if self.remover is not None:
            self.remover.remove(g)          # empties it now: it stops billing below
        if self.outstanding[g] == 0 and self.state[g] == "draining":
            self._stop(g)
        return True

    def _stop(self, g: int) -> None:
        self.state[g] = "stopped"
        self.units[self.unit_of[g]][6] = self.env.now

    # ------------------------------------------------------------- accounting
    def cost(self, now: float) -> float:
        """Money spent up to ``now``: each unit's billed seconds times its price per hour."""
        total = 0.0
        for unit in self.units:
            end = unit[6] if unit[6] == unit[6] else now
            total += max(0.0, min(end, now) - unit[3]) * unit[7] / 3600.0
        return total

    def provisioned_watts(self) -> float:
        """Board power of every unit not yet stopped (provisioning, routable or draining);
        only with a power budget."""
        return sum(self.pool_watts[u[1]] for u in self.units if u[6] != u[6])

    def cost_rate(self) -> float:
        """Money per hour now: the price of every unit not yet stopped."""
        return sum(u[7] for u in self.units if u[6] != u[6])

    def units_frame(self, end: float) -> pd.DataFrame:
        """One row per unit (:data:`UNIT_COLUMNS`), ``billed_time`` and ``cost`` up to ``end``."""
        frame = pd.DataFrame(self.units, columns=list(UNIT_COLUMNS))
        frame["pool"] = [self.pools[k]["name"] for k in frame["pool"]]
        stop = frame["stopped_at"].fillna(end).clip(upper=end)
        frame["billed_time"] = (stop - frame["requested_at"]).clip(lower=0.0)
        frame["cost"] = frame["billed_time"] * frame["price_per_hour"] / 3600.0
        return frame
