"""The ``llm-d`` router: llm-d's plugins against their own Go unit-test tables, the EPP cycle,
its YAML config, and the same run as simsched's ``weighted`` router where the two agree."""

import json
from pathlib import Path

import numpy as np
import pytest

from simsched import SimConfig, simulate
from simsched.cluster.epp.config import PLUGIN_TYPES, parse
from simsched.cluster.epp.plugins import InFlightLoadProducer, MaxScorePicker, Metrics, \
    WeightedRandomPicker
from simsched.cluster.epp.prefix import ApproxPrefixCacheProducer, Indexer, block_hashes
from simsched.cluster.routers import make_router
from simsched.cluster.state import ReplicaLoad, Snapshot
from simsched.request import Content, Request

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "llm_d_plugins.json").read_text())


def _case_id(case):
    return f"{case.get('type', '')}:{case['test']}"


@pytest.mark.parametrize("case", FIXTURES["scorers"], ids=_case_id)
def test_scorers_match_llm_d_go_tables(case):
    plugin = PLUGIN_TYPES[case["type"]](**case.get("parameters", {}))
    if case["type"] == "prefix-cache-scorer":
        n = len(case["match"])
        cycle = {"prefix": (dict(enumerate(case["match"])), case["total"])}
        got = plugin.score(Metrics(), None, cycle, list(range(n)))
    else:
        m = Metrics(**{case["figure"]: case["values"]})
        got = plugin.score(m, None, {}, list(range(len(case["values"]))))
    assert got == pytest.approx(case["want"], abs=1e-4)


def test_fixture_counts_cover_every_load_scorer():
    counts = {}
    for case in FIXTURES["scorers"]:
        counts[case["type"]] = counts.get(case["type"], 0) + 1
    assert counts == {"queue-scorer": 3, "kv-cache-utilization-scorer": 4,
                      "running-requests-size-scorer": 3, "active-request-scorer": 7,
                      "load-aware-scorer": 1, "token-load-scorer": 1, "prefix-cache-scorer": 1}


def _uniforms(seed):
    rng = np.random.default_rng(seed)
    return lambda: float(rng.random())


@pytest.mark.parametrize("case", FIXTURES["max_score_picker"], ids=_case_id)
def test_max_score_picker_matches_go_table(case):
    picker = MaxScorePicker(maxNumOfEndpoints=case["maxNumOfEndpoints"])
    picker.draw = _uniforms(1)
    seen = set()
    for _ in range(50):
        got = picker.pick([0, 1, 2], [float(s) for s in case["scores"]])
        k = case["tie_candidates"]
        # Go's test: the first tie_candidates picks may come in any order, the rest exactly.
        assert sorted(got[:k]) == sorted(case["want"][:k]) and got[k:] == case["want"][k:]
        seen.add(tuple(got))
    # Ties are broken at random: both orders of the tied pair turn up.
    assert len(seen) == (2 if case["tie_candidates"] else 1)


def test_max_score_ties_random_or_lowest_index():
    picker = MaxScorePicker()
    picker.draw = _uniforms(2)
    picks = [picker.pick([0, 1, 2, 3], [0.5, 0.9, 0.9, 0.9])[0] for _ in range(3000)]
    assert set(picks) == {1, 2, 3}
    assert all(abs(picks.count(i) / 3000 - 1 / 3) < 0.04 for i in (1, 2, 3))
    picker.random_ties = False
    assert picker.pick([0, 1, 2, 3], [0.5, 0.9, 0.9, 0.9]) == [1]


@pytest.mark.parametrize("case", FIXTURES["weighted_random_picker"], ids=_case_id)
def test_weighted_random_picker_frequencies_match_go_table(case):
    picker = WeightedRandomPicker()
    picker.draw = _uniforms(3)
    scores = [float(s) for s in case["scores"]]
    n = len(scores)
    counts = np.bincount([picker.pick(list(range(n)), scores)[0] for _ in range(10000)],
                         minlength=n)
    expected = np.array(scores) / sum(scores)
    assert np.all(np.abs(counts / 10000 - expected) <= case["tolerance"])
    assert all(counts[i] == 0 for i in range(n) if scores[i] == 0)


def test_weighted_random_all_zero_falls_back_to_uniform():
    picker = WeightedRandomPicker()
    picker.draw = _uniforms(4)
    picks = [picker.pick([0, 1], [0.0, 0.0])[0] for _ in range(2000)]
    assert 0.45 < picks.count(0) / 2000 < 0.55


@pytest.mark.parametrize("case", FIXTURES["prefix_indexer"], ids=_case_id)
def test_prefix_indexer_matches_go_test(case):
    idx = Indexer(case["default_capacity"])
    for hashes in case["adds"]:
        idx.add(hashes, 7, case["num_blocks"])
    assert len(idx.lrus[7]) == case["want_lru_len"]
    assert all(7 in idx.get(h) for h in case["want_held"])
    assert all(not idx.get(h) for h in case["want_absent"])


def _req(rid, segments, n_out=4):
    return Request(rid, 0.0, sum(n for _, n in segments), n_out,
                   content=Content.from_segments(segments, output_id=("out", rid)))


def test_block_hashes_follow_shared_token_prefixes():
    a = _req(0, [(1, 64), (2, 20)])         # 5 full blocks of 16 and a partial one of 4
    b = _req(1, [(1, 64), (3, 20)])
    ha, hb = (block_hashes(r.content, 16, 256, 0) for r in (a, b))
    assert len(ha) == len(hb) == 6
    assert ha[:4] == hb[:4] and ha[4] != hb[4]      # block 4 holds tokens 64-79: they differ
    assert block_hashes(_req(2, [(1, 10)]).content, 16, 256, 0) == []     # under one block
    assert len(block_hashes(a.content, 16, 3, 0)) == 3                    # maxPrefixBlocks
    assert block_hashes(a.content, 16, 256, 0) != block_hashes(a.content, 16, 256, 1)   # model


class _Sched:
    def __init__(self, running):
        self.running = dict.fromkeys(range(running))


class _KV:
    block_size, num_blocks = 16, 1000


class _Replica:
    """What the router reads of a replica: its gauges and its KV block geometry."""

    def __init__(self, waiting=0, running=0):
        self.num_waiting = waiting
        self.scheduler = _Sched(running)
        self.kv = _KV()


def test_prefix_producer_scores_the_endpoint_it_dispatched_to():
    router = make_router("llm-d", {"config": {"plugins": [{"type": "prefix-cache-scorer"}]},
                                   "tie_break": "index"}, 3, np.random.default_rng(0))
    view = ReplicaLoad([_Replica() for _ in range(3)])
    first = _req(0, [(1, 64), (2, 36)])             # 7 blocks (6 full + 1 partial)
    assert router.choose(view, first) == 0          # no match anywhere: lowest index on ties
    again = _req(1, [(1, 64), (9, 36)])             # shares blocks 0-3 of 7
    _, scores, _ = router.scores(view, again)
    assert scores == pytest.approx([4 / 7, 0.0, 0.0])
    producer = router.pipeline.producers(ApproxPrefixCacheProducer.TYPE)[0]
    assert producer.block_size(view.replicas) == 16         # autoTune: the replicas' block size


def test_queue_scorer_reads_waiting_not_outstanding():
    """llm-d's queue-scorer reads vLLM's waiting gauge; simsched's weighted router reads the
    requests routed and not finished: with running requests the two choose differently."""
    replicas = [_Replica(waiting=0, running=5), _Replica(waiting=1, running=0)]
    view = ReplicaLoad(replicas)
    view.outstanding[:] = [5, 1]
    cfg = {"plugins": [{"type": "queue-scorer"}]}
    llmd = make_router("llm-d", {"config": cfg, "tie_break": "index"}, 2, np.random.default_rng(0))
    weighted = make_router("weighted", {"weights": {"queue": 1.0}}, 2, np.random.default_rng(0))
    assert llmd.choose(view, _req(0, [(1, 8)])) == 0
    assert weighted.choose(view, _req(0, [(1, 8)])) == 1


def test_snapshot_gauges_are_scraped_inflight_counters_are_live():
    replicas = [_Replica(waiting=3), _Replica(waiting=0)]
    load = ReplicaLoad(replicas)
    snap = Snapshot(load)
    cfg = {"plugins": [{"type": "queue-scorer"}, {"type": "active-request-scorer"}],
           "schedulingProfiles": [{"name": "default", "plugins": [
               {"pluginRef": "queue-scorer", "weight": 1}, {"pluginRef": "active-request-scorer",
                                                            "weight": 0}]}]}
    router = make_router("llm-d", {"config": cfg, "tie_break": "index"}, 2, np.random.default_rng(0))
    req = _req(0, [(1, 8)])
    assert router.choose(snap, req) == 1
    replicas[1].num_waiting = 10                    # changes after the scrape: not seen yet
    assert router.choose(snap, req) == 1
    snap.refresh(0.05)
    assert router.choose(snap, req) == 0
    load.routed(1, req)                             # the in-flight count is live
    assert router.metrics(snap, req).inflight_requests == [0, 1]


def test_token_load_counts_estimated_tokens_until_the_request_ends():
    load = ReplicaLoad([_Replica(), _Replica()])
    router = make_router("llm-d", {"config": {"plugins": [{"type": "token-load-scorer"}]},
                                   "tie_break": "index"}, 2, np.random.default_rng(0))
    req = _req(0, [(1, 100)])
    i = router.choose(load, req)
    load.routed(i, req)
    assert router.metrics(load, req).inflight_tokens[i] == InFlightLoadProducer.estimate(req) == 250
    assert router.choose(load, _req(1, [(2, 10)])) == 1 - i
    load.finished(i, req)
    assert router.metrics(load, req).inflight_tokens == [0, 10 + 15]      # the second request is still in flight


def _frames_equal(a, b):
    cols = ["replica", "first_token_at", "finished_at"]
    return a.requests[cols].equals(b.requests[cols])


def test_kv_profile_equals_weighted_router_request_for_request():
    base = SimConfig().replace(num_replicas=4, rate=40.0, num_requests=300)
    cfg = {"plugins": [{"type": "kv-cache-utilization-scorer"}],
           "schedulingProfiles": [{"name": "default", "plugins": [
               {"pluginRef": "kv-cache-utilization-scorer", "weight": 2.0}]}]}
    llmd = simulate(base.replace(router="llm-d",
                                 router_options={"config": cfg, "tie_break": "index"}))
    weighted = simulate(base.replace(router="weighted", router_options={"weights": {"kv": 2.0}}))
    assert llmd.requests["replica"].nunique() == 4      # the choice is not trivial
    assert _frames_equal(llmd, weighted)


def test_default_profile_runs_and_differs_from_weighted_by_its_queue_input():
    base = SimConfig().replace(num_replicas=4, rate=40.0, num_requests=300)
    cfg = {"plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}],
           "schedulingProfiles": [{"name": "default", "plugins": [
               {"pluginRef": "queue-scorer", "weight": 2.0},
               {"pluginRef": "kv-cache-utilization-scorer", "weight": 2.0}]}]}
    llmd = simulate(base.replace(router="llm-d",
                                 router_options={"config": cfg, "tie_break": "index"}))
    weighted = simulate(base.replace(router="weighted",
                                     router_options={"weights": {"queue": 2.0, "kv": 2.0}}))
    assert not llmd.requests["replica"].equals(weighted.requests["replica"])
    default = simulate(base.replace(router="llm-d", refresh_interval=0.05))
    assert default.requests["replica"].nunique() == 4


LLM_D_ESTIMATE_PREFIX_YAML = """\
# deploy/config/epp-estimate-prefix-cache-config.yaml of llm-d-inference-scheduler 520af478
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: single-profile-handler
- type: decode-filter
- type: prefix-cache-scorer
- type: load-aware-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-cache-scorer
    weight: 1.0
  - pluginRef: load-aware-scorer
    weight: 1.0
  - pluginRef: max-score-picker
"""


def test_reads_llm_d_yaml_as_it_is(tmp_path):
    path = tmp_path / "epp.yaml"
    path.write_text(LLM_D_ESTIMATE_PREFIX_YAML)
    router = make_router("llm-d", {"config": str(path)}, 4, np.random.default_rng(0))
    profile = router.profile
    assert [f.TYPE for f in profile.filters] == ["decode-filter"]
    assert [(s.TYPE, w) for s, w in profile.scorers] == [("prefix-cache-scorer", 1.0),
                                                         ("load-aware-scorer", 1.0)]
    assert profile.picker.TYPE == "max-score-picker"
    assert router.prefix is not None                # the producer is injected, as in Go
    cfg = SimConfig().replace(num_replicas=2, router="llm-d", router_options={"config": str(path)})
    assert SimConfig.from_json(cfg.to_json()) == cfg


def test_default_config_is_llm_d_default_profile():
    profile = parse(None).profiles[0]
    assert [(s.TYPE, w) for s, w in profile.scorers] == [
        ("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0), ("prefix-cache-scorer", 3.0)]
    assert profile.picker.TYPE == "max-score-picker"


@pytest.mark.parametrize("text, words", [
    ("plugins:\n- type: magic-scorer\n", ["magic-scorer", "epp.yaml"]),
    ("plugins:\n- type: load-aware-scorer\n  parameters: {treshold: 3}\n",
     ["treshold", "load-aware-scorer", "epp.yaml"]),
    ("plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: d\n  plugins:\n"
     "  - pluginRef: kv-scorer\n", ["kv-scorer", "epp.yaml"]),
    ("plugins: [\n", ["epp.yaml", "YAML"]),
    ("featureGates: [flowControl]\nflowControl: {maxRequests: lots}\n",
     ["flowControl.maxRequests", "epp.yaml"]),
    ("plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: d\n  plugins:\n"
     "  - pluginRef: queue-scorer\n    weight: -1\n", ["weight", "epp.yaml"]),
])
def test_bad_yaml_is_refused_naming_it(tmp_path, text, words):
    path = tmp_path / "epp.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        SimConfig().replace(num_replicas=2, router="llm-d", router_options={"config": str(path)})
    assert all(w in str(err.value) for w in words), str(err.value)


def test_bad_router_options_are_refused():
    with pytest.raises(ValueError, match="tie_break"):
        make_router("llm-d", {"tie_break": "first"}, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="cannot read"):
        make_router("llm-d", {"config": "/nonexistent/epp.yaml"}, 2, np.random.default_rng(0))


class _Asks:
    """A request as the affinity scorers read it."""

    def __init__(self, adapter=-1, session_id=-1):
        self.adapter = adapter
        self.session_id = session_id


@pytest.mark.parametrize("case", FIXTURES["lora_affinity"], ids=_case_id)
def test_lora_affinity_matches_go_table(case):
    lora = [(set(a), set(w), k) for a, w, k in case["endpoints"]]
    got = PLUGIN_TYPES["lora-affinity-scorer"]().score(
        Metrics(lora=lora), _Asks(adapter=case["target"]), {}, list(range(len(lora))))
    assert got == case["want"]


@pytest.mark.parametrize("case", FIXTURES["no_hit_lru"], ids=_case_id)
def test_no_hit_lru_matches_go_table(case):
    n = len(case["match"])
    cycle = {"prefix": (dict(enumerate(case["match"])), 10), "keys": list(range(n))}
    got = PLUGIN_TYPES["no-hit-lru-scorer"]().score(Metrics(), None, cycle, list(range(n)))
    assert got == case["want"]


def test_no_hit_lru_prefers_least_recently_used_as_go_test():
    scorer = PLUGIN_TYPES["no-hit-lru-scorer"]()
    keys = ["a", "b", "c"]
    for step in FIXTURES["no_hit_lru_sequence"]["steps"]:
        match = {} if step["cold"] else {1: 5}
        cycle = {"prefix": (match, 10), "keys": keys}
        scorer.score(Metrics(), None, cycle, [0, 1, 2])
        scorer.pre_request(keys[step["to"]], cycle, None)
        cold = {"prefix": ({}, 10), "keys": keys}
        scores = scorer.score(Metrics(), None, cold, [0, 1, 2])
        assert scores.index(max(scores)) == step["then_best"], (step, scores)
        if "then_scores" in step:
            assert scores == step["then_scores"]


@pytest.mark.parametrize("case", FIXTURES["session_affinity"], ids=_case_id)
def test_session_affinity_matches_go_table(case):
    scorer = PLUGIN_TYPES["session-affinity-scorer"]()
    if case["home"] is not None:
        scorer.pre_request(case["home"], {}, _Asks(session_id=3))
    req = _Asks(session_id=3 if case["home"] is not None else -1)
    assert scorer.score(Metrics(), req, {"keys": [0, 1]}, [0, 1]) == case["want"]


def test_session_affinity_keeps_sessions_home_in_a_run():
    cfg = {"plugins": [{"type": "session-affinity-scorer"}, {"type": "no-hit-lru-scorer"},
                       {"type": "queue-scorer"}],
           "schedulingProfiles": [{"name": "default", "plugins": [
               {"pluginRef": "session-affinity-scorer", "weight": 10},
               {"pluginRef": "no-hit-lru-scorer", "weight": 1},
               {"pluginRef": "queue-scorer", "weight": 1}]}]}
    base = SimConfig().replace(num_replicas=3, name="sessions", num_requests=30)
    res = simulate(base.replace(router="llm-d", router_options={"config": cfg}))
    turns = res.requests[res.requests["session_id"] >= 0]
    per_session = turns.groupby("session_id")["replica"].nunique()
    # Session affinity (10) outweighs the rest (2 at most): every later turn goes home ...
    assert len(per_session) > 3 and (per_session == 1).all()
    # ... while first turns spread (no-hit-lru and queue), so all replicas serve sessions.
    assert turns["replica"].nunique() == 3


def test_cli_router_config_flag(tmp_path):
    from simsched.cli import config_from_args, make_parser
    path = tmp_path / "epp.yaml"
    path.write_text(LLM_D_ESTIMATE_PREFIX_YAML)
    args = make_parser().parse_args(["run", "--router-config", str(path),
                                     "--set", "num_replicas=3",
                                     "--set", 'router_options={"tie_break":"index"}'])
    cfg, _ = config_from_args(args)
    assert cfg.cluster.router == "llm-d"
    assert dict(cfg.cluster.router_options) == {"tie_break": "index", "config": str(path)}
    bad = make_parser().parse_args(["run", "--router-config", str(path), "--set", "router=jsq"])
    with pytest.raises(ValueError, match="--router-config"):
        config_from_args(bad)


def test_prefix_match_is_go_greedy_count_up_to_the_first_unheld_block():
    producer = ApproxPrefixCacheProducer()
    idx = producer.indexer
    for hashes, pod in (([1, 2, 3], "b"), ([1, 3, 5], "a")):
        idx.add(hashes, pod, 100)
    # Blocks 1 {a, b}, 2 {b}, 3 {a, b}, 4 nobody (the count stops), 5 {a} (not counted).
    assert producer.match([1, 2, 3, 4, 5]) == {"a": 2, "b": 3}
    assert producer.match([1, 1, 1]) == {"a": 3, "b": 3}
    assert producer.match([4, 1]) == {}


@pytest.mark.parametrize("case", FIXTURES["utilization_detector_filter"], ids=_case_id)
def test_utilization_detector_filter_matches_go_table(case):
    plugin = PLUGIN_TYPES["utilization-detector"](**case["parameters"])
    waiting, kv, age = (list(col) for col in zip(*case["endpoints"]))
    kept = plugin.filter(Metrics(waiting=waiting, kv_use=kv, age=age), None, {},
                         list(range(len(waiting))))
    assert len(kept) == case["want_len"]


@pytest.mark.parametrize("case", FIXTURES["concurrency_detector_filter"], ids=_case_id)
def test_concurrency_detector_filter_matches_go_table(case):
    plugin = PLUGIN_TYPES["concurrency-detector"](**case["parameters"])
    m = Metrics(inflight_requests=case["load"], inflight_tokens=case["load"])
    assert plugin.filter(m, None, {}, list(range(len(case["load"])))) == case["want"]


def test_token_estimate_matches_go_token_filter_request():
    # Go's test request "1234567890123456": 16 characters = 4 input tokens, + round(4 x 1.5).
    assert InFlightLoadProducer.estimate(_req(0, [(1, 4)])) == 10


def test_utilization_detector_sees_scrape_age_and_fails_open_in_a_router():
    replicas = [_Replica(waiting=9), _Replica(waiting=0)]
    load = ReplicaLoad(replicas)
    snap = Snapshot(load)
    cfg = {"plugins": [{"type": "utilization-detector",
                        "parameters": {"metricsStalenessThreshold": "200ms"}},
                       {"type": "kv-cache-utilization-scorer"}]}
    router = make_router("llm-d", {"config": cfg, "tie_break": "index"}, 2,
                         np.random.default_rng(0))
    fresh = Request(0, 0.1, 8, 4)
    assert router.scores(snap, fresh)[0] == [1]      # replica 0's queue is over 5: filtered
    stale = Request(1, 0.3, 8, 4)                    # 0.3 s after the scrape: all stale
    assert router.scores(snap, stale)[0] == [0, 1]   # ... so the filter fails open


@pytest.mark.parametrize("params, words", [
    ({"metricsStalenessThreshold": "fast"}, ["metricsStalenessThreshold", "duration"]),
    ({"kvCacheUtilThreshold": 1.5}, ["kvCacheUtilThreshold"]),
    ({"queueDepthThreshold": 0}, ["queueDepthThreshold"]),
])
def test_bad_detector_parameters_are_refused(params, words):
    with pytest.raises(ValueError) as err:
        parse({"plugins": [{"type": "utilization-detector", "parameters": params}]},
              where="epp.yaml")
    assert all(w in str(err.value) for w in words + ["epp.yaml"]), str(err.value)


def test_precise_scores_are_go_absolute_normalisation():
    from simsched.cluster.epp.precise import absolute_scores
    assert absolute_scores([3, 0, 10], 5) == [0.6, 0.0, 1.0]
    assert absolute_scores([3, 2], 0) == [0.0, 0.0]


class _CachingKV(_KV):
    def __init__(self, cached):
        self.cached = cached

    def num_cached_prefix_tokens(self, req):
        return self.cached


def test_precise_prefix_scorer_reads_the_replicas_caches():
    replicas = [_Replica(), _Replica(), _Replica()]
    for r, cached in zip(replicas, (0, 40, 100)):
        r.kv = _CachingKV(cached)
    router = make_router("llm-d", {"config": {"plugins": [
        {"type": "precise-prefix-cache-scorer",
         "parameters": {"tokenProcessorConfig": {"blockSize": 16}}}]}}, 3,
        np.random.default_rng(0))
    req = _req(0, [(1, 100), (2, 60)])          # 160 tokens: 10 blocks
    _, scores, _ = router.scores(ReplicaLoad(replicas), req)
    assert scores == [0.0, 2 / 10, 6 / 10]      # 40 -> 2 full blocks, 100 -> 6
    assert router.choose(ReplicaLoad(replicas), req) == 2


def test_precise_prefix_scorer_in_a_run_raises_hits_over_load_only_routing():
    base = SimConfig().replace(num_replicas=4, num_requests=400, rate=40.0, num_prefix_groups=8,
                               system_prompt_len=512, enable_prefix_caching=True)
    cfg = {"plugins": [{"type": "precise-prefix-cache-scorer"}, {"type": "queue-scorer"}],
           "schedulingProfiles": [{"name": "default", "plugins": [
               {"pluginRef": "precise-prefix-cache-scorer", "weight": 3},
               {"pluginRef": "queue-scorer", "weight": 1}]}]}
    precise = simulate(base.replace(router="llm-d", router_options={"config": cfg}))
    load_only = simulate(base.replace(router="llm-d", router_options={"config": {
        "plugins": [{"type": "queue-scorer"}]}}))
    assert precise.summary()["prefix_hit_rate"] > load_only.summary()["prefix_hit_rate"] + 0.02


CLA = FIXTURES["context_length_aware"]


def test_context_length_aware_filter_matches_go_test():
    case = CLA["filter"]
    plugin = PLUGIN_TYPES["context-length-aware"](enableFiltering=True)
    req = Request(0, 0.0, case["length"], 4)
    assert plugin.filter(Metrics(labels=case["labels"]), req, {}, [0, 1, 2, 3]) == case["want"]
    off = PLUGIN_TYPES["context-length-aware"]()
    assert off.filter(Metrics(labels=case["labels"]), req, {}, [0, 1, 2, 3]) == [0, 1, 2, 3]


def test_context_length_aware_score_matches_go_test():
    case = CLA["score"]
    plugin = PLUGIN_TYPES["context-length-aware"]()
    tight, wide, miss, none = plugin.score(Metrics(labels=case["labels"]),
                                           Request(0, 0.0, case["length"], 4), {}, [0, 1, 2, 3])
    assert tight > wide > 0.3 > miss > 0.0 and none == 0.5


@pytest.mark.parametrize("case", CLA["parse"], ids=_case_id)
def test_context_range_parsing_matches_go_test(case):
    from simsched.cluster.epp.labels import parse_range
    want = case["want"]
    assert parse_range(case["text"]) == (tuple(want) if want is not None else None)


@pytest.mark.parametrize("case", CLA["fallback"], ids=_case_id)
def test_context_range_fallback_order_matches_go_test(case):
    from simsched.cluster.epp.labels import range_score
    assert range_score(*case["higher"]) > range_score(*case["lower"])


def test_role_filters_and_labels_option_route_by_label():
    role = "llm-d.ai/role"
    labels = [{role: "prefill"}, {role: "decode"}, {}]
    cfg = {"plugins": [{"type": "decode-filter"}, {"type": "queue-scorer"}]}
    router = make_router("llm-d", {"config": cfg, "labels": labels, "tie_break": "index"}, 3,
                         np.random.default_rng(0))
    view = ReplicaLoad([_Replica(), _Replica(), _Replica()])
    assert router.scores(view, _req(0, [(1, 8)]))[0] == [1, 2]      # decode and unlabelled
    pre = make_router("llm-d", {"config": {"plugins": [{"type": "prefill-filter"}]},
                                "labels": labels}, 3, np.random.default_rng(0))
    assert pre.scores(view, _req(0, [(1, 8)]))[0] == [0]            # unlabelled is not prefill
    by = parse({"plugins": [{"type": "by-label", "parameters": {
        "label": "gpu", "validValues": ["h100"], "allowsNoLabel": False}}]}).profiles[0]
    assert by.filters[0].filter(Metrics(labels=[{"gpu": "h100"}, {"gpu": "a100"}, {}]), None,
                                {}, [0, 1, 2]) == [0]
    with pytest.raises(ValueError, match="labels"):
        make_router("llm-d", {"labels": [{"a": 1}]}, 2, np.random.default_rng(0))
    too_many = make_router("llm-d", {"config": cfg, "labels": labels * 2}, 3,
                           np.random.default_rng(0))
    with pytest.raises(ValueError, match="labels lists 6"):
        too_many.choose(view, _req(0, [(1, 8)]))


@pytest.mark.parametrize("case", FIXTURES["prefix_cache_affinity_filter"], ids=_case_id)
def test_prefix_cache_affinity_filter_matches_go_table(case):
    plugin = PLUGIN_TYPES["prefix-cache-affinity-filter"](**case["parameters"])
    plugin.draw = _uniforms(5)
    n = len(case["match"])
    cycle = {"prefix": (dict(enumerate(case["match"])), 100)}     # Go: match of 100 blocks
    kept = plugin.filter(Metrics(ttft=case["ttft"]), None, cycle, list(range(n)))
    assert len(kept) == case["want_len"]


def test_prefix_cache_affinity_filter_explores_at_its_rate():
    plugin = PLUGIN_TYPES["prefix-cache-affinity-filter"](explorationProbability=0.25)
    plugin.draw = _uniforms(6)
    cycle = {"prefix": ({0: 90}, 100)}
    opened = sum(len(plugin.filter(Metrics(), None, cycle, [0, 1])) == 2 for _ in range(4000))
    assert 0.22 < opened / 4000 < 0.28


class _TieredKV(_KV):
    """A cache whose leading run is ``hit`` GPU blocks continued by tier blocks."""

    tiers = ("cpu",)

    def __init__(self, cached, hit):
        self.cached, self.hit = cached, hit

    def match(self, req):
        return self.cached, self.hit, 0


def test_precise_scorer_weighs_tier_blocks_as_llm_d_kv_cache_cpu():
    from simsched.cluster.epp.precise import held_blocks
    req = _req(0, [(1, 160)])
    assert held_blocks(_TieredKV(cached=96, hit=2), req, 16) == 2 + 0.8 * 4
    plain = _TieredKV(cached=96, hit=6)
    plain.tiers = ()
    assert held_blocks(plain, req, 16) == 6
