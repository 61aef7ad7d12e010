"""llm-d's admission: the probabilistic admitter against its Go test table, the detectors' pool
saturation, and sheddable requests shed (with their reason) in runs."""

import json
from pathlib import Path

import pandas as pd
import pytest

from simsched import SimConfig, simulate
from simsched.cluster.epp.admission import ProbabilisticAdmitter
from simsched.cluster.epp.config import parse
from simsched.cluster.epp.plugins import Metrics
from simsched.cluster.epp.saturation import ConcurrencyDetector, UtilizationDetector

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "llm_d_plugins.json").read_text())


class _Req:
    def __init__(self, priority):
        self.priority = priority


@pytest.mark.parametrize("case", FIXTURES["probabilistic_admitter"], ids=lambda c: c["test"])
def test_probabilistic_admitter_matches_go_table(case):
    a = ProbabilisticAdmitter(**case["parameters"])
    a.draw = lambda: case["rand"]
    eps = case["endpoints"]
    m = Metrics(waiting=[None if e is None else e[0] for e in eps],
                kv_use=[0.0 if e is None else e[1] for e in eps])
    why = a.admit(m, _Req(case["priority"]), list(range(len(eps))))
    assert (why is None) is case["admitted"]
    if why is not None:
        assert why.startswith("probabilistic-admitter: rejected, saturation=")


def test_detector_saturation_formulas():
    u = UtilizationDetector(queueDepthThreshold=4, kvCacheUtilThreshold=0.5, headroom=0.5)
    m = Metrics(waiting=[2, 0, 8], kv_use=[0.1, 0.4, 0.0], age=[0.0, 0.0, 1.0])
    # max(2/4, 0.2) = 0.5; max(0, 0.8) = 0.8; stale: 1 (headroom does not enter)
    assert u.saturation(m, [0, 1, 2]) == pytest.approx((0.5 + 0.8 + 1.0) / 3)
    assert u.saturation(m, []) == 1.0
    c = ConcurrencyDetector(maxConcurrency=10)
    assert c.saturation(Metrics(inflight_requests=[5, 10]), [0, 1]) == pytest.approx(0.75)


def test_saturation_detector_config_and_refusals():
    assert parse(None).detector.TYPE == "utilization-detector"
    pipe = parse({"plugins": [{"type": "concurrency-detector", "name": "cd",
                               "parameters": {"maxConcurrency": 3}},
                              {"type": "probabilistic-admitter"}, {"type": "queue-scorer"}],
                  "saturationDetector": {"pluginRef": "cd"}})
    assert pipe.detector.max_requests == 3 and len(pipe.admitters) == 1
    for data, words in [({"saturationDetector": {"pluginRef": "nope"}}, "names no plugin"),
                        ({"plugins": [{"type": "queue-scorer"}],
                          "saturationDetector": {"pluginRef": "queue-scorer"}},
                         "not a saturation detector"),
                        ({"plugins": [{"type": "probabilistic-admitter",
                                       "parameters": {"k": 0}}]}, "k must be > 0")]:
        with pytest.raises(ValueError, match=words):
            parse(data)


def _burst(n=200, sheddable_every=2, gap=0.001):
    rows = [(gap * k, 600, 60, -1 if k % sheddable_every == 0 else 0) for k in range(n)]
    return pd.DataFrame(rows, columns=["arrival_at", "num_prompt_tokens", "num_output_tokens",
                                       "priority"])


def _run(config, requests, **kw):
    cfg = SimConfig().replace(num_replicas=2, router="llm-d", router_options={"config": config},
                              refresh_interval=0.05, **kw)
    return simulate(cfg, requests).requests


def test_saturated_pool_sheds_only_sheddable_requests_with_a_reason():
    df = _run(None, _burst())
    shed = df[df.status == "rejected"]
    assert len(shed) > 0
    assert (shed.priority < 0).all()
    assert shed.reject_reason.str.startswith("shed: llm-d system saturated").all()
    # Everything else was served; nothing vanished.
    assert len(df) == 200 and (df[df.priority >= 0].status == "finished").all()


def test_probabilistic_admitter_sheds_earlier_than_legacy_saturation():
    cfg = {"plugins": [{"type": "queue-scorer"}, {"type": "probabilistic-admitter"}]}
    legacy = _run(None, _burst(gap=0.02))
    prob = _run(cfg, _burst(gap=0.02))
    n_legacy = (legacy.status == "rejected").sum()
    n_prob = (prob.status == "rejected").sum()
    assert n_prob > n_legacy
    reasons = prob[prob.status == "rejected"].reject_reason
    assert reasons.str.startswith("shed: llm-d probabilistic-admitter").all()
    # It sheds below saturation 1, where legacy admission never does.
    sat = reasons.str.extract(r"saturation=([\d.]+)")[0].astype(float)
    assert (sat < 1.0).any() and (prob[prob.status == "rejected"].priority < 0).all()
    # The same seed gives the same draws: the run repeats exactly.
    again = _run(cfg, _burst(gap=0.02))
    assert (again.reject_reason.fillna("") == prob.reject_reason.fillna("")).all()


def test_no_sheddable_requests_no_shedding():
    df = _run(None, _burst(sheddable_every=10**9 + 1).assign(priority=0))
    assert (df.status == "finished").all()


def test_inlined_waiting_gauge_equals_replica_num_waiting(monkeypatch):
    from simsched.cluster.epp.router import LlmD
    seen = []
    choose = LlmD.choose

    def spy(self, view, req):
        if self._replicas is not None:
            got = self._queues({"waiting"})["waiting"]
            seen.append((got, [r.num_waiting for r in self._replicas]))
        return choose(self, view, req)
    monkeypatch.setattr(LlmD, "choose", spy)
    simulate(SimConfig().replace(num_replicas=3, router="llm-d", rate=300.0, num_requests=300))
    assert len(seen) > 200 and all(a == b for a, b in seen)
    assert any(sum(b) > 0 for _, b in seen)


def test_legacy_saturation_sheds_before_the_admitters_draw_as_go_director():
    import numpy as np
    from simsched.cluster.epp.plugins import Metrics
    from simsched.cluster.epp.router import LlmD
    router = LlmD(2, np.random.default_rng(0), config={"plugins": [
        {"type": "queue-scorer"}, {"type": "probabilistic-admitter"}]})
    draws = []
    router.pipeline.admitters[0].draw = lambda: draws.append(1) or 0.999
    router.candidates = [0, 1]
    busy = Metrics(waiting=[10, 10], kv_use=[0.9, 0.9], age=[0.0, 0.0])
    calm = Metrics(waiting=[1, 1], kv_use=[0.1, 0.1], age=[0.0, 0.0])

    class _R:
        priority = -1
    router.metrics = lambda view, req, consumed=None: busy
    assert router.admit(None, _R()).startswith("shed: llm-d system saturated")
    assert draws == []                  # the admitter never ran
    router.metrics = lambda view, req, consumed=None: calm
    assert router.admit(None, _R()) is None and draws == [1]
