"""The clock of llm-d's flow control (:mod:`simsched.cluster.epp.flowcontrol`): requests wait in
the router's queues until a dispatch cycle lets them through, then are routed as usual.

As Go's shard processor: one dispatch cycle when a request is enqueued, and one every
millisecond (its ticker, on the millisecond grid of the run's clock) while anything is queued;
each reads the saturation detector over the pool (the gauges as the router sees them: live, or
the last scrape) and dispatches at most one request. A request still queued when its TTL
(``defaultRequestTTL``) runs out is evicted. Rejected and evicted requests end ``rejected`` with
a ``shed: llm-d flow control: ...`` reason and count as shed.
"""

from __future__ import annotations

import math

TICK = 0.001        # Go's dispatch ticker: time.Millisecond


class FlowGate:
    """Flow control in front of ``cluster``'s router (an ``llm-d`` router whose config turns
    the ``flowControl`` feature gate on)."""

    def __init__(self, cluster, router) -> None:
        cl = cluster.config.cluster
        if cl.rate_limit is not None or cluster.config.faults.enabled:
            raise ValueError("llm-d flow control with cluster.rate_limit or faults is not "
                             "modelled: use one or the other")
        detector = router.pipeline.detector
        stale = getattr(detector, "staleness", None)
        if cl.refresh_interval > 0 and stale is not None and cl.refresh_interval >= stale:
            # Every endpoint would look stale (saturation 1) between scrapes: nothing queued
            # would ever be dispatched.
            raise ValueError(f"llm-d flow control: refresh_interval {cl.refresh_interval:g} s "
                             f"is not below the {detector.TYPE}'s metricsStalenessThreshold "
                             f"({stale:g} s): every endpoint would look saturated")
        self.cluster, self.env, self.router = cluster, cluster.env, router
        self.ctl = router.flow_control
        router.clock = lambda: self.env.now     # requests are dispatched after they arrive
        self.ticking = False
        self.num_evicted = 0

    @property
    def busy(self) -> bool:
        """Whether requests are queued (the scrapes go on while they are)."""
        return self.ctl.num_queued > 0

    def route(self, req):
        """``req``'s replica after flow control and routing (-1: rejected or shed)."""
        cluster, env = self.cluster, self.env
        item = self.ctl.enqueue(req, env.now, self.router.slo_ttft_ms)
        if isinstance(item, str):
            cluster._shed(req, f"shed: llm-d flow control: rejected, {item}")
            return -1
        item.event = env.event()
        self._cycle()
        if not item.event.triggered:
            if not self.ticking:
                self.ticking = True
                env.process(self._ticker())
            if item.ttl > 0:
                yield item.event | env.timeout(item.ttl)
            else:
                yield item.event
            if not item.event.triggered:
                self.ctl.expire(item)
                self.num_evicted += 1
                cluster._shed(req, f"shed: llm-d flow control: evicted, TTL of "
                                   f"{item.ttl:g} s expired in the queue")
                return -1
        return cluster._route(req)

    def _cycle(self) -> None:
        ctl = self.ctl
        if ctl.num_queued == 0:
            return
        saturation = self.router.pool_saturation(self.cluster.view, self.env.now)
        item = ctl.dispatch_cycle(saturation)
        if item is not None:
            item.event.succeed()

    def _ticker(self):
        """A dispatch cycle on every millisecond of the clock while anything is queued."""
        env = self.env
        while self.ctl.num_queued > 0:
            k = math.floor(env.now / TICK) + 1
            if k * TICK <= env.now:         # (now on a tick that floor put one below)
                k += 1
            yield env.timeout(k * TICK - env.now)
            self._cycle()
        self.ticking = False


def refuse_flow_control(router, where: str) -> None:
    """Refuse an llm-d router with flow control in ``where`` (not modelled there)."""
    if getattr(router, "flow_control", None) is not None:
        raise ValueError(f"llm-d flow control (featureGates: [flowControl]) is not modelled in "
                         f"{where}")
