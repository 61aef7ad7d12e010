"""llm-d's flow control: its policies against llm-d's Go test tables, the controller, and runs."""

import json
from pathlib import Path

import pytest

from simsched import SimConfig, simulate
from simsched.cluster.epp.config import parse
from simsched.cluster.epp.flowcontrol import (FLOW_POLICIES, Band, FlowController, Item,
                                              quantity)
from simsched.request import Request

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "llm_d_flow_control.json")
                      .read_text())
TYPES = {cls.TYPE: cls for cls in FLOW_POLICIES}


class _Req:
    def __init__(self, arrival_at=0.0, priority=0, tenant=None, num_prompt_tokens=10):
        self.arrival_at, self.priority, self.tenant = arrival_at, priority, tenant
        self.num_prompt_tokens = num_prompt_tokens


def _item(spec, seq=0):
    return Item(_Req(spec["received_at"]), spec["enqueue_at"], spec["ttl"], 40, seq,
                spec["slo_ttft_ms"])


def _band(fairness, ordering="fcfs-ordering-policy"):
    return Band(0, 0, 0, TYPES[fairness](), TYPES[ordering]())


def _fill(band, flows, ordering):
    """Flows of ``band``: name -> list of enqueue times (or a count of items at time 0)."""
    seq = 0
    for fid, items in flows.items():
        key = (0, fid)
        flow = band.flows.get(key)
        if flow is None:
            from simsched.cluster.epp.flowcontrol import Flow
            flow = band.flows[key] = Flow(key)
        flow.items.clear()
        for e in (items if isinstance(items, list) else [0.0] * items):
            seq += 1
            it = Item(_Req(e), e, 0.0, 40, seq, None)
            flow.items.append((ordering.key(it), it))
        flow.items.sort(key=lambda kv: kv[0])
    for key in [k for k in band.flows if k[1] not in flows]:
        del band.flows[key]


@pytest.mark.parametrize("case", FIXTURES["global_strict"], ids=lambda c: c["test"])
def test_global_strict_fairness_matches_go_table(case):
    band = _band("global-strict-fairness-policy")
    _fill(band, case["flows"], band.ordering)
    flow = band.fairness.pick(band, band.state)
    assert (flow.key[1] if flow is not None else None) == case["want"]


@pytest.mark.parametrize("case", FIXTURES["round_robin"], ids=lambda c: c["test"])
def test_round_robin_fairness_matches_go_sequence(case):
    band = _band("round-robin-fairness-policy")
    for step in case["steps"]:
        _fill(band, step["flows"], band.ordering)
        flow = band.fairness.pick(band, band.state)
        assert flow.key[1] == step["want"]


@pytest.mark.parametrize("table", FIXTURES["ordering"], ids=lambda t: t["type"])
def test_ordering_policies_match_go_less_tables(table):
    policy = TYPES[table["type"]]()
    items = {k: _item(v) for k, v in table["items"].items()}
    for a, b, want in table["cases"]:
        # The Go policies compare times only (the sequence number breaks simsched's exact ties).
        assert (policy.key(items[a])[:-1] < policy.key(items[b])[:-1]) is want, (a, b)


@pytest.mark.parametrize("case", FIXTURES["deadlines"], ids=lambda c: c["test"])
def test_deadlines_match_go(case):
    deadline = TYPES[case["type"]]().key(_item(case["item"]))[0]
    assert deadline == (float("inf") if case["want"] is None else round(case["want"] * 1e9))


def test_eviction_policies_match_go_tables():
    f = TYPES["sheddable-eviction-filter"]()
    for priority, want in FIXTURES["sheddable_eviction_filter"]["cases"]:
        assert f.accept(priority) is want
    table = FIXTURES["priority_then_time"]
    order = TYPES["priority-then-time-eviction-order-policy"]()
    for a, b, want in table["cases"]:
        assert order.less(tuple(table["items"][a]), tuple(table["items"][b])) is want


def test_controller_bands_capacity_and_head_of_line_blocking():
    ctl = FlowController({"maxRequests": 3, "priorityBands": [
        {"priority": 5, "maxRequests": 1}]}, {}, "test")
    assert isinstance(ctl.enqueue(_Req(0.0, priority=0), 0.0), Item)
    assert isinstance(ctl.enqueue(_Req(0.1, priority=5), 0.1), Item)
    assert ctl.enqueue(_Req(0.2, priority=5), 0.2) == "queue at capacity"     # band full
    assert isinstance(ctl.enqueue(_Req(0.3, priority=-1), 0.3), Item)         # template band
    assert ctl.enqueue(_Req(0.4, priority=-1), 0.4) == "queue at capacity"    # global limit
    assert ctl.num_queued == 3
    assert ctl.dispatch_cycle(1.0) is None          # saturated: nothing, no lower band either
    picked = [ctl.dispatch_cycle(0.5).req.priority for _ in range(3)]
    assert picked == [5, 0, -1] and ctl.num_queued == 0 and ctl.bytes == 0
    assert ctl.dispatch_cycle(0.0) is None


def test_controller_bytes_ttl_and_expiry():
    ctl = FlowController({"maxBytes": "1k", "defaultRequestTTL": "250ms"}, {}, "test")
    a = ctl.enqueue(_Req(0.0, num_prompt_tokens=200), 0.0)          # 800 bytes
    assert a.ttl == 0.25
    assert ctl.enqueue(_Req(0.0, num_prompt_tokens=100), 0.0) == "queue at capacity"
    ctl.expire(a)
    assert ctl.num_queued == 0 and ctl.bytes == 0


@pytest.mark.parametrize("value, want", [(None, 0), (100, 100), ("1k", 1000), ("1Gi", 2**30),
                                         ("500M", 500 * 10**6), ("1.5k", 1500)])
def test_quantities(value, want):
    assert quantity(value, "x") == want


@pytest.mark.parametrize("flow, words", [
    ({"maxReqs": 1}, ["flowControl", "maxReqs"]),
    ({"maxBytes": "lots"}, ["maxBytes", "quantity"]),
    ({"maxRequests": -1}, ["maxRequests", "negative"]),
    ({"defaultRequestTTL": "soon"}, ["defaultRequestTTL"]),
    ({"priorityBands": [{"maxRequests": 2}]}, ["priorityBands[0]", "priority is required"]),
    ({"priorityBands": [{"priority": 1}, {"priority": 1}]}, ["priority 1", "twice"]),
    ({"priorityBands": [{"priority": 1, "fairnessPolicyRef": "nope"}]}, ["fairnessPolicyRef",
                                                                         "nope"]),
    ({"priorityBands": [{"priority": 1, "orderingPolicyRef": "queue-scorer"}]},
     ["orderingPolicyRef", "not a ordering policy"]),
])
def test_bad_flow_control_config_is_refused_naming_it(flow, words):
    data = {"featureGates": ["flowControl"], "plugins": [{"type": "queue-scorer"}],
            "flowControl": flow}
    with pytest.raises(ValueError) as err:
        parse(data, where="epp.yaml")
    assert "epp.yaml" in str(err.value)
    for w in words:
        assert w in str(err.value)


def test_feature_gate_turns_flow_control_on_as_go():
    base = {"plugins": [{"type": "queue-scorer"}], "flowControl": {"maxRequests": 5}}
    assert parse(base).flow_control is None             # section without the gate: ignored
    assert parse({**base, "featureGates": ["flowControl"]}).flow_control.max_requests == 5
    assert parse({"featureGates": ["flowControl"]}).flow_control.max_requests == 0
    with pytest.raises(ValueError, match="featureGates"):
        parse({"featureGates": "flowControl"})


def _config(flow, detector=None):
    return {"featureGates": ["flowControl"],
            "plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"},
                        {"type": "utilization-detector",
                         "parameters": detector or {"queueDepthThreshold": 2}},
                        {"type": "round-robin-fairness-policy"}],
            "schedulingProfiles": [{"name": "default", "plugins": [
                {"pluginRef": "queue-scorer", "weight": 2.0},
                {"pluginRef": "kv-cache-utilization-scorer", "weight": 2.0}]}],
            "flowControl": flow}


OVERLOAD = SimConfig().replace(num_replicas=2, router="llm-d", num_requests=1500, rate=400.0,
                               num_priorities=2, num_tenants=3)


def test_flow_control_serves_the_higher_band_first_under_overload():
    r = simulate(OVERLOAD.replace(router_options={"config": _config({})})).requests
    assert (r.status == "finished").all()
    ttft = r.groupby("priority").ttft.median()
    assert ttft[1] < 0.5 * ttft[0]
    off = simulate(OVERLOAD.replace(router_options={"config": _config({}) | {
        "featureGates": []}})).requests.groupby("priority").ttft.median()
    assert off[1] > 0.5 * off[0]        # without it the engines serve both alike


def test_flow_control_ttl_and_capacity_shed_with_reasons():
    with pytest.warns(Warning):
        res = simulate(OVERLOAD.replace(router_options={"config": _config(
            {"defaultRequestTTL": "1s"})}))
    r = res.requests
    evicted = r[r.reject_reason.str.contains("evicted, TTL of 1 s")]
    assert len(evicted) > 0 and res.summary()["num_shed"] == len(evicted)
    with pytest.warns(Warning):
        r = simulate(OVERLOAD.replace(router_options={"config": _config(
            {"maxRequests": 10})})).requests
    assert r.reject_reason.str.contains("rejected, queue at capacity").sum() > 0


def test_unsaturated_flow_control_dispatches_at_arrival_same_run():
    light = SimConfig().replace(num_replicas=3, router="llm-d", num_requests=300)
    on = simulate(light.replace(router_options={"config": _config({}, {})})).requests
    off = simulate(light.replace(router_options={"config": _config({}, {}) | {
        "featureGates": []}})).requests
    assert on.replica.tolist() == off.replica.tolist()
    assert on.finished_at.tolist() == off.finished_at.tolist()


@pytest.mark.parametrize("change, words", [
    ({"rate_limit": 10.0}, ["rate_limit"]),
    ({"refresh_interval": 0.5}, ["refresh_interval", "metricsStalenessThreshold"]),
    ({"num_replicas": 3, "num_prefill_replicas": 1, "num_decode_replicas": 2},
     ["disaggregated"]),
])
def test_flow_control_refuses_what_it_does_not_model(change, words):
    cfg = SimConfig().replace(num_replicas=2, router="llm-d", num_requests=5,
                              router_options={"config": _config({})}).replace(**change)
    with pytest.raises(ValueError) as err:
        simulate(cfg)
    for w in words:
        assert w in str(err.value)


def test_requests_carry_tenant_and_priority_for_flows():
    # Flow keys read Request.tenant and .priority (guards the fields this module depends on).
    req = Request(0, 0.0, 10, 5, priority=-1, tenant="a")
    ctl = FlowController({}, {}, "t")
    item = ctl.enqueue(req, 0.0)
    assert item.flow.key == (1, "a") and ctl.band(-1).len == 1


def test_flow_control_with_scraped_gauges_drains_after_the_last_arrival():
    # The scrapes go on while requests are queued: the queue drains after the last arrival.
    cfg = OVERLOAD.replace(num_requests=600, refresh_interval=0.05,
                           router_options={"config": _config({})})
    r = simulate(cfg).requests
    assert (r.status == "finished").all()
    assert r.first_scheduled_at.max() > r.arrival_at.max() + 0.1
