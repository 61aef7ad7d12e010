"""llm-d's saturation detectors in their scheduling role: filters that drop saturated endpoints.

``utilization-detector`` and ``concurrency-detector`` (``pkg/epp/framework/plugins/flowcontrol/
saturationdetector/{utilization,concurrency}`` of llm-d/llm-d-inference-scheduler, commit
520af47896e5f06e43d09aca281a1149187b0ffd). Their other role, the pool's saturation that admission
control reads, is in :mod:`simsched.cluster.epp.admission`.
"""

from __future__ import annotations

import re

from simsched.cluster.epp.admission import concurrency_saturation, utilization_saturation
from simsched.cluster.epp.plugins import Plugin, _float_param, _int_param

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(plugin: str, name: str, text) -> float:
    """Seconds of a Go duration string (``"200ms"``, ``"1m30s"``); a bad one names the field."""
    if not isinstance(text, str) or not text or _DURATION.sub("", text) != "":
        raise ValueError(f"{plugin} parameter {name} must be a Go duration such as '200ms', "
                         f"got {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(text))


class UtilizationDetector(Plugin):
    """``utilization-detector`` as a filter: keep endpoints with fresh metrics whose waiting
    queue is under ``queueDepthThreshold`` x (1 + ``headroom``) and KV use under
    ``kvCacheUtilThreshold`` x (1 + ``headroom``); if none is kept, keep them all (fail open).
    Metrics older than ``metricsStalenessThreshold`` (default 200 ms) are stale: simsched's
    metrics are as old as the last scrape (``cluster.refresh_interval``; exact state is never
    stale)."""

    TYPE, KIND, CONSUMES = "utilization-detector", "filter", ("waiting", "kv_use", "age")
    PARAMETERS = {"queueDepthThreshold": 5, "kvCacheUtilThreshold": 0.8,
                  "metricsStalenessThreshold": "200ms", "headroom": 0.0}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        p, t = self.params, self.TYPE
        q = _int_param(t, "queueDepthThreshold", p["queueDepthThreshold"])
        kv = _float_param(t, "kvCacheUtilThreshold", p["kvCacheUtilThreshold"])
        head = _float_param(t, "headroom", p["headroom"])
        stale = go_duration(t, "metricsStalenessThreshold", p["metricsStalenessThreshold"])
        if q <= 0:
            raise ValueError(f"{t}: queueDepthThreshold must be strictly positive, got {q}")
        if not 0.0 < kv <= 1.0:
            raise ValueError(f"{t}: kvCacheUtilThreshold must be in (0.0, 1.0], got {kv}")
        if stale <= 0:
            raise ValueError(f"{t}: metricsStalenessThreshold must be strictly positive")
        if head < 0:
            raise ValueError(f"{t}: headroom must be a non-negative value, got {head}")
        self.queue_limit = q * (1.0 + head)
        self.kv_limit = kv * (1.0 + head)
        self.queue_threshold, self.kv_threshold = float(q), kv
        self.staleness = stale

    def saturation(self, m, cands) -> float:
        """The pool's saturation (admission's input; :mod:`simsched.cluster.epp.admission`)."""
        return utilization_saturation(self, m, cands)

    def filter(self, m, req, cycle, cands) -> list[int]:
        waiting, kv, age = m.waiting, m.kv_use, m.age
        ql, kl, stale = self.queue_limit, self.kv_limit, self.staleness
        kept = [i for i in cands if age[i] <= stale and waiting[i] < ql and kv[i] < kl]
        return kept if kept else cands


class ConcurrencyDetector(Plugin):
    """``concurrency-detector`` as a filter: keep endpoints whose in-flight requests (or, with
    ``concurrencyMode: tokens``, in-flight tokens) are under ``maxConcurrency`` (or
    ``maxTokenConcurrency``) x (1 + ``headroom``). Unlike the utilization detector it does not
    fail open: it may keep none (the profile then fails open, see the router)."""

    TYPE, KIND = "concurrency-detector", "filter"
    PARAMETERS = {"concurrencyMode": "requests", "maxConcurrency": 100,
                  "maxTokenConcurrency": 1000000, "headroom": 0.0}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        p, t = self.params, self.TYPE
        mode = p["concurrencyMode"]
        if mode not in ("requests", "tokens"):
            raise ValueError(f"{t} parameter concurrencyMode must be 'requests' or 'tokens', "
                             f"got {mode!r}")
        most = _int_param(t, "maxConcurrency", p["maxConcurrency"])
        tokens = _int_param(t, "maxTokenConcurrency", p["maxTokenConcurrency"])
        head = _float_param(t, "headroom", p["headroom"])
        if most <= 0 or tokens <= 0:
            raise ValueError(f"{t}: maxConcurrency and maxTokenConcurrency must be > 0")
        if head < 0:
            raise ValueError(f"{t}: headroom must be a non-negative value, got {head}")
        self.mode = mode
        self.CONSUMES = ("inflight_tokens",) if mode == "tokens" else ("inflight_requests",)
        self.limit = int((tokens if mode == "tokens" else most) * (1.0 + head))
        self.max_requests, self.max_tokens = most, tokens

    def saturation(self, m, cands) -> float:
        """The pool's saturation (admission's input; :mod:`simsched.cluster.epp.admission`)."""
        return concurrency_saturation(self, m, cands)

    def filter(self, m, req, cycle, cands) -> list[int]:
        load = m.inflight_tokens if self.mode == "tokens" else m.inflight_requests
        limit = self.limit
        return [i for i in cands if load[i] < limit]


SATURATION = (UtilizationDetector, ConcurrencyDetector)
