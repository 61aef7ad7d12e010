"""plan_ahead: a request whose last token is still in flight can be preempted, as vLLM's
``AsyncScheduler`` does it (issue 40): reported in the step, counted in ``num_preemptions`` (the
request frame, the iteration log, the preemption causes) and the request still finishes.

The hand-built case: two requests in a cache of four 4-token blocks; request 1 finishes in step
4 (its last token in flight while step 5 is planned), request 0 needs a block for step 5 and the
newest running request, 1, is the victim. vLLM 0.33.0 reports exactly this (its AsyncScheduler
preempts request 1 in step 5; its sync Scheduler does not), as
``benchmarks.vllm_parity``'s driver shows on this case; the recorded fixtures
(``tests/fixtures/vllm_parity/async.json``) hold such cases too.
"""

from __future__ import annotations

import pandas as pd
import pytest

import simsched
from simsched import SimConfig, UnitCostModel
from simsched.cluster import lazy


def _requests() -> pd.DataFrame:
    return pd.DataFrame({"arrival_at": [0.0, 0.0], "num_prompt_tokens": [4, 4],
                         "num_output_tokens": [8, 5]})


def _run(plan_ahead: bool, **kwargs):
    cfg = SimConfig().replace(block_size=4, num_blocks=4, max_num_seqs=4,
                              max_num_batched_tokens=64, plan_ahead=plan_ahead)
    return simsched.simulate(cfg, _requests(), cost_model=UnitCostModel(), record_steps=True,
                             **kwargs)


def _preempted_after_finishing(steps: pd.DataFrame) -> list[tuple[int, int]]:
    done = steps[steps["finished"]].set_index("request_id")["step"]
    pre = steps[steps["preempted"]]
    return [(int(r.request_id), int(r.step)) for r in pre.itertuples()
            if r.request_id in done.index and done[r.request_id] < r.step]


def test_in_flight_finish_is_preempted_and_counted():
    res = _run(plan_ahead=True)
    assert _preempted_after_finishing(res.steps) == [(1, 5)]
    req = res.requests.set_index("request_id")
    assert (req["status"] == "finished").all()
    assert req.loc[1, "num_preemptions"] == 1 and req.loc[0, "num_preemptions"] == 0
    assert req.loc[1, "num_recomputed_tokens"] == 0          # it recomputes nothing
    assert req.loc[1, "num_generated_tokens"] == 5
    assert int(res.iterations["num_preempted"].sum()) == 1
    causes = res.preemptions
    assert causes["request_id"].tolist() == [1] and causes["num_lost_tokens"].tolist() == [0]
    # The step still admits nobody and request 0 runs on alone to its end.
    assert res.steps[res.steps["step"] > 5]["request_id"].unique().tolist() == [0]


def test_sync_scheduler_does_not_preempt_a_finished_request():
    res = _run(plan_ahead=False)
    assert _preempted_after_finishing(res.steps) == []
    assert int(res.requests["num_preemptions"].sum()) == 0


def test_recorded_after_the_preemption_when_records_flush_each_request(monkeypatch):
    """The request frame's store copies a finished request only once its blocks are released
    (the next plan): flushed one request at a time, the late preemption still counts."""
    monkeypatch.setattr(lazy, "_BATCH", 1)
    res = _run(plan_ahead=True)
    assert res.requests.set_index("request_id").loc[1, "num_preemptions"] == 1


def test_streamed_frame_counts_the_late_preemption(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    from simsched.analysis import stream

    monkeypatch.setattr(stream, "CHUNK", 1)        # a part written per ended request
    cfg = SimConfig().replace(block_size=4, num_blocks=4, max_num_seqs=4,
                              max_num_batched_tokens=64, plan_ahead=True)
    simsched.simulate(cfg, _requests(), cost_model=UnitCostModel(), stream_to=tmp_path / "run")
    frames = stream.read_stream(tmp_path / "run")
    assert frames["requests"].set_index("request_id").loc[1, "num_preemptions"] == 1
    assert frames["preemptions"]["request_id"].tolist() == [1]
