"""llm-d's scheduling plugins: the load scorers and the pickers.

Each class carries the real plugin's ``TYPE`` (its name in an ``EndpointPickerConfig``) and
``PARAMETERS`` (camelCase, as in the YAML, with the Go factories' defaults); the formulas follow
``pkg/epp/framework/plugins/scheduling`` of llm-d/llm-d-inference-scheduler (commit
520af47896e5f06e43d09aca281a1149187b0ffd). A scorer's :meth:`score` returns one score per
candidate replica, from a :class:`Metrics` of per-replica figures; the profile clamps each to
[0, 1] and adds them with the profile's weights (:mod:`simsched.cluster.epp.profile`).
"""

from __future__ import annotations

import math


class Metrics:
    """The per-endpoint figures the plugins read, indexed by replica.

    ``waiting`` and ``running`` are vLLM's ``num_requests_waiting`` / ``num_requests_running``
    gauges, ``kv_use`` its KV-cache usage (0-1), all as last scraped; ``inflight_requests`` and
    ``inflight_tokens`` are the inflight-load-producer's counters (updated at dispatch and at the
    response's end, never stale); ``lora`` is per endpoint ``(active adapters, waiting
    adapters, max_loras)``; ``age`` the seconds since each endpoint's metrics were scraped;
    ``labels`` each endpoint's labels (a mapping); ``latency`` each endpoint's predictions
    (:class:`~simsched.cluster.epp.latency.Prediction` or None) and ``ttft`` their TTFTs in ms
    (None: no predictions, from no latency producer or no model yet). A figure no plugin
    consumes may be None.
    """

    __slots__ = ("waiting", "running", "kv_use", "inflight_requests", "inflight_tokens", "lora",
                 "age", "labels", "ttft", "latency")

    def __init__(self, waiting=None, running=None, kv_use=None, inflight_requests=None,
                 inflight_tokens=None, lora=None, age=None, labels=None, ttft=None,
                 latency=None) -> None:
        self.lora = lora
        self.ttft = ttft
        self.latency = latency
        self.labels = labels
        self.age = age
        self.waiting = waiting
        self.running = running
        self.kv_use = kv_use
        self.inflight_requests = inflight_requests
        self.inflight_tokens = inflight_tokens


class Plugin:
    """Base of every plugin: ``TYPE``, ``KIND`` (scorer, filter, picker, producer, handler),
    ``PARAMETERS`` (name -> default) and ``CONSUMES`` (the :class:`Metrics` figures read)."""

    TYPE = ""
    KIND = ""
    PARAMETERS: dict = {}
    CONSUMES: tuple = ()
    BOUNDED = False     # a scorer whose scores are always within [0, 1] (no clamp needed)

    def zero(self, cycle) -> bool:
        """Whether this scorer scores every endpoint 0 in this cycle (then skipped)."""
        return False

    def __init__(self, name: str = "", **params) -> None:
        self.name = name or self.TYPE
        values = dict(self.PARAMETERS)
        values.update(params)
        self.params = values


def _int_param(plugin: str, name: str, value, low: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        raise ValueError(f"{plugin} parameter {name} must be an integer"
                         f"{f' >= {low}' if low is not None else ''}, got {value!r}")
    return value


def _float_param(plugin: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{plugin} parameter {name} must be a finite number, got {value!r}")
    return float(value)


def _min_max(values, cands) -> list[float]:
    """(max - v) / (max - min) over the candidates; 1 for all when they are equal (queue- and
    running-requests-size-scorer)."""
    if len(cands) == len(values):       # every endpoint (no filter dropped one): C builtins
        low, high = min(values), max(values)
        if high == low:
            return [1.0] * len(cands)
        span = high - low
        return [(high - v) / span for v in values]
    low = high = values[cands[0]]
    for i in cands:
        v = values[i]
        if v < low:
            low = v
        elif v > high:
            high = v
    if high == low:
        return [1.0] * len(cands)
    span = high - low
    return [(high - values[i]) / span for i in cands]


class QueueScorer(Plugin):
    """``queue-scorer``: min-max of the waiting-queue length (shortest 1, longest 0)."""

    TYPE, KIND, CONSUMES = "queue-scorer", "scorer", ("waiting",)
    BOUNDED = True

    def score(self, m: Metrics, req, cycle, cands) -> list[float]:
        return _min_max(m.waiting, cands)


class RunningRequestsSizeScorer(Plugin):
    """``running-requests-size-scorer``: min-max of the running requests (fewest 1)."""

    TYPE, KIND, CONSUMES = "running-requests-size-scorer", "scorer", ("running",)
    BOUNDED = True

    def score(self, m: Metrics, req, cycle, cands) -> list[float]:
        return _min_max(m.running, cands)


class KVCacheUtilizationScorer(Plugin):
    """``kv-cache-utilization-scorer``: 1 - KV-cache usage."""

    TYPE, KIND, CONSUMES = "kv-cache-utilization-scorer", "scorer", ("kv_use",)
    BOUNDED = True

    def score(self, m: Metrics, req, cycle, cands) -> list[float]:
        kv = m.kv_use
        if len(cands) == len(kv):
            return [1.0 - k for k in kv]
        return [1.0 - kv[i] for i in cands]


class LoadAwareScorer(Plugin):
    """``load-aware-scorer``: 0.5 for an empty waiting queue, else 0.5 x (1 - min(waiting,
    threshold) / threshold); ``threshold`` (default 128; <= 0 falls back to it, as in Go)."""

    TYPE, KIND, CONSUMES = "load-aware-scorer", "scorer", ("waiting",)
    PARAMETERS = {"threshold": 128}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        t = _int_param(self.TYPE, "threshold", self.params["threshold"])
        self.threshold = float(t if t > 0 else 128)

    def score(self, m: Metrics, req, cycle, cands) -> list[float]:
        t, waiting = self.threshold, m.waiting
        return [0.5 if waiting[i] == 0 else 0.5 * (1.0 - min(waiting[i], t) / t) for i in cands]


class ActiveRequestScorer(Plugin):
    """``active-request-scorer``: in-flight requests; idle endpoints (count <= ``idleThreshold``)
    score 1, busy ones (max - count) / max x ``maxBusyScore``. Out-of-range parameters fall back
    to the defaults (0 and 1), as the Go constructor does; ``requestTimeout`` is deprecated and
    ignored there too."""

    TYPE, KIND, CONSUMES = "active-request-scorer", "scorer", ("inflight_requests",)
    PARAMETERS = {"idleThreshold": 0, "maxBusyScore": 1.0, "requestTimeout": ""}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        idle = _int_param(self.TYPE, "idleThreshold", self.params["idleThreshold"])
        busy = _float_param(self.TYPE, "maxBusyScore", self.params["maxBusyScore"])
        self.idle_threshold = idle if idle >= 0 else 0
        self.max_busy_score = busy if 0.0 <= busy <= 1.0 else 1.0

    def score(self, m: Metrics, req, cycle, cands) -> list[float]:
        counts = m.inflight_requests
        top = max(0, max(counts[i] for i in cands))
        idle, busy = self.idle_threshold, self.max_busy_score
        return [1.0 if counts[i] <= idle else (top - counts[i]) / top * busy for i in cands]


class TokenLoadScorer(Plugin):
    """``token-load-scorer``: 1 - min(in-flight tokens, ``queueThresholdTokens``) / threshold
    (default 4,194,304; <= 0 falls back to it); an endpoint with no tokens scores 1."""

    TYPE, KIND, CONSUMES = "token-load-scorer", "scorer", ("inflight_tokens",)
    PARAMETERS = {"queueThresholdTokens": 4194304}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        t = _int_param(self.TYPE, "queueThresholdTokens", self.params["queueThresholdTokens"])
        self.threshold = float(t if t > 0 else 4194304)

    def score(self, m: Metrics, req, cycle, cands) -> list[float]:
        t, tokens = self.threshold, m.inflight_tokens
        return [1.0 if tokens[i] <= 0 else 1.0 - min(tokens[i], t) / t for i in cands]


class _Picker(Plugin):
    KIND = "picker"
    PARAMETERS = {"maxNumOfEndpoints": 1}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        k = _int_param(self.TYPE, "maxNumOfEndpoints", self.params["maxNumOfEndpoints"])
        self.max_endpoints = k if k > 0 else 1      # (Go: an invalid value falls back to 1)
        self.draw = None        # set by the router: a uniform [0, 1) draw from the run's rng


class MaxScorePicker(_Picker):
    """``max-score-picker``: the highest weighted score; ties broken uniformly at random (Go
    shuffles, then sorts stably), or by the lowest replica index with the router's
    ``tie_break="index"`` (simsched only: to compare with ``weighted``)."""

    TYPE = "max-score-picker"
    random_ties = True

    def one_of(self, tied: list[int]) -> int:
        """The one endpoint picked among ``tied`` (equal best scores, in candidate order)."""
        if len(tied) == 1 or not self.random_ties:
            return tied[0]
        return tied[min(int(self.draw() * len(tied)), len(tied) - 1)]

    def pick(self, cands, scores) -> list[int]:
        """The picked replicas (``maxNumOfEndpoints`` of them at most), best first."""
        if self.max_endpoints == 1:
            best = max(scores)
            if scores.count(best) == 1:         # (in C: the common case, no tie)
                return [cands[scores.index(best)]]
            return [self.one_of([c for c, s in zip(cands, scores) if s == best])]
        order = list(zip(cands, scores))
        if self.random_ties:
            for j in range(len(order) - 1, 0, -1):      # Fisher-Yates, as Go's Shuffle
                k = min(int(self.draw() * (j + 1)), j)
                order[j], order[k] = order[k], order[j]
        order.sort(key=lambda cs: -cs[1])
        return [c for c, _ in order[:self.max_endpoints]]


class RandomPicker(_Picker):
    """``random-picker``: uniformly random endpoints."""

    TYPE = "random-picker"

    def pick(self, cands, scores) -> list[int]:
        """``maxNumOfEndpoints`` distinct random candidates."""
        pool = list(cands)
        out = []
        for _ in range(min(self.max_endpoints, len(pool))):
            j = min(int(self.draw() * len(pool)), len(pool) - 1)
            out.append(pool.pop(j))
        return out


class WeightedRandomPicker(_Picker):
    """``weighted-random-picker``: A-Res sampling, key = U^(1/score), the largest keys win (a
    candidate is picked with probability score / sum of scores); zero scores never, unless all
    are zero, when it picks uniformly (the Go picker's random fallback)."""

    TYPE = "weighted-random-picker"

    def pick(self, cands, scores) -> list[int]:
        """The picked replicas, largest key first."""
        if not any(s > 0 for s in scores):
            fallback = RandomPicker(maxNumOfEndpoints=self.max_endpoints)
            fallback.draw = self.draw
            return fallback.pick(cands, scores)
        keys = []
        for c, s in zip(cands, scores):
            if s <= 0:
                keys.append((0.0, c))
                continue
            u = self.draw() or 1e-10
            keys.append((u ** (1.0 / s), c))
        if self.max_endpoints == 1:
            return [max(keys, key=lambda kc: kc[0])[1]]
        keys.sort(key=lambda kc: -kc[0])
        return [c for _, c in keys[:self.max_endpoints]]


class SingleProfileHandler(Plugin):
    """``single-profile-handler``: run the one scheduling profile, its pick is the result."""

    TYPE, KIND = "single-profile-handler", "handler"


class InFlightLoadProducer(Plugin):
    """``inflight-load-producer``: per-endpoint in-flight requests and tokens, raised at dispatch
    and lowered at the response's end. Tokens per request are the Go SimpleTokenEstimator's:
    input + round(1.5 x input), input being the prompt's tokens (simsched knows them; Go
    estimates them from the body's size, 4 bytes a token)."""

    TYPE, KIND = "inflight-load-producer", "producer"

    @staticmethod
    def estimate(req) -> int:
        """The tokens a request holds while in flight."""
        n = max(1, req.num_prompt_tokens)
        return n + int(math.floor(n * 1.5 + 0.5))      # Go's math.Round: half away from zero


BUILTIN = (QueueScorer, RunningRequestsSizeScorer, KVCacheUtilizationScorer, LoadAwareScorer,
           ActiveRequestScorer, TokenLoadScorer, MaxScorePicker, RandomPicker,
           WeightedRandomPicker, SingleProfileHandler, InFlightLoadProducer)
