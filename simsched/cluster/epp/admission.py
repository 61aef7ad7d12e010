"""llm-d's admission: the saturation detectors' pool saturation and the admitters.

Sources: ``pkg/epp/requestcontrol/admission.go`` (legacy admission control),
``pkg/epp/framework/plugins/flowcontrol/saturationdetector/{utilization,concurrency}`` (their
``Saturation``) and ``pkg/epp/framework/plugins/requestcontrol/admitter/probabilisticadmitter``
of llm-d/llm-d-inference-scheduler (commit 520af47896e5f06e43d09aca281a1149187b0ffd).

A request is sheddable when its priority is negative. Without flow control (its feature gate
off, llm-d's default) the EPP drops a sheddable request when the pool's saturation, as the
configured ``saturationDetector`` (default: the utilization detector) computes it, is at least
1; admitter plugins (``probabilistic-admitter``) may drop it before that. Requests of priority
0 or more are always admitted. A dropped request is shed: rejected at arrival with the reason
(``shed: ...``) in the results, as simsched's own admission control sheds.
"""

from __future__ import annotations

from simsched.cluster.epp.plugins import Plugin, _float_param, _int_param


def utilization_saturation(detector, m, cands) -> float:
    """The utilization detector's pool saturation: the mean over endpoints of max(waiting /
    queueDepthThreshold, KV use / kvCacheUtilThreshold), a stale endpoint counting 1 (no
    endpoint: 1). The thresholds are without headroom, as in Go."""
    if not cands:
        return 1.0
    q, kv_t = detector.queue_threshold, detector.kv_threshold
    waiting, kv, age, stale = m.waiting, m.kv_use, m.age, detector.staleness
    total = 0.0
    for i in cands:
        if age[i] > stale:
            total += 1.0
        else:
            total += max(waiting[i] / q, kv[i] / kv_t)
    return total / len(cands)


def concurrency_saturation(detector, m, cands) -> float:
    """The concurrency detector's pool saturation: in-flight requests (tokens) over the pool's
    capacity, ``maxConcurrency`` (``maxTokenConcurrency``) per endpoint (none: 1)."""
    if not cands:
        return 1.0
    load = m.inflight_tokens if detector.mode == "tokens" else m.inflight_requests
    per = detector.max_tokens if detector.mode == "tokens" else detector.max_requests
    return sum(load[i] for i in cands) / float(per * len(cands))


class ProbabilisticAdmitter(Plugin):
    """``probabilistic-admitter``: drop a sheddable request with probability
    min(saturation^``power`` x ``k``, 1), saturation being the mean over endpoints of
    max(waiting / ``queueDepthThreshold``, KV use / ``kvCacheUtilThreshold``); the uniform draw
    comes from the run's generator."""

    TYPE, KIND, CONSUMES = "probabilistic-admitter", "admitter", ("waiting", "kv_use")
    PARAMETERS = {"queueDepthThreshold": 5, "kvCacheUtilThreshold": 0.8, "power": 5.0,
                  "k": 300.0}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        p, t = self.params, self.TYPE
        self.queue_threshold = float(_int_param(t, "queueDepthThreshold",
                                                p["queueDepthThreshold"]))
        self.kv_threshold = _float_param(t, "kvCacheUtilThreshold", p["kvCacheUtilThreshold"])
        self.power = _float_param(t, "power", p["power"])
        self.k = _float_param(t, "k", p["k"])
        for key, value in (("queueDepthThreshold", self.queue_threshold),
                           ("kvCacheUtilThreshold", self.kv_threshold), ("power", self.power),
                           ("k", self.k)):
            if value <= 0:
                raise ValueError(f"plugin '{t}': {key} must be > 0, got {value:g}")
        self.draw = None        # set by the router: a uniform [0, 1) draw from the run's rng

    def saturation(self, m, cands) -> float:
        """Mean of max(queue ratio, KV ratio); an endpoint without metrics (None) counts 1."""
        total = 0.0
        for i in cands:
            w = m.waiting[i]
            if w is None:
                total += 1.0
            else:
                total += max(w / self.queue_threshold, m.kv_use[i] / self.kv_threshold)
        return total / len(cands)

    def admit(self, m, req, cands) -> str | None:
        """None to admit ``req``; else the reason it is dropped."""
        if req.priority >= 0 or not cands:
            return None
        sat = self.saturation(m, cands)
        prob = min(sat ** self.power * self.k, 1.0)
        if self.draw() < prob:
            return f"probabilistic-admitter: rejected, saturation={sat:.3f} prob={prob:.2f}"
        return None


ADMISSION = (ProbabilisticAdmitter,)
