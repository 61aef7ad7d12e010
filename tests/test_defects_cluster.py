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
from simsched.engine.prefix_cache import PrefixCache
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
