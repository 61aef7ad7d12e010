"""Prompt reuse by benchmark clients: aiperf's dataset sampling (sequential, shuffle, random over
``--num-dataset-entries`` prompts, warm-ups drawn from them) and what a prefix cache makes of it."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from simsched import SimConfig
from simsched.analysis.client_runs import client_plan, client_table
from simsched.api import simulate
from simsched.config import ClientConfig
from simsched.workloads import benchmark_clients as bc


def _plan(**client):
    cfg = SimConfig().replace(client=ClientConfig(**client))
    return client_plan(cfg, client_table(cfg), 16)


def test_prompt_indices_follow_each_order():
    rng = np.random.default_rng(3)
    assert bc.prompt_indices(rng, "sequential", 4, 10) == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    shuffled = bc.prompt_indices(rng, "shuffle", 7, 23)
    for start in range(0, 21, 7):         # every full pass is a permutation of the pool
        assert sorted(shuffled[start:start + 7]) == list(range(7))
    assert set(shuffled[21:]) <= set(range(7)) and len(shuffled) == 23
    drawn = bc.prompt_indices(rng, "random", 5, 2000)
    counts = Counter(drawn)
    assert set(counts) == set(range(5)) and min(counts.values()) > 300
    # with replacement: some prompt repeats inside a window of the pool's size
    assert any(len(set(drawn[i:i + 5])) < 5 for i in range(0, 100, 5))
    assert bc.prompt_indices(rng, "shuffle", 3, 0) == []
    with pytest.raises(ValueError, match="prompt order"):
        bc.prompt_indices(rng, "lifo", 3, 3)
    with pytest.raises(ValueError, match="pool"):
        bc.prompt_indices(rng, "shuffle", 0, 3)


def test_aiperf_preset_reuses_its_dataset_in_shuffled_passes():
    client = ClientConfig.preset("aiperf", max_concurrency=4, num_prompts=40, num_warmups=8,
                                 random_input_len=64, random_output_len=4)
    assert (client.num_unique_prompts, client.prompt_order, client.warmup_prompts,
            client.resolved_ready_check) == (100, "shuffle", "dataset", False)
    plan = _plan(**{**client.__dict__, "num_unique_prompts": 10})
    warm = plan.warmups[0]
    sent = warm + plan.stages[0].prompts
    assert len(warm) == 8 and len(sent) == 48
    # warm-ups are the order's first prompts; each pass of 10 sends every prompt once
    for start in range(0, 40, 10):
        assert sorted(sent[start:start + 10]) == list(range(10))
    assert sent != [i % 10 for i in range(48)]


def test_vllm_bench_warmups_stay_copies_of_the_first_prompt():
    plan = _plan(client_type="concurrency", max_concurrency=2, dataset="random", num_prompts=6,
                 num_warmups=3, num_unique_prompts=4, prompt_order="shuffle")
    assert plan.warmups == [[0], [0, 0, 0]]
    assert sorted(plan.stages[0].prompts[:4]) == [0, 1, 2, 3]


def test_dataset_warmups_without_a_pool_take_their_own_prompts():
    plan = _plan(client_type="concurrency", max_concurrency=2, dataset="random", num_prompts=5,
                 num_warmups=3, warmup_prompts="dataset", ready_check=False)
    assert plan.warmups == [[0, 1, 2]] and plan.stages[0].prompts == [3, 4, 5, 6, 7]
    assert len(plan.templates) == 8


def test_prompt_order_leaves_the_send_schedule_alone():
    base = dict(client_type="concurrency", max_concurrency=3, dataset="random", num_prompts=30,
                request_rate=20.0, num_unique_prompts=6, random_input_len=32,
                random_output_len=4)
    a = _plan(**base)
    b = _plan(**{**base, "prompt_order": "random"})
    assert np.array_equal(a.stages[0].offsets, b.stages[0].offsets)
    assert a.stages[0].prompts != b.stages[0].prompts


def _cached_share(order: str, pool: int) -> float:
    client = ClientConfig.preset("aiperf", max_concurrency=4, num_prompts=60, num_warmups=8,
                                 random_input_len=512, random_output_len=8,
                                 num_unique_prompts=pool, prompt_order=order)
    res = simulate(SimConfig().replace(enable_prefix_caching=True, client=client))
    df, info = res.requests, res.info["client"]
    # 68 sends (8 warm-ups, 60 measured); a repeat is a measured request whose prompt went
    # out before. Shuffled passes send each prompt once per pass: all but the first pass repeat.
    if order == "shuffle":
        assert info["num_distinct_prompts"] == min(pool, 68)
        assert info["num_repeated_prompts"] == max(0, 68 - pool)
    else:
        assert info["num_distinct_prompts"] <= pool
        assert info["num_repeated_prompts"] >= 60 - pool
    return df["num_cached_tokens"].sum() / df["num_prompt_tokens"].sum()


def test_a_reused_prompt_is_served_from_the_prefix_cache():
    # 68 sends over 20 prompts: after the first pass, every prompt is a hit (all but the
    # block vLLM recomputes); over 200 prompts nothing repeats and nothing hits.
    assert _cached_share("shuffle", 20) > 0.6
    assert _cached_share("random", 20) > 0.5
    assert _cached_share("shuffle", 200) == 0.0
