"""Property-based tests with the prefix cache on: random sharing, every invariant checked."""

from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz import livelock_guard
from simsched.api import simulate_checked
from simsched.engine.invariants import check_final_state
from simsched.engine.result_checks import check_results
from tests.test_properties import cases


def _with_prefix_caching(config):
    """``config`` with prefix caching on (the segments model under static batching, the only
    one modelled there; vLLM's block pool, the default, otherwise)."""
    changes = {"cache.enable_prefix_caching": True}
    if config.scheduler.style == "static":
        changes["cache.prefix_cache_model"] = "segments"
    return config.replace(**changes)


@st.composite
def shared_cases(draw):
    """A random scheduler case whose prompts share prefixes (system prompts or trace blocks)."""
    config, requests, impossible = draw(cases())
    config = _with_prefix_caching(config)
    rows = []
    if draw(st.booleans()):
        for t, p, o, prio in requests:
            rows.append({"arrival_at": t, "num_prompt_tokens": p, "num_output_tokens": o,
                         "priority": prio, "prefix_group": draw(st.integers(0, 2)),
                         "prefix_len": draw(st.integers(0, p))})
    else:
        block = draw(st.integers(1, 40))
        config = config.replace(hash_block_size=block)
        for t, p, o, prio in requests:
            need = -(-p // block)
            # a tiny alphabet, and often a copy of an earlier prompt's ids: lots of sharing
            ids = draw(st.lists(st.integers(0, 2), min_size=min(need, 6), max_size=min(need, 6)))
            ids = ids + [1000 + len(rows)] * (need - len(ids))
            if rows and draw(st.booleans()):
                ids = (list(rows[-1]["hash_ids"]) + ids)[:need]
            rows.append({"arrival_at": t, "num_prompt_tokens": p, "num_output_tokens": o,
                         "priority": prio, "hash_ids": ids})
    return config, rows, requests


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_cases())
def test_with_prefix_caching_every_request_finishes_and_invariants_hold(case):
    config, rows, requests = case
    limited = config.replace(max_sim_time=livelock_guard(config, requests))
    res, engine = simulate_checked(limited, pd.DataFrame(rows))
    assert res.summary()["num_unfinished"] == 0, "livelock: unfinished at the guard time"
    check_final_state(engine)
    check_results(res)
    df = res.requests
    assert (df["num_cached_tokens"] <= (df["num_prompt_tokens"] - 1).clip(lower=0)).all()


@st.composite
def session_cases(draw):
    """A random closed-loop workload on a random small engine."""
    config, _, _ = draw(cases())
    config = _with_prefix_caching(config)
    rows, tokens, think_total = [], 0, 0.0
    shared = draw(st.integers(0, 40))
    for s in range(draw(st.integers(1, 4))):
        start = draw(st.integers(0, 64)) / 16
        prompt = shared + draw(st.integers(1, 60))
        for k in range(draw(st.integers(1, 4))):
            output = draw(st.integers(1, 30))
            think = draw(st.integers(0, 32)) / 16 if k else 0.0
            rows.append({"arrival_at": start, "num_prompt_tokens": prompt,
                         "num_output_tokens": output, "session_id": s, "think_time": think,
                         "prefix_group": s % 2, "prefix_len": shared})
            tokens += prompt + output
            think_total += think
            prompt += output + draw(st.integers(1, 40))
    return config, rows, tokens, think_total


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(session_cases())
def test_sessions_with_prefix_caching_hold_every_invariant(case):
    config, rows, tokens, think_total = case
    guard = livelock_guard(config, [(4.0, tokens, 0, 0)]) + think_total
    res, engine = simulate_checked(config.replace(max_sim_time=guard), pd.DataFrame(rows))
    assert res.summary()["num_unfinished"] == 0
    check_final_state(engine)
    check_results(res)
    df = res.requests
    assert df["request_id"].tolist() == list(range(len(df)))
    # a session stops at its first rejected turn; every turn before it finished
    for _, turns in df.groupby("session_id"):
        status = turns["status"].tolist()
        assert status.count("rejected") <= 1 and "rejected" not in status[:-1]
