"""llm-d's default profile's scheduling cycle in one pass, where nothing else takes part.

:class:`FastCycle` replaces :meth:`LlmD.choose <simsched.cluster.epp.router.LlmD.choose>`'s
general cycle (metrics, producers, filters, each scorer's pass, the picker) for a profile that
is llm-d's default in shape: queue-scorer then kv-cache-utilization-scorer, then scorers that
score few endpoints above 0 (``sparse``: the prefix scorers), no filters, the max-score picker
picking one endpoint, and nothing acting on the choice but the prefix index; with the queue
gauges kept incrementally (:mod:`simsched.cluster.epp.gauges`: a plain cluster with exact
state). It gives the same floats and the same pick, drawing the same random numbers for ties
(the tests route fuzzed clusters both ways). A request without content identity (no prefix
blocks) scores 0 on every prefix scorer: its best endpoints come from the gauges' groups, with
no pass over the endpoints.
"""

from __future__ import annotations

from simsched.cluster.epp.plugins import MaxScorePicker
from simsched.cluster.epp.prefix import PrefixCacheScorer

# The cycle state of a request without prefix blocks (as the router's produce makes it): read,
# never changed.
NO_BLOCKS = {"prefix": ({}, 0), "hashes": [], "block_size": 0}


class FastCycle:
    """The one-pass cycle of ``router`` (an :class:`LlmD`) over its view's ``gauges``: see the
    module. It reads the router's profile and prefix producer, runs its producers
    (:meth:`LlmD.produce`) for requests with content, and sets its ``cycle``."""

    def __init__(self, router, gauges) -> None:
        self.router = router
        profile = router.profile
        (_, self.wq), (_, self.wk) = profile.scorers[:2]
        self.sparse = profile.scorers[2:]
        self.picker = profile.picker
        self.gauges = gauges
        self.prefix = router.prefix
        # Only prefix scorers after the fused terms, fed by the approximate index: a request
        # without content scores 0 on all of them.
        self.prefix_only = router.prefix is not None and not router.precise and all(
            type(s) is PrefixCacheScorer for s, _ in self.sparse)

    @classmethod
    def of(cls, router, gauges) -> "FastCycle | None":
        """The fast cycle of ``router``'s profile over ``gauges`` (kept incrementally), or None
        where the general one must run."""
        profile, picker = router.profile, router.profile.picker
        if router.fuses_queue_kv and not profile.filters \
                and all(hasattr(s, "sparse") for s, _ in profile.scorers[2:]) \
                and type(picker) is MaxScorePicker and picker.max_endpoints == 1 \
                and router.latency is None and not router.track_tokens and not router.post:
            return cls(router, gauges)
        return None

    def choose(self, view, req) -> int:
        """The endpoint picked for ``req`` (a local index), as the general cycle picks it."""
        router, gauges, picker = self.router, self.gauges, self.picker
        wq, wk = self.wq, self.wk
        if self.prefix_only and getattr(req, "content", None) is None:
            router.cycle = NO_BLOCKS
            tied = gauges.best(view.kv_use, wq, wk)     # (recounts the reported replicas)
            return tied[0] if len(tied) == 1 else picker.one_of(tied)
        cycle = router.produce(view, req, None)
        router.cycle = cycle
        sparse = [(scorer, w) for scorer, w in self.sparse if not scorer.zero(cycle)]
        if not sparse:
            i = picker.one_of(gauges.best(view.kv_use, wq, wk))
        else:
            # As the general cycle: the fused terms, the sparse scores added where above 0.
            totals = gauges.fused_terms(gauges.waiting(copy=False), view.kv_use, wq, wk)
            for scorer, w in sparse:
                for j, v in scorer.sparse(cycle).items():
                    totals[j] = totals[j] + v * w
            i = picker.pick(router.candidates, totals)[0]
        if self.prefix is not None:
            self.prefix.dispatched(cycle["hashes"], view.replicas[i])
        return i
