"""llm-d's predicted-latency routing: plugins against llm-d's Go tests, the online model, runs."""

import json
from pathlib import Path

import pytest

from simsched import SimConfig, simulate
from simsched.cluster.epp.affinity import PrefixCacheAffinityFilter
from simsched.cluster.epp.config import parse
from simsched.cluster.epp.latency import (LatencyScorer, LatencySLOAdmitter, Prediction,
                                          SLOHeadroomTierFilter)
from simsched.cluster.epp.latency_model import LatencyModel, model_options
from simsched.cluster.epp.plugins import Metrics

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "llm_d_latency.json").read_text())


class _Req:
    def __init__(self, priority=0):
        self.priority = priority


def _preds(endpoints):
    return [None if e["prediction"] is None else Prediction(*e["prediction"])
            for e in endpoints]


@pytest.mark.parametrize("case", FIXTURES["slo_headroom_tier_filter"]["cases"],
                         ids=lambda c: c["test"])
def test_slo_headroom_tier_filter_matches_go(case):
    f = SLOHeadroomTierFilter(epsilonExploreNeg=case["epsilon"])
    f.draw = lambda: 0.5
    eps = case["endpoints"]
    m = Metrics(latency=_preds(eps))
    if all(p is None for p in m.latency):
        m.latency = None            # simsched: no model yet gives no predictions at all
    kept = f.filter(m, None, {}, list(range(len(eps))))
    assert sorted(eps[i]["name"] for i in kept) == sorted(case["want"])


@pytest.mark.parametrize("case", FIXTURES["latency_scorer"]["cases"], ids=lambda c: c["test"])
def test_latency_scorer_matches_go_assertions(case):
    eps = case["endpoints"]
    preds = _preds(eps)
    m = Metrics(latency=None if all(p is None for p in preds) else preds,
                waiting=[e["waiting"] for e in eps], kv_use=[e["kv_use"] for e in eps])
    scores = LatencyScorer().score(m, None, {}, list(range(len(eps))))
    by = {e["name"]: s for e, s in zip(eps, scores)}
    for check in case["expect"]:
        if check[0] == "nonzero":
            assert by[check[1]] != 0
        elif check[0] == "zero":
            assert by[check[1]] == 0
        else:
            assert by[check[1]] > by[check[2]]


def test_latency_scorer_values_follow_go_formula():
    # |TTFT headroom| 100 / 30, |TPOT| 20 / 5: pod1 normalises to 1, pod2 to 0; "least" gives
    # w = int((1 - combined) * 100) + 1, so 1/100 and 101/100 (clamped to 1 by the profile).
    m = Metrics(latency=[Prediction(True, True, 100, 20, 50, 10), Prediction(True, True, 30, 5,
                                                                              120, 25)])
    assert LatencyScorer().score(m, None, {}, [0, 1]) == [0.01, 1.01]
    assert LatencyScorer(headroomSelectionStrategy="most").score(m, None, {}, [0, 1]) == [
        1.01, 0.01]
    # Composite: 1/3 free KV + 1/3 relative queue + 1/3 prefix, rounded to hundredths.
    m = Metrics(kv_use=[0.2, 0.8], waiting=[0, 5])
    assert LatencyScorer().score(m, None, {"prefix": ({1: 2}, 4)}, [0, 1]) == [0.6, 0.23]


@pytest.mark.parametrize("case", FIXTURES["latency_slo_admitter"]["cases"],
                         ids=lambda c: c["test"])
def test_latency_slo_admitter_matches_go_table(case):
    a = LatencySLOAdmitter()
    a.slo = tuple(case["slo"])
    eps = case["endpoints"]
    preds = _preds(eps)
    m = Metrics(latency=None if all(p is None for p in preds) else preds,
                kv_use=[e["kv_use"] for e in eps], running=[e["running"] for e in eps])
    why = a.admit(m, _Req(case["priority"]), list(range(len(eps))))
    assert (why is not None) is case["reject"]


def test_affinity_filter_ttft_gate_opens_with_predictions():
    f = PrefixCacheAffinityFilter(explorationProbability=0.0, maxTTFTPenaltyMs=500.0)
    cycle = {"prefix": ({0: 10}, 10)}       # endpoint 0 holds the whole prefix
    # Sticky's best predicted TTFT may exceed the others' best by up to maxTTFTPenaltyMs.
    assert f.filter(Metrics(ttft=[800.0, 300.0]), None, cycle, [0, 1]) == [0]
    assert f.filter(Metrics(ttft=[800.0, 300.0 - 1e-3]), None, cycle, [0, 1]) == [0, 1]
    assert f.filter(Metrics(), None, cycle, [0, 1]) == [0]        # no predictions: sticky


def test_online_model_learns_and_refits_on_schedule():
    model = LatencyModel(refit_every=10, min_samples=20, window=100, ridge=1e-6)
    for k in range(19):
        model.add((k % 7, k % 3, 0, 0, 0, 0.0, 0), 5.0 * (k % 7) + 2.0 * (k % 3) + 1.0)
    assert not model.ready
    model.add((1, 1, 0, 0, 0, 0.0, 0), 8.0)
    assert model.ready and model.num_fits == 1
    pred = model.predict([(4, 2, 0, 0, 0, 0.0, 0), (0, 0, 0, 0, 0, 0.0, 0)])
    assert pred == pytest.approx([25.0, 1.0], abs=1e-3)
    for k in range(300):
        model.add((k % 5, 0, 0, 0, 0, 0.0, 0), 3.0 * (k % 5))
    assert model.num_fits == 1 + 30 and len(model.xs) < 200
    assert model.predict([(2, 0, 0, 0, 0, 0.0, 0)])[0] == pytest.approx(6.0, abs=1e-3)
    assert model.predict([(-5, 0, 0, 0, 0, 0.0, 0)]) == [0.0]          # never negative


@pytest.mark.parametrize("options, words", [({"refit": 3}, "unknown option"),
                                            ({"window": 0}, "window"),
                                            ({"ridge": -1}, "ridge"), ("x", "mapping")])
def test_bad_model_options_are_refused(options, words):
    with pytest.raises(ValueError, match=words):
        model_options(options)


PREDICTOR = {"plugins": [
    {"type": "predicted-latency-producer"},
    {"name": "strict-affinity-filter", "type": "prefix-cache-affinity-filter",
     "parameters": {"affinityThreshold": 0.99}},
    {"name": "loose-affinity-filter", "type": "prefix-cache-affinity-filter",
     "parameters": {"affinityThreshold": 0.80}},
    {"type": "latency-scorer"}, {"type": "weighted-random-picker"},
    {"type": "slo-headroom-tier-filter"}, {"type": "latency-slo-admitter"}],
    "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": p} for p in (
        "predicted-latency-producer", "strict-affinity-filter", "slo-headroom-tier-filter",
        "loose-affinity-filter", "latency-scorer", "weighted-random-picker")]}]}


def test_predictor_profile_is_llm_d_helm_config_and_bad_params_refused():
    pipe = parse(PREDICTOR)
    assert [f.name for f in pipe.profiles[0].filters] == [
        "strict-affinity-filter", "slo-headroom-tier-filter", "loose-affinity-filter"]
    with pytest.raises(ValueError, match="epsilonExploreNeg must be in"):
        parse({"plugins": [{"type": "slo-headroom-tier-filter",
                            "parameters": {"epsilonExploreNeg": 1.5}}]})
    with pytest.raises(ValueError, match="headroomSelectionStrategy"):
        parse({"plugins": [{"type": "latency-scorer",
                            "parameters": {"headroomSelectionStrategy": "some"}}]})


def _run(seed=0, **options):
    cfg = SimConfig().replace(num_replicas=4, router="llm-d", num_requests=800, rate=120.0,
                              seed=seed)
    return simulate(cfg.replace(router_options={"config": PREDICTOR, **options}))


def test_predictor_learns_from_the_run_and_routes_by_predictions(monkeypatch):
    from simsched.cluster.epp import latency
    seen = {}
    produce = latency.PredictedLatencyProducer.produce

    def spy(self, m, req, cycle, keys):
        out = produce(self, m, req, cycle, keys)
        seen["producer"] = self
        seen["with"] = seen.get("with", 0) + (out is not None)
        return out
    monkeypatch.setattr(latency.PredictedLatencyProducer, "produce", spy)
    res = _run(slo_ttft_ms=2000.0, latency_model={"min_samples": 20, "refit_every": 20})
    producer = seen["producer"]
    finished = (res.requests.status == "finished").sum()
    # Every finished request is one observation (non-streaming: its end-to-end latency).
    assert producer.ttft_model.num_observations == finished
    assert producer.ttft_model.num_fits >= finished // 20 - 2
    assert seen["with"] > 0.9 * len(res.requests)
    assert not producer.contexts and not any(producer.prefill_tokens.values())


def test_predictor_runs_follow_the_seeded_generator():
    a = _run(slo_ttft_ms=500.0).requests.replica.tolist()
    assert a == _run(slo_ttft_ms=500.0).requests.replica.tolist()
    assert a != _run(seed=1, slo_ttft_ms=500.0).requests.replica.tolist()


def test_streaming_mode_trains_ttft_and_tpot(monkeypatch):
    from simsched.cluster.epp import latency
    seen = {}
    finished = latency.PredictedLatencyProducer.finished

    def spy(self, req):
        seen["producer"] = self
        return finished(self, req)
    monkeypatch.setattr(latency.PredictedLatencyProducer, "finished", spy)
    streaming = json.loads(json.dumps(PREDICTOR))
    streaming["plugins"][0]["parameters"] = {"streamingMode": True}
    from simsched.cluster.epp.router import LlmD
    import numpy as np
    router = LlmD(4, np.random.default_rng(0), config=streaming, slo_ttft_ms=300.0,
                  slo_tpot_ms=50.0)
    assert router.latency.streaming and router.latency.slo == (300.0, 50.0)
    res = simulate(SimConfig().replace(num_replicas=4, router="llm-d", num_requests=300,
                                       router_options={"config": streaming,
                                                       "slo_tpot_ms": 50.0}))
    assert (res.requests.status == "finished").all()
    producer = seen["producer"]
    multi = (res.requests.num_output_tokens > 1).sum()
    assert producer.ttft_model.num_observations == 300
    assert 0.9 * multi <= producer.tpot_model.num_observations <= multi
    assert producer.tpot_model.ready


def test_latency_producer_with_pd_handler_is_refused():
    from experiments.llm_d import pd_config
    data = pd_config(1024)
    data["plugins"].append({"type": "predicted-latency-producer"})
    with pytest.raises(ValueError, match="predicted-latency-producer with .* not modelled"):
        parse(data, where="epp.yaml")


def test_aborted_requests_teach_the_model_nothing():
    from simsched.cluster.epp.latency import PredictedLatencyProducer
    from simsched.request import Request
    p = PredictedLatencyProducer(streamingMode=True)
    req = Request(7, 0.0, 100, 10)
    m = Metrics(waiting=[0], running=[0], kv_use=[0.1], inflight_requests=[0])
    p.dispatched(m, req, {}, 0, "k", 0.0)
    assert p.prefill_tokens["k"] == 100
    p.first_token(req)          # aborted before its first token: first_token_at is NaN
    p.finished(req)
    assert p.ttft_model.num_observations == 0 and p.prefill_tokens["k"] == 0
    assert not p.contexts
