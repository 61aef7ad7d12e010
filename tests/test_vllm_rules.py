"""vLLM V1's scheduling rules as switches, and the ``vllm_v1`` preset that sets them (issue 25).

Each switch is on by default since issue 40 and off in the ``classic`` preset (the defaults before);
each test shows the rule's effect, against the classic rules, on a run small enough to follow by
hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import simsched
from simsched import CacheConfig, SimConfig, UnitCostModel
from simsched.api import simulate_checked
from simsched.engine.kv.block_pool import BlockPool
from simsched.engine.kv.factory import make_kv_cache
from simsched.engine.kv.prefix_cache import PrefixCache
from simsched.policies import VICTIM_POLICIES
from simsched.request import Content, Request

ROOT = Path(__file__).resolve().parent.parent


def _steps(cfg: SimConfig, requests, checked: bool = True) -> pd.DataFrame:
    cfg = cfg.replace(check_invariants=checked)
    return simsched.simulate(cfg, requests, cost_model=UnitCostModel(), record_steps=True).steps


def _first_step(steps: pd.DataFrame, rid: int) -> float:
    rows = steps[(steps["request_id"] == rid) & (steps["num_prefill_tokens"] > 0)]
    return float(rows["started_at"].iloc[0])


def _small(**changes) -> SimConfig:
    """A tiny engine under the classic rules (every vLLM switch off), then ``changes``."""
    return SimConfig.preset("classic", max_num_batched_tokens=8, max_num_seqs=4, block_size=4,
                            num_blocks=14, watermark=0.0).replace(**changes)


# ------------------------------------------------------------------ reserve_full_isl
def test_reserve_full_isl_admits_only_when_the_whole_prompt_fits():
    # Request 0 (8-token prompt) decodes 20 tokens; request 1 (48 tokens: 12 blocks) arrives at
    # t=1 with 11 blocks free. Its first chunk (7 tokens, 2 blocks) fits, its prompt does not.
    requests = [(0, 8, 20), (1, 48, 1)]
    assert _first_step(_steps(_small(), requests), 1) == 1.0
    steps = _steps(_small(reserve_full_isl=True), requests)
    # Admitted only once request 0 has finished (its last token at step 19) and freed its blocks.
    assert _first_step(steps, 1) == 20.0
    assert steps[steps["request_id"] == 0]["finished"].any()


# ------------------------------------------------------------------ prefix_hit_rule
def _repeat_prompt(rule: str, model: str = "segments") -> SimConfig:
    return _small(enable_prefix_caching=True, prefix_hit_rule=rule, prefix_cache_model=model,
                  max_num_batched_tokens=32)


REPEAT = pd.DataFrame({"arrival_at": [0.0, 5.0], "num_prompt_tokens": [16, 16],
                       "num_output_tokens": [8, 2], "prefix_group": [7, 7],
                       "prefix_len": [16, 16]})


@pytest.mark.parametrize("rule, cached", [("token", 15), ("block", 12)])
def test_a_fully_cached_block_aligned_prompt(rule, cached):
    # The second request's 16-token prompt (4 blocks) is all cached. "token": all but its last
    # token are served; "block" (vLLM): at most 15 tokens rounded down to whole blocks, 3 blocks.
    steps = _steps(_repeat_prompt(rule), REPEAT)
    admitted = steps[(steps["request_id"] == 1) & (steps["num_prefill_tokens"] > 0)].iloc[0]
    assert admitted["num_cached_tokens"] == cached
    assert admitted["num_prefill_tokens"] == 16 - cached


# ------------------------------------------------------------------ watermark rounding
def test_watermark_rounding_counts_the_null_block():
    assert make_kv_cache(99, CacheConfig(watermark=0.01, watermark_counts_null_block=False)
                         ).watermark_blocks == 0
    # vLLM's pool of 100 blocks (one the reserved null block) holds back int(0.01 * 100) = 1.
    assert make_kv_cache(99, CacheConfig(watermark=0.01, watermark_counts_null_block=True)
                         ).watermark_blocks == 1
    assert make_kv_cache(99, CacheConfig(watermark=0.05, watermark_counts_null_block=True,
                                         enable_prefix_caching=True)).watermark_blocks == 5


# ------------------------------------------------------------------ prefix_cache_model
def test_the_block_pool_keeps_the_recomputed_copy():
    # With the "block" rule the repeat recomputes its prompt's last block, a duplicate of the
    # cached one: vLLM's pool keeps it (one block more in use), the segment model shares it.
    def used(model):
        res = simsched.simulate(_repeat_prompt("block", model).replace(check_invariants=True),
                                REPEAT, cost_model=UnitCostModel())
        return res.iterations.set_index("started_at")["kv_blocks_used"]

    segments, blocks = used("segments"), used("blocks")
    assert blocks.loc[5.0] == segments.loc[5.0] + 1
    assert blocks.loc[0.0] == segments.loc[0.0]


def _req(rid: int, prompt: int, segments) -> Request:
    return Request(rid, 0.0, prompt, 4, content=Content.from_segments(segments, ("out", rid)))


@pytest.mark.parametrize("model", [BlockPool, PrefixCache])
def test_duplicates_and_what_a_lookup_finds_after_eviction(model):
    kv = model(6, block_size=4, hit_rule="block")
    x, y = _req(0, 8, [("g", 8)]), _req(1, 8, [("g", 8)])
    kv.acquire(x, 0)
    kv.allocate(0, 8)                   # x computes blocks g0, g1
    cached, hit, evictable = kv.match(y)
    assert (cached, hit, evictable) == (4, 1, 0)     # at most 7 tokens: whole blocks, g0
    kv.acquire(y, hit)
    kv.allocate(1, 8)                   # y computes g1 again
    if model is BlockPool:
        assert kv.num_free == 3         # x: 2 blocks, y: its own copy of g1 (g0 shared)
    else:
        assert kv.num_free == 4         # y's copy of g1 is given back, it shares x's
    kv.free(0, 8)                       # x finishes: its g1 becomes evictable
    z = _req(2, 16, [("z", 16)])
    kv.acquire(z, 0)
    kv.allocate(2, 16)                  # 4 blocks: the empty ones, then evicting the oldest
    w = _req(3, 12, [("g", 8), ("w", 4)])
    # Both find g0 and g1: the block pool in y's copy (x's was the oldest evictable block and
    # made room for z), the segment model in the one copy y shares (nothing was evictable).
    assert kv.match(w)[:2] == (8, 2)
    assert kv.num_evicted_blocks == (1 if model is BlockPool else 0)
    if model is BlockPool:
        assert kv.inconsistency(kv.holders()) is None


@pytest.mark.parametrize("model", ["segments", "blocks"])
def test_both_models_keep_their_books_under_eviction(model):
    rng = pd.Series(range(40))
    table = pd.DataFrame({"arrival_at": (rng // 3).astype(float),
                          "num_prompt_tokens": 8 + (rng * 7) % 40,
                          "num_output_tokens": 1 + (rng * 5) % 17,
                          "prefix_group": rng % 3, "prefix_len": 4 + (rng * 3) % 24})
    for rule in ("token", "block"):
        cfg = _small(enable_prefix_caching=True, prefix_cache_model=model, prefix_hit_rule=rule,
                     num_blocks=24, max_num_batched_tokens=24, max_num_preemptions=10**6)
        res, _ = simulate_checked(cfg, table, cost_model=UnitCostModel())
        assert (res.requests["status"] == "finished").all()


# ------------------------------------------------------------------ plan_ahead
def test_plan_ahead_sees_an_arrival_one_step_later_while_busy():
    requests = [(0, 4, 10), (3, 4, 3)]
    assert _first_step(_steps(_small(), requests), 1) == 3.0
    # The batch starting at t=3 was planned when the one before it started (t=2).
    assert _first_step(_steps(_small(plan_ahead=True), requests), 1) == 4.0


def test_plan_ahead_keeps_a_finished_requests_slot_through_the_next_plan():
    cfg = _small(max_num_seqs=2, max_num_batched_tokens=16)
    requests = [(0, 4, 2), (0, 4, 20), (0, 4, 2)]      # request 2 waits for a sequence slot
    steps = _steps(cfg, requests)
    assert steps[steps["finished"]]["request_id"].iloc[0] == 0
    assert _first_step(steps, 2) == 2.0
    # Request 0's last token comes at step 1; its slot is free for the plan after step 2's.
    assert _first_step(_steps(cfg.replace(plan_ahead=True), requests), 2) == 3.0


def test_plan_ahead_plans_again_when_a_plan_schedules_nothing():
    # Request 0 finishes at step 1; request 1 arrives at t=2, after the plan of step 2 was made.
    # That plan has nothing to run, so it is made again at once with request 1 (vLLM's async
    # engine waits for the running batch, then schedules): no idle step.
    steps = _steps(_small(plan_ahead=True), [(0, 4, 2), (2, 4, 2)])
    assert _first_step(steps, 1) == 2.0
    assert steps["step"].tolist() == sorted(steps["step"].tolist())
    assert len(steps["step"].unique()) == 4        # steps 0-1 for request 0, 2-3 for request 1


def test_plan_ahead_a_finished_request_taken_as_victim_stops_admissions():
    # 4 blocks of 4 tokens. Request 1 produces its last token at step 4; at step 5 request 0
    # needs a third block and none is free: the newest running request is request 1, still
    # holding its two blocks, so vLLM's async scheduler preempts it (it is dropped as finished
    # when its output arrives) and, having preempted, admits nobody in that step: request 2
    # (arrived at t=2) starts at step 6, not 5. vLLM reports and counts that preemption (issue
    # 40), then request 2's at step 7. (Checked against vLLM 0.33.0's AsyncScheduler.)
    cfg = _small(num_blocks=4, victim_policy="newest")
    requests = [(0, 4, 12), (0, 4, 5), (2, 4, 2)]
    assert _first_step(_steps(cfg, requests), 2) == 5.0
    res = simsched.simulate(cfg.replace(plan_ahead=True, check_invariants=True), requests,
                            cost_model=UnitCostModel(), record_steps=True)
    assert _first_step(res.steps, 2) == 6.0
    assert res.preemptions[["request_id", "at"]].values.tolist() == [[1, 5.0], [2, 7.0]]
    assert res.steps[res.steps["preempted"]][["step", "request_id"]].values.tolist() \
        == [[5, 1], [7, 2]]
    assert res.requests["num_preemptions"].tolist() == [0, 1, 1]
    assert res.requests.set_index("request_id").loc[1, "num_recomputed_tokens"] == 0


# ------------------------------------------------------------------ victims, preset
def test_priority_arrival_victim():
    choose = VICTIM_POLICIES["priority_arrival"]
    reqs = []
    for rid, (prio, arrival, seq) in enumerate([(1, 0.0, 0), (1, 0.0, 1), (0, 5.0, 2)]):
        r = Request(rid, arrival, 4, 4, priority=prio)
        r.admitted_seq = seq
        reqs.append(r)
    # Least urgent first; among equal (priority, arrival) the earliest admitted, as vLLM's max()
    # over its running list (kept in admission order) returns.
    assert choose(reqs, None).id == 0
    reqs[1].arrival_at = 1.0
    assert choose(reqs, None).id == 1


def test_vllm_v1_preset():
    cfg = SimConfig.preset("vllm_v1", max_num_seqs=64)
    s, c = cfg.scheduler, cfg.cache
    # The victim follows the queue policy and plan_ahead the engine profile, at run time.
    assert (s.victim_policy, s.admit_after_preemption, s.reserve_full_isl, s.plan_ahead) \
        == ("vllm_v1", False, True, None)
    assert s.max_num_preemptions == sys.maxsize and s.max_num_seqs == 64
    assert (c.watermark, c.prefix_hit_rule, c.watermark_counts_null_block,
            c.prefix_cache_model) == (0.0, "block", True, "blocks")
    assert SimConfig.preset("vllm_v1", policy="priority").scheduler.victim_policy \
        == "vllm_v1"                    # priority_arrival under priority: tests/test_defaults.py
    assert SimConfig.preset("vllm_v1", policy="priority", victim_policy="newest"
                            ).scheduler.victim_policy == "newest"
    assert SimConfig.preset("vllm_v1", **{"cache.watermark": 0.02}).cache.watermark == 0.02
    with pytest.raises(ValueError, match="unknown preset 'vllm_v2'; known: \\['classic', "
                                         "'sglang', 'trtllm', 'vllm_v1'\\]"):
        SimConfig.preset("vllm_v2")


def test_cli_preset(tmp_path):
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "simsched", "run", "--preset", "vllm_v1",
                    "--policy", "priority", "--num-requests", "5", "--num-blocks", "64",
                    "--cost-model", "unit", "--out", str(out)],
                   check=True, cwd=ROOT, capture_output=True)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["scheduler"]["reserve_full_isl"] is True
    assert cfg["scheduler"]["victim_policy"] == "vllm_v1"
    assert cfg["cache"]["prefix_cache_model"] == "blocks"
