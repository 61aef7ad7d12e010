"""Speculative decoding (issue 27): config, acceptance, one token budget, KV, invariants, cost."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from simsched.analysis.runner import run, simulate
from simsched.analysis.speculative import spec_summary
from simsched.config import SimConfig
from simsched.config.parts import SchedulerConfig
from simsched.config.speculative import SpeculativeConfig
from simsched.cost.base import Batch, LinearCostModel
from simsched.cost.factory import make_cost_model
from simsched.cost.speculative import SpecBatch, speculative_cost_model
from simsched.engine.invariants import check_final_state
from simsched.engine.result_checks import check_results
from simsched.engine.kv.cache import KVCacheManager
from simsched.engine.scheduler.speculative import Acceptance, SpeculativeScheduler
from simsched.request import Request


def config(spec=None, **fields) -> SimConfig:
    base = SimConfig()
    sections = {"scheduler": {}, "cache": {}}
    for name, value in fields.items():
        section = "cache" if name in {f.name for f in dataclasses.fields(base.cache)} \
            else "scheduler"
        sections[section][name] = value
    sched = dataclasses.replace(base.scheduler, speculative=spec, **sections["scheduler"])
    cache = dataclasses.replace(base.cache, **sections["cache"])
    return dataclasses.replace(base, scheduler=sched, cache=cache, check_invariants=True)


def workload(n=150, seed=1, gap=0.05):
    rng = np.random.default_rng(seed)
    return [(i * gap, int(rng.integers(30, 300)), int(rng.integers(10, 200))) for i in range(n)]


# ----------------------------------------------------------------------------- config
def test_config_round_trips_through_json():
    spec = {"method": "mtp", "num_speculative_tokens": 4, "acceptance": [0.9, 0.7, 0.5],
            "concentration": 20.0}
    cfg = config(spec)
    assert isinstance(cfg.scheduler.speculative, SpeculativeConfig)
    assert cfg.scheduler.speculative.acceptance == (0.9, 0.7, 0.5)
    assert SimConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("spec, field", [
    ({"acceptance": [0.5, 0.7]}, "non-increasing"),
    ({"acceptance": [0.5], "acceptance_rate": 0.5}, "not both"),
    ({"acceptance_rate": 1.5}, "acceptance_rate"),
    ({"method": "draft_model"}, "draft_model"),
    ({"method": "eagle", "draft_model": "llama-2-7b"}, "draft_model"),
    ({"num_speculative_tokens": 99}, "num_speculative_tokens"),
    ({"method": "medusa"}, "method"),
    ({"acceptance_trace": "/nonexistent.csv"}, "acceptance_trace"),
    ({"k": 3}, "unknown field"),
])
def test_bad_config_names_the_field(spec, field):
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(speculative=spec)


def test_needs_vllm_v1_style_scheduling():
    with pytest.raises(ValueError, match="stall_free"):
        SchedulerConfig(style="prefill_first", speculative={})
    with pytest.raises(ValueError, match="plan_ahead"):
        SchedulerConfig(plan_ahead=True, speculative={})
    SchedulerConfig(style="prefill_first", speculative={"num_speculative_tokens": 0})  # off


# ----------------------------------------------------------------------------- bit-identity
def test_k_zero_is_bit_identical_to_off():
    reqs = workload(80)
    off = simulate(config(None), reqs)
    zero = simulate(config({"num_speculative_tokens": 0}), reqs)
    pd.testing.assert_frame_equal(off.requests, zero.requests)
    pd.testing.assert_frame_equal(off.iterations, zero.iterations)
    assert "speculative" not in zero.info


def test_same_seed_same_results_other_seed_differs():
    reqs = workload(60)
    a = simulate(config({"num_speculative_tokens": 3}), reqs)
    b = simulate(config({"num_speculative_tokens": 3}), reqs)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    c = simulate(dataclasses.replace(config({"num_speculative_tokens": 3}), seed=7), reqs)
    assert not a.requests["finished_at"].equals(c.requests["finished_at"])


# ----------------------------------------------------------------------------- acceptance
class _Req:
    def __init__(self, rid):
        self.id = rid


@pytest.mark.parametrize("spec", [
    SpeculativeConfig(num_speculative_tokens=3),                       # EAGLE-3's vector
    SpeculativeConfig(method="ngram", num_speculative_tokens=5),
    SpeculativeConfig(num_speculative_tokens=4, acceptance_rate=0.6),
    SpeculativeConfig(num_speculative_tokens=3, concentration=4.0),    # Beta per request
])
def test_mean_accepted_length_matches_the_configured_expectation(spec):
    acc = Acceptance(spec, np.random.default_rng(3))
    k = spec.num_speculative_tokens
    n = 40_000
    reqs = [_Req(i % 4000) for i in range(n)]   # 4000 requests, 10 verifications each
    accepted = np.array(acc.sample([(r, k + 1) for r in reqs]))
    expected = spec.mean_accepted_length()
    if spec.acceptance_rate is not None:
        a = spec.acceptance_rate
        assert expected == pytest.approx((1 - a ** (k + 1)) / (1 - a))
    sd = accepted.std()
    # Requests' own vectors make samples of one request correlated: a wider tolerance.
    width = 5 * sd / math.sqrt(n) * (4 if spec.concentration else 1)
    assert abs(1 + accepted.mean() - expected) < width
    per_pos = [(accepted > i).mean() for i in range(k)]
    assert np.allclose(per_pos, spec.position_acceptance(), atol=0.02 if spec.concentration
                       else 0.01)


def test_acceptance_never_exceeds_the_proposals_verified():
    acc = Acceptance(SpeculativeConfig(num_speculative_tokens=5, acceptance_rate=1.0),
                     np.random.default_rng(0))
    assert acc.sample([(_Req(0), 1), (_Req(1), 3), (_Req(2), 6)]) == [0, 2, 5]


def test_trace_replays_then_falls_back(tmp_path):
    path = tmp_path / "acc.csv"
    path.write_text("request_id,num_accepted\n7,2\n7,0\n7,9\n")
    acc = Acceptance(SpeculativeConfig(num_speculative_tokens=3, acceptance_rate=1.0,
                                       acceptance_trace=str(path)), np.random.default_rng(0))
    r = _Req(7)
    assert [acc.sample([(r, 4)])[0] for _ in range(4)] == [2, 0, 3, 3]
    bad = tmp_path / "bad.csv"
    bad.write_text("request_id,num_accepted\n1,x\n")
    with pytest.raises(ValueError, match="line 2"):
        SpeculativeConfig(acceptance_trace=str(bad))


def test_simulated_acceptance_matches_the_vector():
    spec = {"num_speculative_tokens": 3}
    res = simulate(config(spec), workload(200, gap=0.02))
    s = spec_summary(res)
    hist = np.array(res.info["speculative"]["accepted_hist"])
    assert s["num_drafts"] > 3000
    # Verifications of all K proposals (the others were trimmed near an output's end).
    full = SpeculativeConfig(**spec)
    assert abs(s["mean_acceptance_length"] - full.mean_accepted_length()) < 0.08
    assert hist.sum() == s["num_drafts"]
    assert 0 < s["spec_efficiency"] <= 1
    # Several tokens per chunk: per-chunk ITL exceeds per-token ITL; TPOT near per token.
    assert s["itl_p50"] > 1.5 * s["itl_per_token_p50"]
    assert s["itl_per_token_mean"] == pytest.approx(res.requests["tpot"].mean(), rel=0.15)


# ----------------------------------------------------------------------------- token budget
def _scheduler(budget, k=3, num_blocks=100, block_size=4, seqs=3, **spec):
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=seqs,
                          speculative={"num_speculative_tokens": k, "acceptance_rate": 0.0,
                                       **spec})
    return SpeculativeScheduler(cfg, KVCacheManager(num_blocks, block_size),
                                rng=np.random.default_rng(0))


def test_spec_tokens_are_trimmed_when_the_budget_runs_out():
    """vLLM V1: running requests in order take min(1 + K, budget left); when it is spent, the
    rest get nothing this step."""
    sched = _scheduler(budget=6)
    reqs = [Request(i, 0.0, 2, 50) for i in range(3)]
    for r in reqs:
        sched.add(r, 0.0)
    batch = sched.schedule(0.0)                    # three 2-token prompts: 6 tokens
    assert batch.prefill_new_tokens == [2, 2, 2] and batch.num_tokens == 6
    sched.commit(1.0)
    batch = sched.schedule(1.0)
    assert sched.decode_grants == {0: 4, 1: 2}     # 1 + 3, then the 2 left; request 2 waits
    assert batch.num_decode_seqs == 2 and batch.num_spec_tokens == 4 and batch.num_tokens == 6
    sched.commit(2.0)
    assert reqs[2].num_generated == 1 and reqs[0].num_generated == 2   # rate 0: 1 token each
    sched.schedule(2.0)
    assert sched.decode_grants == {0: 4, 1: 2}


def test_prefill_chunks_share_the_budget_with_spec_tokens():
    sched = _scheduler(budget=8, seqs=4)
    first = Request(0, 0.0, 2, 50)
    sched.add(first, 0.0)
    sched.schedule(0.0)
    sched.commit(1.0)
    sched.add(Request(1, 1.0, 20, 5), 1.0)
    batch = sched.schedule(1.0)
    assert sched.decode_grants == {0: 4}
    assert batch.prefill_new_tokens == [4]          # the 4 tokens the decoder left


def test_grants_stop_at_the_remaining_output():
    sched = _scheduler(budget=20)
    req = Request(0, 0.0, 3, 3)
    sched.add(req, 0.0)
    sched.schedule(0.0)
    sched.commit(1.0)
    sched.schedule(1.0)
    assert sched.decode_grants == {0: 2}            # 2 tokens left: no proposal past the end


def test_steps_record_the_grants_and_respect_the_budget():
    budget = 8
    rng = np.random.default_rng(2)
    # Short prompts arriving together finish their prefills in one step: the next step's
    # spec tokens spend the budget before every decoder is served.
    reqs = [(0.1 * (i // 6), int(rng.integers(1, 4)), int(rng.integers(5, 60)))
            for i in range(60)]
    res, engine = run(config({"num_speculative_tokens": 4}, max_num_batched_tokens=budget,
                             max_num_seqs=8), reqs, keep_engine=True, record_steps=True)
    check_final_state(engine)
    check_results(res)          # runs split by skipped steps still give every token's time
    steps = res.steps
    per_step = steps.groupby("step")[["num_prefill_tokens", "num_decode_tokens"]].sum()
    assert (per_step.sum(axis=1) <= budget).all()
    assert steps["num_decode_tokens"].max() == 5
    assert res.info["speculative"]["num_skipped"] > 0    # the budget left decoders out
    assert (res.requests["itl_max"] > 0).all()


# ----------------------------------------------------------------------------- KV
def test_rejected_proposals_blocks_stay_with_the_request_as_in_vllm():
    # vLLM's block table only grows: a verification's rejected slots stay allocated and the
    # next steps' tokens fill them (issue 40; simsched freed them at the step's end before).
    sched = _scheduler(budget=20, k=5, num_blocks=10, block_size=2)
    req = Request(0, 0.0, 4, 12)
    assert sched.add(req, 0.0)
    sched.schedule(0.0)
    sched.commit(1.0)                               # 4 computed: 2 blocks
    assert sched.kv.num_held(0) == 2
    sched.schedule(1.0)                             # 6 tokens verified: KV for 10 tokens
    assert sched.kv.num_held(0) == 5 and sched.kv.num_free == 5
    sched.commit(2.0)                               # rate 0: 1 token accepted, 5 computed
    assert req.num_computed_tokens == 5
    assert sched.kv.num_held(0) == 5 and sched.kv.num_free == 5     # kept
    sched.schedule(2.0)                             # 6 more slots: 11 tokens, one new block
    assert sched.kv.num_held(0) == 6 and sched.kv.num_free == 4


@pytest.mark.parametrize("extra", [
    {},
    {"enable_prefix_caching": True},
    {"preemption_mode": "swap"},
    {"enable_prefix_caching": True, "prefix_cache_model": "blocks"},
])
def test_invariants_hold_with_preemption_in_the_middle_of_speculation(extra):
    cfg = config({"num_speculative_tokens": 4, "concentration": 5.0}, num_blocks=60,
                 block_size=8, **extra)
    reqs = workload(100, gap=0.01)
    res, engine = run(cfg, reqs, keep_engine=True)
    check_final_state(engine)
    check_results(res)
    assert len(res.preemptions) > 10
    done = res.requests[res.requests["status"] == "finished"]
    assert len(done) > 80
    assert (done["num_generated_tokens"] == done["num_output_tokens"]).all()


def test_prefix_cache_keeps_only_accepted_tokens_blocks():
    cfg = config({"num_speculative_tokens": 5, "acceptance_rate": 0.3},
                 enable_prefix_caching=True, block_size=4)
    res, engine = run(cfg, workload(40), keep_engine=True)
    check_final_state(engine)
    kv = engine.replicas[0].kv
    # Everything cached is evictable and nothing is held: rejected slots were never registered
    # (a registered rejected slot would leave a block the request never computed).
    assert kv.num_free == kv.num_blocks and not kv.holders()


# ----------------------------------------------------------------------------- cost
def test_verify_and_proposer_costs():
    hw = SimConfig().hardware
    base = make_cost_model(hw)
    plain = Batch((), (), 32, 32 * 1000)
    spec_batch = SpecBatch((), (), 32, 32 * 1000)
    spec_batch.num_spec_tokens = 32 * 3
    times = {}
    for method, extra in (("ngram", {}), ("eagle", {}), ("mtp", {}),
                          ("draft_model", {"draft_model": "phi-2"})):
        spec = SpeculativeConfig(method=method, num_speculative_tokens=3, **extra)
        times[method] = speculative_cost_model(base, spec, hw).iteration_time(spec_batch)
    t0 = base.iteration_time(plain)
    assert t0 < times["ngram"] < times["eagle"] < times["draft_model"]
    assert times["ngram"] < 1.5 * t0              # verification is memory-bound: cheap
    assert times["eagle"] == times["mtp"]
    # Works over any cost model: the linear one's decode term sees 1 + K rows per sequence.
    lin = LinearCostModel()
    wrapped = speculative_cost_model(lin, SpeculativeConfig(method="ngram"), hw)
    assert wrapped.iteration_time(spec_batch) == pytest.approx(
        lin.iteration_time(plain) + lin.decode_seq * 96)


def test_speculation_cuts_tpot_at_low_load():
    reqs = workload(40, gap=0.5)
    off = simulate(config(None), reqs).requests["tpot"].median()
    on = simulate(config({"num_speculative_tokens": 3}), reqs).requests["tpot"].median()
    assert on < off / 1.7


def test_set_on_the_command_line_takes_json():
    from simsched.cli.configs import parse_set_value

    value = parse_set_value("speculative", '{"method":"mtp","num_speculative_tokens":2,'
                                           '"acceptance":[0.8,0.6]}')
    cfg = SimConfig().replace(speculative=value)
    assert cfg.scheduler.speculative == SpeculativeConfig(method="mtp", num_speculative_tokens=2,
                                                          acceptance=(0.8, 0.6))
    with pytest.raises(ValueError, match="speculative takes a mapping"):
        parse_set_value("scheduler.speculative", "3")


def test_summary_reports_speculation_only_when_on():
    reqs = workload(30)
    on = simulate(config({"num_speculative_tokens": 2}), reqs).summary()
    off = simulate(config(None), reqs).summary()
    assert "mean_acceptance_length" not in off
    assert 1 < on["mean_acceptance_length"] <= 3 and 0 < on["spec_efficiency"] <= 1
    assert on["itl_per_token_p50"] < on["itl_p50"]


def test_fair_share_meters_every_accepted_token():
    reqs = [(0.0, 20, 40 + 10 * (i % 3)) for i in range(12)]
    tenants = pd.DataFrame(reqs, columns=["arrival_at", "num_prompt_tokens",
                                          "num_output_tokens"])
    tenants["tenant"] = ["a" if i % 2 else "b" for i in range(12)]
    cfg = config({"num_speculative_tokens": 3}, policy="fair")
    res, engine = run(cfg, tenants, keep_engine=True)
    meter = engine.replicas[0].scheduler.meter
    step = engine.replicas[0].scheduler.step
    served = {t: meter.output_tokens(t, step) for t in ("a", "b")}
    want = tenants.groupby("tenant")["num_output_tokens"].sum().to_dict()
    assert served == want
