"""llm-d's affinity scorers: ``no-hit-lru-scorer``, ``session-affinity-scorer``,
``lora-affinity-scorer``.

Formulas from ``pkg/epp/framework/plugins/scheduling/scorer/{nohitlru,sessionaffinity,
loraaffinity}`` of llm-d/llm-d-inference-scheduler (commit 520af47896e5f06e43d09aca281a1149187b0ffd).
Scorers that remember where requests went implement ``pre_request(key, cycle, req)``, which the
router calls when the request is dispatched (Go's PreRequest); ``cycle["keys"]`` are the
candidates' endpoint keys (``id`` of the replica object, llm-d's pod name).
"""

from __future__ import annotations

from collections import OrderedDict

from simsched.cluster.epp.plugins import Plugin, _float_param, _int_param


class NoHitLRUScorer(Plugin):
    """``no-hit-lru-scorer``: for a cold request (no endpoint matches any prefix block) spread
    load by recency: endpoints never used for a cold request first (in candidate order), then
    the used ones from least to most recently used, the r-th scoring 1 - r / (n - 1); a warm
    request scores 0.5 everywhere. The endpoint a cold request is dispatched to moves to the
    front of an LRU of ``lruSize`` endpoints (default 1024). ``prefixPluginType`` and
    ``prefixPluginName`` name the prefix plugin whose match info it reads (accepted; simsched
    has one prefix producer)."""

    TYPE, KIND, CONSUMES = "no-hit-lru-scorer", "scorer", ("prefix",)
    PARAMETERS = {"prefixPluginType": "", "prefixPluginName": "", "lruSize": 1024}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        size = _int_param(self.TYPE, "lruSize", self.params["lruSize"])
        self.lru_size = size if size > 0 else 1024
        self.lru: OrderedDict = OrderedDict()       # oldest first, as golang-lru's Keys()

    def score(self, m, req, cycle, cands) -> list[float]:
        match, _ = cycle.get("prefix", ({}, 0))
        if any(match.get(i, 0) > 0 for i in cands):
            cycle["cold"] = False
            return [0.5] * len(cands)
        cycle["cold"] = True
        n = len(cands)
        if n == 1:
            return [1.0]
        keys = cycle["keys"]
        position = {k: p for p, k in enumerate(self.lru)}
        never = sum(1 for i in cands if keys[i] not in position)
        scores, fresh = [], 0
        for i in cands:
            p = position.get(keys[i])
            if p is None:
                rank, fresh = fresh, fresh + 1
            else:
                rank = never + p
            scores.append(max(0.0, 1.0 - rank / (n - 1)))
        return scores

    def pre_request(self, key, cycle, req) -> None:
        """A cold request went to endpoint ``key``: it becomes the most recently used."""
        if not cycle.get("cold"):
            return
        lru = self.lru
        if key in lru:
            lru.move_to_end(key)
        else:
            lru[key] = None
            if len(lru) > self.lru_size:
                lru.popitem(last=False)


class SessionAffinityScorer(Plugin):
    """``session-affinity-scorer``: 1 for the endpoint that served the session's last request
    (llm-d returns it in the ``x-session-token`` header at the response's end; simsched records
    it at dispatch, since a session's next turn arrives after the last one ended), 0 elsewhere
    and for requests without a session."""

    TYPE, KIND = "session-affinity-scorer", "scorer"

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        self.home: dict = {}

    def score(self, m, req, cycle, cands) -> list[float]:
        home = self.home.get(getattr(req, "session_id", -1))
        keys = cycle["keys"]
        return [1.0 if keys[i] == home else 0.0 for i in cands]

    def pre_request(self, key, cycle, req) -> None:
        """Remember the endpoint serving the request's session."""
        session = getattr(req, "session_id", -1)
        if session >= 0:
            self.home[session] = key


class LoRAAffinityScorer(Plugin):
    """``lora-affinity-scorer``: 1 where the request's adapter is active, 0.8 where active +
    waiting adapters leave a free slot (below ``max_loras``), 0.6 where it is waiting, else 0.
    ``m.lora`` is per endpoint ``(active, waiting, max_loras)``: simsched counts as active the
    adapters resident on the replica's GPU and reports no waiting ones (vLLM reports the
    adapters of running and waiting requests). A base-model request is never "active" (vLLM
    lists adapters only), as in llm-d."""

    TYPE, KIND, CONSUMES = "lora-affinity-scorer", "scorer", ("lora",)

    def score(self, m, req, cycle, cands) -> list[float]:
        target = getattr(req, "adapter", None)
        out = []
        for i in cands:
            active, waiting, most = m.lora[i]
            if target in active:
                out.append(1.0)
            elif len(active) + len(waiting) < most:
                out.append(0.8)
            elif target in waiting:
                out.append(0.6)
            else:
                out.append(0.0)
        return out


class PrefixCacheAffinityFilter(Plugin):
    """``prefix-cache-affinity-filter``: keep the "sticky" endpoints, whose prefix match ratio
    is at least ``affinityThreshold`` (default 0.8; <= 0 disables the filter), unless none is,
    or with probability ``explorationProbability`` (default 0.01, drawn from the run's rng), or
    when the best sticky endpoint's predicted TTFT exceeds the best other's by more than
    ``maxTTFTPenaltyMs`` (default 5000). simsched has no latency predictor yet: ``m.ttft`` is
    None in runs, and that gate never opens (as in Go without predictions)."""

    TYPE, KIND, CONSUMES = "prefix-cache-affinity-filter", "filter", ("prefix",)
    PARAMETERS = {"affinityThreshold": 0.8, "explorationProbability": 0.01,
                  "maxTTFTPenaltyMs": 5000.0}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        p, t = self.params, self.TYPE
        self.threshold = _float_param(t, "affinityThreshold", p["affinityThreshold"])
        self.explore = _float_param(t, "explorationProbability", p["explorationProbability"])
        self.penalty = _float_param(t, "maxTTFTPenaltyMs", p["maxTTFTPenaltyMs"])
        if self.threshold > 1.0:
            raise ValueError(f"{t}: affinityThreshold must be <= 1.0, got {self.threshold}")
        if not 0.0 <= self.explore <= 1.0:
            raise ValueError(f"{t}: explorationProbability must be in [0, 1], got {self.explore}")
        if self.penalty < 0:
            raise ValueError(f"{t}: maxTTFTPenaltyMs must be >= 0, got {self.penalty}")
        self.draw = None        # set by the router: a uniform [0, 1) draw from the run's rng

    def filter(self, m, req, cycle, cands) -> list[int]:
        if len(cands) <= 1 or self.threshold <= 0:
            return cands
        if self.explore > 0 and self.draw() < self.explore:
            return cands
        match, total = cycle.get("prefix", ({}, 0))
        ratio = (lambda i: match.get(i, 0) / total) if total else (lambda i: 0.0)
        sticky = [i for i in cands if ratio(i) >= self.threshold]
        if not sticky:
            return cands
        ttft = getattr(m, "ttft", None)
        if self.penalty > 0 and ttft is not None and len(sticky) < len(cands):
            others = [i for i in cands if ratio(i) < self.threshold]
            if min(ttft[i] for i in sticky) - min(ttft[i] for i in others) > self.penalty:
                return cands
        return sticky


AFFINITY = (NoHitLRUScorer, SessionAffinityScorer, LoRAAffinityScorer,
            PrefixCacheAffinityFilter)
