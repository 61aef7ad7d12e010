"""The per-step record: ``simulate(..., record_steps=True)`` gives ``Results.steps`` (issue 25)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import simsched
from simsched import CacheConfig, SchedulerConfig, SimConfig, UnitCostModel
from simsched.analysis.runner import run
from simsched.engine.steps import STEP_COLUMNS

ROOT = Path(__file__).resolve().parent.parent


def _config(**changes) -> SimConfig:
    cfg = SimConfig(scheduler=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4),
                    cache=CacheConfig(block_size=4, num_blocks=12, watermark=0.0))
    return cfg.replace(**changes) if changes else cfg


REQUESTS = [(0, 10, 5), (0, 12, 8), (1, 7, 6), (2, 20, 3)]


def _run(cfg=None, requests=REQUESTS, record=True):
    return simsched.simulate(cfg or _config(), requests, cost_model=UnitCostModel(),
                             record_steps=record)


def test_off_by_default_and_nothing_installed():
    res = _run(record=False)
    assert res.steps is None and "steps" not in res.frames()
    _, engine = run(_config(), REQUESTS, UnitCostModel(), keep_engine=True)
    sched = engine.replicas[0].scheduler
    # Off, the scheduler's methods are the class's own: no wrapper, no per-iteration test.
    assert "schedule" not in sched.__dict__ and "commit" not in sched.__dict__


def test_first_steps_are_the_budgeted_schedule():
    steps = _run().steps
    assert list(steps.columns) == list(STEP_COLUMNS)
    first = steps[steps["step"] == 0]
    # Budget 16 at t=0: request 0's 10-token prompt, then 6 of request 1's 12.
    assert first[["request_id", "num_prefill_tokens", "num_decode_tokens"]].values.tolist() \
        == [[0, 10, 0], [1, 6, 0]]
    second = steps[steps["step"] == 1]
    # t=1: request 0 decodes (1), request 1 finishes its prompt (6), request 2 (arrived at 1)
    # takes the remaining 9 of the budget: its whole 7-token prompt.
    assert second[["request_id", "num_prefill_tokens", "num_decode_tokens"]].values.tolist() \
        == [[0, 0, 1], [1, 6, 0], [2, 7, 0]]
    assert (second["started_at"] == 1.0).all()


def test_steps_agree_with_the_other_frames():
    res = _run()
    steps, reqs = res.steps, res.requests.set_index("request_id")
    assert len(res.preemptions) > 0          # the 12-block cache forces at least one
    for rid, rows in steps.groupby("request_id"):
        req = reqs.loc[rid]
        recomputed = int(res.preemptions.loc[res.preemptions["request_id"] == rid,
                                             "num_lost_tokens"].sum())
        assert rows["num_prefill_tokens"].sum() == req["num_prompt_tokens"] + recomputed
        assert rows["num_decode_tokens"].sum() + rows["num_prefill_tokens"].gt(0).sum() \
            - int(rows["preempted"].sum()) >= req["num_output_tokens"] - 1
        done = rows[rows["finished"]]
        assert len(done) == 1 and done["started_at"].iloc[0] + 1.0 == req["finished_at"]
    preempted = steps[steps["preempted"]][["request_id", "started_at"]]
    assert sorted(map(tuple, preempted.values.tolist())) == \
        sorted(map(tuple, res.preemptions[["request_id", "at"]].values.tolist()))


def test_cached_tokens_are_the_admissions_prefix_hits():
    table = pd.DataFrame({"arrival_at": [0.0, 5.0, 5.0], "num_prompt_tokens": [40, 40, 30],
                          "num_output_tokens": [3, 3, 3], "prefix_group": [1, 1, 1],
                          "prefix_len": [32, 32, 32]})
    res = _run(_config(enable_prefix_caching=True, num_blocks=64, max_num_batched_tokens=64),
               table)
    steps = res.steps
    admitted = steps[steps["num_cached_tokens"] > 0]
    assert admitted["request_id"].tolist() == [1, 2]
    # Request 1 shares the 32-token system prompt; request 2's 30-token prompt is all shared, and
    # the cache serves whole blocks of it short of its last token: 7 blocks of 4.
    assert admitted["num_cached_tokens"].tolist() == [32, 28]
    reqs = res.requests.set_index("request_id")
    for rid, cached in zip(admitted["request_id"], admitted["num_cached_tokens"]):
        assert cached == reqs.loc[rid, "num_cached_tokens"]


def test_recording_changes_nothing():
    cfg = _config(enable_prefix_caching=True)
    table = pd.DataFrame({"arrival_at": [0, 0, 1, 2, 2], "num_prompt_tokens": [10, 12, 7, 20, 9],
                          "num_output_tokens": [5, 8, 6, 3, 7], "prefix_group": [0, 0, 1, 0, 1],
                          "prefix_len": [8, 8, 4, 8, 4]})
    off, on = _run(cfg, table, record=False), _run(cfg, table)
    pd.testing.assert_frame_equal(off.requests, on.requests)
    pd.testing.assert_frame_equal(off.iterations, on.iterations)
    assert len(on.steps["step"].unique()) == len(on.iterations)


def test_every_replica_is_recorded():
    cfg = _config(num_replicas=2, router="round_robin")
    steps = _run(cfg, [(0, 10, 4), (0, 10, 4), (1, 6, 3), (1, 6, 3)]).steps
    assert sorted(steps["replica"].unique()) == [0, 1]
    for _, rows in steps.groupby("replica"):
        assert rows["request_id"].nunique() == 2


@pytest.mark.parametrize("flag", [True, False])
def test_cli_writes_steps_csv_only_when_asked(tmp_path, flag):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "simsched", "run", "--num-requests", "5", "--num-blocks", "64",
           "--cost-model", "unit", "--out", str(out)] + (["--record-steps"] if flag else [])
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    assert (out / "steps.csv").exists() == flag
    if flag:
        steps = pd.read_csv(out / "steps.csv")
        assert list(steps.columns) == list(STEP_COLUMNS)
        assert steps.groupby("request_id")["finished"].sum().eq(1).all()
