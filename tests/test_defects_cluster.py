"""Issue 24, items 16-19: disaggregated requests no replica can hold, refresh_interval's lower
bound, request and session tables that coerced bad values, router weights, and one-token prefix
cache blocks."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

import simsched
from simsched.api import simulate_checked
from simsched.config import ClusterConfig, SimConfig
from simsched.engine.kv.prefix_cache import PrefixCache
from simsched.request import Content, Request

COLUMNS = ["arrival_at", "num_prompt_tokens", "num_output_tokens"]


# ------------------------------------------------------------------ 16: disaggregation
def _disagg(roles, replicas=(), **changes) -> SimConfig:
    return SimConfig().replace(**{"hardware.cost_model": "unit"}).replace(
        cluster=ClusterConfig(num_replicas=len(roles), roles=tuple(roles),
                              replicas=tuple(replicas), **changes))


def _run(cfg, rows):
    """simulate_checked on ``rows`` (every invariant and the end state checked)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res, engine = simulate_checked(cfg, pd.DataFrame(rows, columns=COLUMNS))
    return res.requests.set_index("request_id"), res.summary(), engine


@pytest.mark.parametrize("prompt, output", [(400, 10), (150, 20)])
def test_a_request_no_decode_replica_can_hold_is_rejected_at_arrival(prompt, output):
    # The decode replica holds 10 blocks of 16 tokens (160): a 400-token prompt never fits it
    # (it stayed running, its blocks held on the prefill replica); 150 + 20 fits the prompt but
    # not the peak (the run died with "no progress").
    cfg = _disagg(("prefill", "decode"), ({}, {"num_blocks": 10}))
    df, summary, _ = _run(cfg, [(0.0, prompt, output), (0.5, 100, 10)])
    assert df.loc[0, "status"] == "rejected"
    assert f"peak KV of {prompt + output - 1} tokens" in df.loc[0, "reject_reason"]
    assert "largest KV cache holds 160 tokens" in df.loc[0, "reject_reason"]
    assert df.loc[1, "status"] == "finished" and df.loc[1, "decode_replica"] == 1
    assert summary["num_rejected"] == 1 and summary["num_unfinished"] == 0
    # The same as one replica of the decode replica's size does at arrival.
    single = SimConfig().replace(**{"hardware.cost_model": "unit", "cache.num_blocks": 10})
    one, _, _ = _run(single, [(0.0, prompt, output)])
    assert one.loc[0, "status"] == "rejected"


def test_a_prefill_replica_needs_to_hold_only_the_prompt():
    # 150 + 50 tokens do not fit the prefill replica's 160, the 150-token prompt does: it is
    # prefilled there and decoded on the big decode replica (it was rejected).
    cfg = _disagg(("prefill", "decode"), ({"num_blocks": 10},))
    df, summary, _ = _run(cfg, [(0.0, 150, 50)])
    assert df.loc[0, "status"] == "finished"
    assert (df.loc[0, "prefill_replica"], df.loc[0, "decode_replica"]) == (0, 1)
    # A prompt the prefill replica cannot hold is refused with its reason.
    df, summary, _ = _run(cfg, [(0.0, 161, 5)])
    assert df.loc[0, "status"] == "rejected" and summary["num_rejected"] == 1
    assert df.loc[0, "reject_reason"].startswith("no prefill replica can hold its 161-token")


def test_a_router_choice_that_cannot_hold_the_request_goes_to_one_that_can():
    # Round robin sends the first hand-off to decode replica 1 (160 tokens): 199 tokens of peak
    # KV can only go to replica 2; a small request still follows the router.
    cfg = _disagg(("prefill", "decode", "decode"), ({}, {"num_blocks": 10}))
    df, summary, _ = _run(cfg, [(0.0, 150, 50), (0.0, 150, 50), (0.1, 100, 5)])
    assert summary["num_finished"] == 3
    assert df["decode_replica"].tolist() == [2, 2, 1]


def test_unservable_requests_on_mixed_and_local_paths_are_rejected_with_reasons():
    small = {"num_blocks": 5}
    df, _, _ = _run(_disagg(("mixed", "decode"), (small,)), [(0.0, 150, 50)])
    assert df.loc[0, "reject_reason"].startswith("no mixed replica can serve prompt + output = "
                                                 "200 tokens")
    cfg = _disagg(("prefill", "decode"), (small, small), disagg_min_prompt_tokens=200)
    df, _, _ = _run(cfg, [(0.0, 150, 50)])
    assert df.loc[0, "reject_reason"].startswith("no decode or mixed replica can serve")
    cfg = _disagg(("prefill", "decode"), ({"max_model_len": 100},))
    df, _, _ = _run(cfg, [(0.0, 90, 50)])
    assert "the longest max_model_len is 100" in df.loc[0, "reject_reason"]


# ------------------------------------------------------------------ 17: refresh_interval
@pytest.mark.parametrize("interval", [1e-9, 1e-17, 5e-5])
def test_refresh_interval_below_the_bound_is_refused(interval):
    with pytest.raises(ValueError, match=r"cluster\.refresh_interval must be 0 \(exact state\) "
                                         r"or >= 0\.0001 s"):
        SimConfig().replace(num_replicas=2, router="jsq", refresh_interval=interval)


def test_refresh_interval_at_the_bound_runs():
    cfg = SimConfig().replace(num_replicas=2, router="jsq", refresh_interval=1e-4,
                              cost_model="unit")
    res = simsched.simulate(cfg, [(0.0, 32, 4), (0.0, 32, 4)])
    assert res.summary()["num_finished"] == 2


# ------------------------------------------------------------------ 18: tables and weights
def _table(**columns) -> pd.DataFrame:
    base = {"arrival_at": [0.0, 0.1], "num_prompt_tokens": [64, 64], "num_output_tokens": [4, 4]}
    return pd.DataFrame({**base, **columns})


PREFIX_CFG = SimConfig().replace(**{"hardware.cost_model": "unit",
                                    "cache.enable_prefix_caching": True})


@pytest.mark.parametrize("columns, where", [
    (dict(prefix_group=[1.5, 0], prefix_len=[16, 16]), r"requests\[0\]\.prefix_group"),
    (dict(prefix_group=[0, -2], prefix_len=[16, 16]), r"requests\[1\]\.prefix_group"),
    (dict(prefix_group=[0, "a"], prefix_len=[16, 16]), r"requests\[1\]\.prefix_group"),
    (dict(prefix_group=[0, 1], prefix_len=[16, 1.5]), r"requests\[1\]\.prefix_len"),
    (dict(prefix_group=[0, 1], prefix_len=[-1, 16]), r"requests\[0\]\.prefix_len"),
    (dict(prefix_group=[0, 1], prefix_len=[16, np.nan]), r"requests\[1\]\.prefix_len"),
    (dict(prefix_len=[16, 16]), "prefix_len column but no prefix_group"),
    (dict(session_id=[1.5, 0]), r"requests\[0\]\.session_id"),
    (dict(session_id=[0, True]), r"requests\[1\]\.session_id"),
    (dict(session_id=[0, 1.5], think_time=[0, 0]), r"requests\[1\]\.session_id"),
    (dict(session_id=[np.nan, 0], think_time=[0, 0]), r"requests\[0\]\.session_id"),
    (dict(session_id=[0, 0], think_time=[0, "long"]), r"requests\[1\]\.think_time"),
    (dict(session_id=[0, 0], think_time=[0, 1], prefix_group=[0, 0], prefix_len=[-1, -1]),
     r"requests\[0\]\.prefix_len"),
])
def test_bad_prefix_and_session_columns_are_refused_naming_row_and_column(columns, where):
    with pytest.raises(ValueError, match=where):
        simsched.simulate(PREFIX_CFG, _table(**columns))


def test_missing_prefix_and_session_values_mean_none():
    res = simsched.simulate(PREFIX_CFG, _table(prefix_group=[0, None], prefix_len=[16, None],
                                               session_id=[np.nan, -1]))
    assert res.summary()["num_finished"] == 2
    assert res.requests["session_id"].tolist() == [-1, -1]


@pytest.mark.parametrize("options, field", [
    ({"weights": {"kv": math.inf}}, r"weights\['kv'\] must be a finite number"),
    ({"weights": {"queue": math.nan}}, r"weights\['queue'\] must be a finite number"),
    ({"weights": {"kv": 0.0}}, "must give some scorer a weight > 0"),
    ({"weights": {}}, "must give some scorer a weight > 0"),
])
def test_weighted_router_refuses_non_finite_and_all_zero_weights(options, field):
    with pytest.raises(ValueError, match=field):
        SimConfig().replace(num_replicas=2, router="weighted", router_options=options)


@pytest.mark.parametrize("router, options", [
    ("prefix_affinity", {"max_load_ratio": math.inf}),
    ("session_affinity", {"max_load_ratio": math.inf}),
    ("prefix_affinity", {"load_slack": math.inf}),
])
def test_affinity_routers_refuse_infinite_caps(router, options):
    # inf x a mean load of 0 is NaN: no replica was ever under the cap.
    with pytest.raises(ValueError, match="must be a finite number"):
        SimConfig().replace(num_replicas=2, router=router, router_options=options)


# ------------------------------------------------------------------ 19: one-token blocks
def _req(rid: int, segments) -> Request:
    content = Content.from_segments(segments, (0, rid))
    return Request(rid, 0.0, content.num_tokens, 5, content=content)


def _admit(kv: PrefixCache, r: Request) -> tuple:
    cached, hit, evictable = kv.match(r)
    kv.acquire(r, hit)
    kv.allocate(r.id, r.num_prompt_tokens)
    return cached, hit, evictable


@pytest.mark.parametrize("other_first", [True, False])
def test_one_token_blocks_never_evict_for_the_recomputed_last_block(other_first):
    # Six one-token blocks: another prompt's block and a 5-token prompt's, all evictable, none
    # empty. Admitting the 5-token prompt again computes its last token; that block is a copy of
    # the cached one, so nothing may be evicted for it: neither the other prompt's block (the
    # oldest when released first) nor the very block it needs (the oldest otherwise).
    kv = PrefixCache(6, 1)
    other, a = _req(0, [(9, 1)]), _req(1, [(7, 5)])
    for r in ((other, a) if other_first else (a, other)):
        _admit(kv, r)
        kv.free(r.id, r.num_prompt_tokens)
    assert kv.num_evictable == 6 and kv.num_free - kv.num_evictable == 0   # none empty
    assert _admit(kv, _req(2, [(7, 5)])) == (4, 4, 4)      # the last token is computed
    assert kv.num_evicted_blocks == 0
    assert kv.num_held(2) == 5 and kv.num_used == 5 and kv.num_evictable == 1
    assert kv.num_cached_prefix_tokens(_req(3, [(9, 1)])) == 0   # a 1-token prompt never hits
    assert sorted(n[0] for n in kv.nodes().values()) == [1, 5]  # both prompts still cached


def test_one_token_blocks_in_a_run_keep_the_cache_and_the_invariants():
    # The segments model (the classic preset's): vLLM's block pool, the default, keeps the
    # recomputed last block as a copy and so evicts here, as vLLM does.
    cfg = SimConfig.preset("classic").replace(**{
        "hardware.cost_model": "unit", "cache.enable_prefix_caching": True,
        "cache.block_size": 1, "cache.num_blocks": 6})
    rows = pd.DataFrame({"arrival_at": [0.0, 10.0, 20.0], "num_prompt_tokens": [1, 5, 5],
                         "num_output_tokens": [1, 1, 1], "prefix_group": [9, 7, 7],
                         "prefix_len": [1, 5, 5]})
    res, _ = simulate_checked(cfg, rows)
    assert res.requests["num_cached_tokens"].tolist() == [0, 0, 4]
    assert res.iterations["num_evicted_blocks"].sum() == 0
