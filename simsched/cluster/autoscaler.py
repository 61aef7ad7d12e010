"""The autoscaler: samples the fleet every ``interval`` and sets its target replica count.

Policies (see :class:`~simsched.config.autoscaling.AutoscalingConfig`): ``threshold`` (HPA-style
target per replica with stabilisation windows and a step cap), ``saturation`` (KV demand against
capacity, as llm-d's analyser) and ``scheduled`` (a plan applied at its own times). Each sample
is one row of the run's fleet timeline (:data:`TIMELINE_COLUMNS`): replicas by state, target,
cost so far and per hour, and the load figures the policies read. The timeline's last row is
at the end of the work, where the run stops (:mod:`simsched.cluster.work_end`).
"""

from __future__ import annotations

import math
from collections import deque

import pandas as pd

TIMELINE_COLUMNS = ("at", "num_routable", "num_provisioning", "num_draining", "target",
                    "cost", "cost_per_hour", "running", "waiting", "outstanding", "kv_use",
                    "ttft", "kv_demand_blocks")


class Autoscaler:
    """Samples ``fleet`` (:class:`~simsched.cluster.fleet.Fleet`) and applies its policy."""

    def __init__(self, fleet) -> None:
        self.fleet = fleet
        self.auto = fleet.auto
        self.env = fleet.env
        self.rows: list[tuple] = []
        self.closed = False                 # the work has ended (simsched.cluster.work_end)
        # (at, desired) within the longer window; the starting size counts as a desire, so
        # a scale-down waits out its window from the start as it would in a running fleet.
        self.history: deque = deque([(self.env.now, fleet.target())])
        self.decide = {"threshold": self._threshold, "saturation": self._saturation,
                       "scheduled": None}[self.auto.policy]
        self.env.process(self._sample_loop())
        if self.auto.policy == "scheduled":
            self.env.process(self._plan())

    def close(self) -> None:
        """The work has ended: a last timeline row at its end (the run stops there)."""
        self.closed = True
        if not self.rows or self.rows[-1][0] < self.env.now:
            self._record(self.sample())

    def sample(self) -> dict:
        """The fleet's load now: means over routable replicas, totals, recent TTFT."""
        fleet = self.fleet
        routable = [fleet.replicas[g] for g in fleet.routable]
        n = len(routable)
        running = sum(len(r.scheduler.running) for r in routable)
        waiting = sum(r.num_waiting for r in routable)
        outstanding = sum(fleet.outstanding[g] for g in fleet.routable)
        used = sum(r.kv.num_used for r in routable)
        blocks = sum(r.kv.num_blocks for r in routable)
        pending = sum(fleet.pending_prompt[g] for g in fleet.routable)
        demand = used + sum(math.ceil(fleet.pending_prompt[g] / fleet.replicas[g].kv.block_size)
                            for g in fleet.routable) if pending else used
        ttft = fleet.ttft_sum / fleet.ttft_count if fleet.ttft_count else math.nan
        fleet.ttft_sum, fleet.ttft_count = 0.0, 0
        return {"running": running / n, "waiting": waiting / n, "outstanding": outstanding / n,
                "kv_use": used / blocks, "ttft": ttft, "kv_demand_blocks": demand,
                "blocks_per_replica": blocks / n}

    def _sample_loop(self):
        env, fleet, interval = self.env, self.fleet, self.auto.interval
        self._record(self.sample())
        while not self.closed:
            yield env.timeout(interval)
            figures = self.sample()
            if self.decide is not None:
                fleet.scale_to(self.decide(figures))
            self._record(figures)

    def _record(self, f: dict) -> None:
        fleet, now = self.fleet, self.env.now
        routable, provisioning, draining = fleet.counts()
        self.rows.append((now, routable, provisioning, draining, fleet.target(), fleet.cost(now),
                          fleet.cost_rate(), f["running"], f["waiting"], f["outstanding"],
                          f["kv_use"], f["ttft"], f["kv_demand_blocks"]))

    def _plan(self):
        env = self.env
        for at, count in self.auto.plan:
            if at > env.now:
                yield env.timeout(at - env.now)
            self.fleet.scale_to(count)

    # ------------------------------------------------------------- policies
    def _stabilised(self, desired: int) -> int:
        """HPA's stabilisation: scale up to the least desired count of the scale-up window,
        down to the greatest of the scale-down window, at most ``max_step`` at a time."""
        auto, now, current = self.auto, self.env.now, self.fleet.target()
        history = self.history
        history.append((now, desired))
        keep = max(auto.scale_up_window, auto.scale_down_window)
        while history and history[0][0] < now - keep:
            history.popleft()
        up = min(d for t, d in history if t >= now - auto.scale_up_window)
        down = max(d for t, d in history if t >= now - auto.scale_down_window)
        if up > current:
            target = up
        elif down < current:
            target = down
        else:
            return current
        if auto.max_step is not None:
            target = min(max(target, current - auto.max_step), current + auto.max_step)
        return target

    def _threshold(self, f: dict) -> int:
        value = f[self.auto.metric]
        n = len(self.fleet.routable)
        if value != value:                      # no TTFT in the last interval: no signal
            return self._stabilised(self.fleet.target())
        ratio = value / self.auto.target
        if abs(ratio - 1.0) <= self.auto.tolerance:
            return self._stabilised(self.fleet.target())
        return self._stabilised(math.ceil(n * ratio - 1e-9))

    def _saturation(self, f: dict) -> int:
        capacity = f["blocks_per_replica"] * self.auto.kv_target
        return self._stabilised(max(1, math.ceil(f["kv_demand_blocks"] / capacity - 1e-9)))

    def frame(self) -> pd.DataFrame:
        """The fleet timeline: one row per sample (:data:`TIMELINE_COLUMNS`)."""
        return pd.DataFrame(self.rows, columns=list(TIMELINE_COLUMNS))
