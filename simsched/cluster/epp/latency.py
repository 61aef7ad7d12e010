"""llm-d's predicted-latency routing: the latency producer, the SLO headroom tier filter, the
latency scorer and the latency-SLO admitter.

As ``pkg/epp/framework/plugins/{requestcontrol/dataproducer/predictedlatency,
scheduling/filter/sloheadroomtier, scheduling/scorer/latency, requestcontrol/admitter/latencyslo}``
of llm-d/llm-d-inference-scheduler (commit 520af47896e5f06e43d09aca281a1149187b0ffd). The producer
predicts each endpoint's TTFT (and, in streaming mode, TPOT) in ms from the seven features of
:mod:`simsched.cluster.epp.latency_model` and compares them with the request's SLOs (llm-d's
``x-slo-ttft-ms`` / ``x-slo-tpot-ms`` headers: the router options ``slo_ttft_ms`` /
``slo_tpot_ms``; none: 0, so every headroom is negative). It learns from the run's own requests,
the features each was dispatched with against its observed latency: non-streaming (llm-d's
default), the end-to-end latency as "TTFT", at the request's end; streaming, its TTFT at its
first token and its mean TPOT at its end.
"""

from __future__ import annotations

import math

from simsched.cluster.epp.latency_model import LatencyModel
from simsched.cluster.epp.plugins import Plugin, _float_param

EPS = 1e-9      # Go's eps
W_MAX = 100     # Go's wMax (minWeight 0)


class Prediction:
    """One endpoint's ``LatencyPredictionInfo``."""

    __slots__ = ("ttft", "tpot", "ttft_valid", "tpot_valid", "ttft_headroom", "tpot_headroom",
                 "dispatched")

    def __init__(self, ttft_valid, tpot_valid, ttft_headroom, tpot_headroom, ttft, tpot,
                 dispatched=0) -> None:
        self.ttft_valid, self.tpot_valid = ttft_valid, tpot_valid
        self.ttft_headroom, self.tpot_headroom = ttft_headroom, tpot_headroom
        self.ttft, self.tpot, self.dispatched = ttft, tpot, dispatched

    @property
    def valid(self) -> bool:
        return self.ttft_valid and self.tpot_valid


def _ms(seconds: float) -> float:
    """Whole milliseconds, truncated (Go's Duration.Milliseconds)."""
    return float(math.trunc(seconds * 1000.0))


class PredictedLatencyProducer(Plugin):
    """``predicted-latency-producer``: per-endpoint predictions at each request (``produce``),
    observations at each request's end (``finished``). ``streamingMode`` (false): TTFT and TPOT
    models, else one model of the end-to-end latency with TPOT neutralised (valid, headroom 0);
    ``sloBufferFactor`` (1) multiplies the TPOT SLO; ``endpointRoleLabel``: endpoints whose
    label is ``prefill`` have TPOT neutralised; ``predictInProduce`` false: train only.
    ``samplingMean``, ``maxDecodeTokenSamplesForPrediction`` and ``contextTTL`` are accepted
    (simsched observes each request's mean TPOT exactly, and keeps contexts until the end)."""

    TYPE, KIND = "predicted-latency-producer", "producer"
    CONSUMES = ("waiting", "running", "kv_use", "prefix", "inflight_requests")
    PARAMETERS = {"samplingMean": 1000.0, "maxDecodeTokenSamplesForPrediction": 0,
                  "sloBufferFactor": 1.0, "contextTTL": "5m", "streamingMode": False,
                  "endpointRoleLabel": "", "predictInProduce": True}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        p, t = self.params, self.TYPE
        self.buffer = _float_param(t, "sloBufferFactor", p["sloBufferFactor"])
        for flag in ("streamingMode", "predictInProduce"):
            if not isinstance(p[flag], bool):
                raise ValueError(f"{t} parameter {flag} must be true or false, got {p[flag]!r}")
        if not isinstance(p["endpointRoleLabel"], str):
            raise ValueError(f"{t} parameter endpointRoleLabel must be a string")
        _float_param(t, "samplingMean", p["samplingMean"])
        self.streaming, self.predict = p["streamingMode"], p["predictInProduce"]
        self.role_label = p["endpointRoleLabel"]
        self.slo = (0.0, 0.0)       # (TTFT, TPOT) SLOs in ms, set by the router
        self.configure({})

    def configure(self, model: dict) -> None:
        """New TTFT and TPOT models with the ``latency_model`` options ``model``."""
        self.ttft_model, self.tpot_model = LatencyModel(**model), LatencyModel(**model)
        self.prefill_tokens: dict = {}      # endpoint key -> prompt tokens dispatched, not ended
        self.contexts: dict = {}            # request id -> (key, features, dispatched at)

    def _row(self, m, req, cycle, i, key, generated: int) -> tuple:
        match, total = cycle.get("prefix", ({}, 0))
        return (m.kv_use[i], req.num_prompt_tokens, m.waiting[i], m.running[i], generated,
                match.get(i, 0) / total if total else 0.0, self.prefill_tokens.get(key, 0))

    def produce(self, m, req, cycle, keys):
        """Each endpoint's :class:`Prediction` (None for all: no model yet, or training only)."""
        if not self.predict or not self.ttft_model.ready \
                or (self.streaming and not self.tpot_model.ready):
            return None
        rows = [self._row(m, req, cycle, i, k, 1) for i, k in enumerate(keys)]
        ttfts = self.ttft_model.predict(rows)
        tpots = self.tpot_model.predict(rows) if self.streaming else [0.0] * len(rows)
        ttft_slo, tpot_slo = self.slo
        labels, role = m.labels, self.role_label
        out = []
        for i, (ttft, tpot) in enumerate(zip(ttfts, tpots)):
            tpot_ok, headroom = True, 0.0
            prefill = bool(role) and labels is not None and labels[i].get(role) == "prefill"
            if self.streaming and not prefill:
                buffered = tpot_slo * self.buffer
                tpot_ok, headroom = tpot < buffered, buffered - tpot
            out.append(Prediction(ttft < ttft_slo, tpot_ok, ttft_slo - ttft, headroom, ttft,
                                  tpot, m.inflight_requests[i]))
        return out

    def dispatched(self, m, req, cycle, i: int, key, now: float) -> None:
        """``req`` went to local endpoint ``i`` (``key``) at ``now``: keep its features."""
        self.prefill_tokens[key] = self.prefill_tokens.get(key, 0) + req.num_prompt_tokens
        self.contexts[req.id] = [key, self._row(m, req, cycle, i, key, 0), now, None]

    def first_token(self, req) -> None:
        """``req``'s first token (streaming mode): its TTFT trains the TTFT model. (A request
        aborted before its first token has none: nothing to learn.)"""
        ctx = self.contexts.get(req.id)
        if ctx is not None and ctx[3] is None and req.first_token_at == req.first_token_at:
            ctx[3] = ttft = _ms(req.first_token_at - ctx[2])
            if ttft > 0:
                self.ttft_model.add(ctx[1], ttft)

    def finished(self, req) -> None:
        """``req`` ended: its observations train the models (an aborted request, with no
        finish time, teaches nothing)."""
        ctx = self.contexts.pop(req.id, None)
        if ctx is None:
            return
        key, row, at, ttft = ctx
        self.prefill_tokens[key] -= req.num_prompt_tokens
        if req.finished_at != req.finished_at:      # NaN: aborted
            return
        if self.streaming:
            if ttft is None:
                self.contexts[req.id] = ctx
                self.first_token(req)
                ttft = self.contexts.pop(req.id)[3]
            n = req.num_generated
            if ttft is not None and ttft > 0 and n > 1:
                tpot = (_ms(req.finished_at - at) - ttft) / (n - 1)
                if tpot > 0:        # (Go: the TPOT entry has no prefix score)
                    self.tpot_model.add(row[:5] + (0.0,) + row[6:], tpot)
        else:
            e2e = _ms(req.finished_at - at)
            if e2e > 0:
                self.ttft_model.add(row, e2e)


class SLOHeadroomTierFilter(Plugin):
    """``slo-headroom-tier-filter``: endpoints meeting both SLOs (headrooms >= 0) are the
    positive tier, the rest (and those without a prediction) the negative; both present: the
    negative tier with probability ``epsilonExploreNeg`` (0.01, the run's rng), else the
    positive; no predictions: all."""

    TYPE, KIND, CONSUMES = "slo-headroom-tier-filter", "filter", ("latency",)
    PARAMETERS = {"epsilonExploreNeg": 0.01}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        self.epsilon = _float_param(self.TYPE, "epsilonExploreNeg",
                                    self.params["epsilonExploreNeg"])
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"{self.TYPE}: epsilonExploreNeg must be in [0, 1], got "
                             f"{self.epsilon}")
        self.draw = None

    def filter(self, m, req, cycle, cands) -> list[int]:
        preds = m.latency
        if len(cands) <= 1 or preds is None:
            return cands
        positive, negative, none = [], [], []
        for i in cands:
            p = preds[i]
            if p is None:
                none.append(i)
            elif p.ttft_headroom >= 0 and p.tpot_headroom >= 0:
                positive.append(i)
            else:
                negative.append(i)
        if not positive and not negative:
            return cands
        negative += none
        if positive and negative:
            return negative if self.draw() < self.epsilon else positive
        return positive or negative


class LatencyScorer(Plugin):
    """``latency-scorer``: scores by SLO headroom as llm-d's (positive tier only if any; else
    idle endpoints; else the least severe deficit bucket), |headroom| min-max normalised and
    blended ``ttftWeight`` 0.8 / ``tpotWeight`` 0.2, ``headroomSelectionStrategy`` least
    (closest to the SLO) or most; in steps of 1/100. Without predictions: the composite of
    free KV, relative queue and prefix score (weights ``composite*Weight``, 1 each)."""

    TYPE, KIND = "latency-scorer", "scorer"
    CONSUMES = ("latency", "waiting", "kv_use", "prefix")
    PARAMETERS = {"ttftWeight": 0.8, "tpotWeight": 0.2, "headroomSelectionStrategy": "least",
                  "compositeKVWeight": 1.0, "compositeQueueWeight": 1.0,
                  "compositePrefixWeight": 1.0}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        p, t = self.params, self.TYPE
        for k in ("ttftWeight", "tpotWeight", "compositeKVWeight", "compositeQueueWeight",
                  "compositePrefixWeight"):
            _float_param(t, k, p[k])
        if p["headroomSelectionStrategy"] not in ("least", "most"):
            raise ValueError(f"{t} parameter headroomSelectionStrategy must be least or most, "
                             f"got {p['headroomSelectionStrategy']!r}")
        total = p["ttftWeight"] + p["tpotWeight"]
        self.alpha, self.beta = ((p["ttftWeight"] / total, p["tpotWeight"] / total)
                                 if total > 0 else (1.0, 0.0))
        self.most = p["headroomSelectionStrategy"] == "most"

    def score(self, m, req, cycle, cands) -> list[float]:
        preds = m.latency
        if preds is None or all(preds[i] is None for i in cands):
            return self._composite(m, cycle, cands)
        scores = dict.fromkeys(cands, 0.0)
        positive, negative = [], []
        for i in cands:
            p = preds[i]
            (negative if p is not None and (p.ttft_headroom < 0 or p.tpot_headroom < 0)
             else positive).append(i)
        if positive:
            self._bucket(preds, positive, scores, False)
        else:
            idle = [i for i in negative if preds[i].dispatched == 0]
            if idle:
                self._bucket(preds, idle, scores, True)
            else:
                tpot_only = [i for i in negative if preds[i].ttft_headroom >= 0]
                ttft_only = [i for i in negative if preds[i].tpot_headroom >= 0]
                both = [i for i in negative if preds[i].ttft_headroom < 0
                        and preds[i].tpot_headroom < 0]
                self._bucket(preds, tpot_only or ttft_only or both, scores, True)
        return [scores[i] for i in cands]

    def _bucket(self, preds, group, scores, force_least: bool) -> None:
        heads = [(abs(preds[i].ttft_headroom), abs(preds[i].tpot_headroom))
                 if preds[i] is not None else (0.0, 0.0) for i in group]
        lo_t, hi_t = min(h[0] for h in heads), max(h[0] for h in heads)
        lo_p, hi_p = min(h[1] for h in heads), max(h[1] for h in heads)
        rt, rp = hi_t - lo_t, hi_p - lo_p
        alpha, beta = self.alpha, self.beta
        if rt <= EPS and rp > EPS:
            alpha, beta = 0.0, 1.0
        elif rp <= EPS and rt > EPS:
            alpha, beta = 1.0, 0.0
        most = self.most and not force_least
        for i, (ht, hp) in zip(group, heads):
            combined = alpha * ((ht - lo_t) / rt if rt > EPS else 0.5) \
                + beta * ((hp - lo_p) / rp if rp > EPS else 0.5)
            w = int((combined if most else 1.0 - combined) * W_MAX) + 1
            scores[i] = w / W_MAX

    def _composite(self, m, cycle, cands) -> list[float]:
        p = self.params
        wkv, wq, wpre = p["compositeKVWeight"], p["compositeQueueWeight"], \
            p["compositePrefixWeight"]
        total = wkv + wq + wpre
        if total <= 0:
            wkv, wq, wpre, total = 1.0, 0.0, 0.0, 1.0
        wkv, wq, wpre = wkv / total, wq / total, wpre / total
        top = max(0, max(m.waiting[i] for i in cands))
        match, blocks = cycle.get("prefix", ({}, 0))
        out = []
        for i in cands:
            rel = (top - m.waiting[i]) / top if top > 0 else 1.0
            prefix = match.get(i, 0) / blocks if blocks else 0.0
            c = wkv * (1.0 - m.kv_use[i]) + wq * rel + wpre * prefix
            out.append(_go_round(W_MAX * c) / W_MAX)
        return out


def _go_round(x: float) -> int:
    """Go's math.Round: half away from zero."""
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


class LatencySLOAdmitter(Plugin):
    """``latency-slo-admitter``: a sheddable request (priority < 0) with an SLO is rejected when
    predictions exist and no endpoint is valid (meets its SLOs), idle (no running requests) or
    cold (KV use under 2 %)."""

    TYPE, KIND, CONSUMES = "latency-slo-admitter", "admitter", ("latency", "kv_use", "running")

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        self.slo = (0.0, 0.0)       # set by the router

    def admit(self, m, req, cands) -> str | None:
        if req.priority >= 0 or not (self.slo[0] > 0 or self.slo[1] > 0):
            return None
        preds = m.latency
        if preds is None or all(preds[i] is None for i in cands):
            return None
        for i in cands:
            if m.kv_use[i] < 0.02 or m.running[i] == 0 \
                    or (preds[i] is not None and preds[i].valid):
                return None
        return f"{self.TYPE}: no valid endpoint available to serve the request"


LATENCY = (PredictedLatencyProducer, SLOHeadroomTierFilter, LatencyScorer, LatencySLOAdmitter)
