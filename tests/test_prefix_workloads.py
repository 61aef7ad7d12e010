"""Where block identity comes from: Mooncake traces, shared prefixes, closed-loop sessions; lpm."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest

import simsched
from simsched import SimConfig
from simsched.api import make_requests, simulate_checked
from simsched.config import CacheConfig, HardwareConfig
from simsched.engine.kv.prefix_cache import PrefixCache
from simsched.policies import make_queue
from simsched.request import Request
from simsched.workloads import hash_ids, traces
from simsched.workloads.sessions import parse_distribution
from simsched.workloads.workload import WorkloadConfig, generate

B = 16


def cfg(num_blocks=4000, block_size=B, **changes) -> SimConfig:
    # The classic preset: the first-occurrence analysis below counts hits as its "token" rule
    # and segments model do (a fully cached prompt recomputes one token, not a block).
    base = SimConfig.preset(
        "classic", check_invariants=True,
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks,
                          enable_prefix_caching=True),
        hardware=HardwareConfig(cost_model="unit", model="mistral-7b"))
    return base.replace(**changes) if changes else base


def first_occurrence_hit_rate(rows, block: int, trace_block: int) -> float:
    """Cached prompt tokens / prompt tokens if every earlier prompt's full blocks were cached.

    Written from the definition, independently of the simulator: KV block ``j`` of a prompt is
    the tokens ``[j*block, (j+1)*block)``; its identity is the trace ids of every trace block up
    to the one holding its last token, plus that token's offset there.
    """
    seen: set = set()
    hit = total = 0
    for ids, p in rows:
        keys = []
        prefixes = [tuple(ids[:t + 1]) for t in range(len(ids))]
        for j in range(p // block):
            last = (j + 1) * block - 1
            t = last // trace_block
            keys.append((prefixes[t], last - t * trace_block))
        n = 0
        while n < len(keys) and keys[n] in seen:
            n += 1
        hit += min(n * block, p - 1)
        total += p
        seen.update(keys)
    return hit / total


# ----------------------------------------------------------------------- Mooncake
def test_mooncake_trace_is_bundled_and_read():
    table = generate(WorkloadConfig.preset("mooncake"), np.random.default_rng(0))
    assert len(table) == 3993 and table.attrs["hash_block_size"] == 512
    assert table["arrival_at"].iloc[0] == 0.0
    assert table["arrival_at"].max() == pytest.approx(1022.025)      # milliseconds -> seconds
    n = table["num_prompt_tokens"].to_numpy()
    assert (table["hash_ids"].map(len).to_numpy() == -(-n // 512)).all()
    assert n.mean() == pytest.approx(15325.5, abs=1)


@pytest.mark.parametrize("block", [16, 48, 7])
def test_unbounded_cache_hit_rate_equals_first_occurrence_analysis(block):
    """Requests one at a time, a cache that never evicts: the simulator's hit rate is exact."""
    table = generate(WorkloadConfig.preset("mooncake"), np.random.default_rng(0))
    # A window of the trace with much reuse (conversations come back late in this trace).
    table = table[table["num_prompt_tokens"] + table["num_output_tokens"] <= 16384]
    table = table.iloc[2000:2250]
    rows = list(zip(table["hash_ids"], table["num_prompt_tokens"]))
    expected = first_occurrence_hit_rate(rows, block, 512)
    frame = table.assign(arrival_at=np.arange(len(table)) * 1e4)   # each finishes before the next
    total = int((table["num_prompt_tokens"] + table["num_output_tokens"]).sum())
    config = cfg(num_blocks=total // block + 2, block_size=block, max_num_batched_tokens=8192)
    res = simsched.simulate(config.replace(check_invariants=False), frame)
    assert res.summary()["num_evicted_blocks"] == 0
    assert res.summary()["prefix_hit_rate"] == pytest.approx(expected, abs=1e-12)
    assert expected > 0.4


def test_path_compression_keeps_sharing_exact():
    ids = [(1, 2, 3, 4), (1, 2, 3), (1, 2, 5), (1, 2, 3, 4)]
    prompts = [4 * 10, 3 * 10 - 4, 3 * 10, 3 * 10 + 1]
    merged = hash_ids.merged_hash_segments(ids, prompts, 10)
    assert merged == [((1, 20), (3, 20)), ((1, 20), (3, 6)), ((1, 20), (5, 10)),
                      ((1, 20), (3, 11))]
    assert [sum(n for _, n in m) for m in merged] == prompts


def test_generic_file_with_hash_ids_and_bad_lines(tmp_path):
    good = tmp_path / "t.csv"
    good.write_text('arrival_at,num_prompt_tokens,num_output_tokens,hash_ids,session_id\n'
                    '0.0,700,5,"[1, 2]",3\n0.5,300,5,1,\n')
    table, _ = traces.read_trace(good)
    assert table["hash_ids"].tolist() == [(1, 2), (1,)]
    assert table["session_id"].tolist() == [3, -1]
    bad = tmp_path / "b.csv"
    bad.write_text('arrival_at,num_prompt_tokens,num_output_tokens,hash_ids\n'
                   '0.0,700,5,"[1, 2]"\n0.5,300,5,"[1, x]"\n')
    with pytest.raises(traces.TraceFormatError, match="line 3.*hash_ids"):
        traces.read_trace(bad)
    short = tmp_path / "s.jsonl"
    short.write_text(json.dumps({"timestamp": 0, "input_length": 1100, "output_length": 2,
                                 "hash_ids": [1, 2]}) + "\n")
    with pytest.raises(traces.TraceFormatError, match="line 1: 2 hash_ids for a 1100-token"):
        traces.load_trace(short)


def test_clipping_a_long_prompt_cuts_its_hash_ids(tmp_path):
    path = tmp_path / "m.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"timestamp": 0, "input_length": 1500, "output_length": 2,
                            "hash_ids": [1, 2, 3]}) + "\n")
    with pytest.warns(traces.TraceWarning):
        table = traces.load_trace(path, max_prompt_tokens=600, long_prompt_policy="clip")
    assert table["hash_ids"].tolist() == [(1, 2)] and table["num_prompt_tokens"].tolist() == [600]


# ----------------------------------------------------------------------- shared prefix
def test_shared_prefix_workload_hits_the_group_prompts():
    wl = WorkloadConfig(name="shared-prefix", system_prompt_len=200, num_prefix_groups=3,
                        prompt_len=40, output_len=8, rate=2.0, num_requests=60)
    table = generate(wl, np.random.default_rng(1))
    assert (table["num_prompt_tokens"] == 240).all() and set(table["prefix_group"]) <= {0, 1, 2}
    res, _ = simulate_checked(cfg(num_blocks=600), table)
    cached = res.requests["num_cached_tokens"]
    first = ~table.sort_values("arrival_at")["prefix_group"].duplicated().to_numpy()
    assert (cached[~first] == 192).all() and (cached[first] == 0).all()   # 12 full blocks of 200
    with pytest.raises(ValueError, match="workload.system_prompt_len must be >= 1"):
        WorkloadConfig(name="shared-prefix")


# ----------------------------------------------------------------------- sessions
def test_distribution_specs_are_checked():
    assert parse_distribution("num_turns", 3, True) == ("fixed", 3.0)
    assert parse_distribution("think_time", ("exponential", 2), False) == ("exponential", 2.0)
    with pytest.raises(ValueError, match="workload.num_turns"):
        parse_distribution("num_turns", ("exponential", 2.0), True)
    with pytest.raises(ValueError, match="workload.think_time"):
        WorkloadConfig(name="sessions", think_time=("uniform", 3, 1))


def test_session_turns_wait_for_the_previous_turn_and_hit_its_cache():
    wl = WorkloadConfig(name="sessions", rate=0.5, num_requests=6, num_turns=("uniform", 2, 5),
                        think_time=("exponential", 3.0), lengths="uniform",
                        prompt_range=(20, 60), output_range=(5, 40))
    table = generate(wl, np.random.default_rng(3))
    res, engine = simulate_checked(cfg(num_blocks=2000), table)
    df = res.requests
    assert len(df) == len(table) and df["request_id"].tolist() == list(range(len(df)))
    assert (df["status"] == "finished").all()
    by_session = table.groupby("session_id", sort=False)
    for sid, turns in df.groupby("session_id"):
        plan = by_session.get_group(sid)
        assert turns["num_prompt_tokens"].tolist() == plan["num_prompt_tokens"].tolist()
        prev = None
        for (_, row), think in zip(turns.iterrows(), plan["think_time"]):
            if prev is None:
                assert row["arrival_at"] == pytest.approx(plan["arrival_at"].iloc[0])
                assert row["num_cached_tokens"] == 0
            else:
                # sent exactly think time after the previous turn finished ...
                assert row["arrival_at"] == pytest.approx(prev["finished_at"] + think)
                # ... and served every full block of the previous prompt and output from cache
                kv_tokens = prev["num_prompt_tokens"] + prev["num_output_tokens"] - 1
                assert row["num_cached_tokens"] == kv_tokens // B * B
            prev = row


def test_a_rejected_turn_ends_its_session():
    rows = pd.DataFrame({"arrival_at": [0.0, 0.0, 0.0], "num_prompt_tokens": [100, 30000, 30100],
                         "num_output_tokens": [10, 10, 10], "session_id": [0, 0, 0],
                         "think_time": [0.0, 1.0, 1.0]})
    res, _ = simulate_checked(cfg(num_blocks=1000), rows)
    assert res.requests["status"].tolist() == ["finished", "rejected"]


def test_closed_loop_rows_must_grow():
    rows = pd.DataFrame({"arrival_at": [0.0, 0.0], "num_prompt_tokens": [100, 105],
                         "num_output_tokens": [10, 10], "session_id": [4, 4],
                         "think_time": [0.0, 1.0]})
    with pytest.raises(ValueError, match="turn 1 of session 4"):
        simulate_checked(cfg(), rows)


# ----------------------------------------------------------------------- lpm
def test_lpm_serves_the_longest_cached_prefix_first_then_falls_back_to_fcfs():
    kv = PrefixCache(100, B)
    from simsched.engine.scheduler.core import Scheduler
    from simsched.config import SchedulerConfig

    sched = Scheduler(SchedulerConfig(policy="lpm", policy_options={"max_queue_len": 3}), kv)
    warm = make_requests(pd.DataFrame({"arrival_at": [0.0], "num_prompt_tokens": [160],
                                       "num_output_tokens": [1], "prefix_group": [1],
                                       "prefix_len": [160]}))[0]
    sched.add(warm, 0.0)
    sched.schedule(0.0)
    sched.commit(1.0)                                 # group 1's 160 tokens now cached
    table = pd.DataFrame({"arrival_at": [1.0, 2.0, 3.0], "num_prompt_tokens": [50, 200, 170],
                          "num_output_tokens": [1, 1, 1], "prefix_group": [0, 1, 1],
                          "prefix_len": [50, 160, 100]})
    reqs = make_requests(table)
    q = sched.queue
    for i, r in enumerate(reqs):
        r.id = 10 + i
        q.push(r, r.arrival_at)
    q.update(4.0)
    assert [q.pop().id for _ in range(3)] == [11, 12, 10]      # 160, 96, 0 cached tokens
    for i, r in enumerate(reqs + [Request(20, 0.5, 10, 1)]):
        q.push(r, 5.0)
    # 4 waiting > max_queue_len: the oldest (nothing cached) first, then 3 left: LPM again
    assert [q.pop().id for _ in range(4)] == [20, 11, 12, 10]
    with pytest.raises(ValueError, match="max_queue_len"):
        make_queue("lpm", {"max_queue_len": 1.5})
