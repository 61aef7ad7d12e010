"""SGLang's and TensorRT-LLM's overlap schedulers as the replica's arrival rule (on under their
engine profiles, as in both real engines; off with ``scheduler.async_scheduling=False``): a
request arriving while step k runs joins step k + 2 at the earliest; decisions and step times
are otherwise those of the engine's normal loop."""

from __future__ import annotations

import pytest

from simsched import SimConfig, simulate
from simsched.config import pipeline
from simsched.cost.factory import make_cost_model
from simsched.cost.base import UnitCostModel


def _run(engine: str, overlap):
    cfg = SimConfig.preset(engine).replace(**{"scheduler.async_scheduling": overlap,
                                              "workload.num_requests": 300, "seed": 3})
    return cfg, simulate(cfg)


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_the_overlap_rule_is_the_default_and_delays_first_tokens_by_about_a_step(engine):
    base_cfg, base = _run(engine, False)
    cfg, lagged = _run(engine, None)
    assert not pipeline.arrival_rule(base_cfg, make_cost_model(base_cfg.hardware))
    assert pipeline.arrival_rule(cfg, make_cost_model(cfg.hardware))
    assert not pipeline.plan_ahead(cfg, make_cost_model(cfg.hardware))
    a = base.requests.set_index("request_id")
    b = lagged.requests.set_index("request_id")
    assert len(a) == len(b) == 300
    # Same work: every request still gets all its tokens.
    assert (a.num_output_tokens == b.num_output_tokens).all()
    # No first token comes earlier, and on average they come later, by less than a few steps.
    step = base.iterations.duration.median()
    assert (b.ttft >= a.ttft - 1e-9).mean() > 0.9
    delay = b.ttft.mean() - a.ttft.mean()
    assert 0.2 * step < delay < 5 * step
    # A request that arrives while a step runs is never scheduled in the step right after it.
    it = lagged.iterations.sort_values("started_at")
    starts, ends = it.started_at.to_numpy(), (it.started_at + it.duration).to_numpy()
    first, done = b.first_scheduled_at.to_numpy(), b.engine_finished_at.to_numpy()
    busy = 0
    for arrived, scheduled in zip(b.arrival_at, b.first_scheduled_at):
        i = starts.searchsorted(arrived, side="left") - 1    # the last step started before
        if i < 0 or ends[i] <= arrived or i + 1 >= len(starts) or starts[i + 1] != ends[i] \
                or not ((first <= starts[i]) & (done > ends[i])).any():
            # The GPU was idle, or the next step is not back to back, or the planned next step
            # had nothing left to run (it is planned again at once, seeing every arrival).
            continue
        busy += 1
        assert scheduled > starts[i + 1] or scheduled < arrived, (arrived, scheduled)
    assert busy > 50


def test_plan_ahead_stays_vllms_and_the_flag_round_trips():
    with pytest.raises(ValueError, match="plan_ahead"):
        SimConfig.preset("sglang").replace(**{"scheduler.plan_ahead": True})
    cfg = SimConfig.preset("trtllm").replace(**{"scheduler.async_scheduling": False})
    assert SimConfig.from_json(cfg.to_json()) == cfg
    # None follows the profile: on for the engines' own (and the opt-in sglang_silicon), off
    # for a cost model with no profile; True and False say so whatever the profile.
    for engine, profile in (("sglang", "sglang"), ("sglang", "sglang_silicon"),
                            ("trtllm", "trtllm")):
        on = SimConfig.preset(engine).replace(**{"hardware.engine_overhead": profile})
        assert pipeline.arrival_rule(on, make_cost_model(on.hardware))
        assert not pipeline.plan_ahead(on, make_cost_model(on.hardware))
        assert not pipeline.arrival_rule(on, UnitCostModel())
        assert pipeline.arrival_rule(on.replace(**{"scheduler.async_scheduling": True}),
                                     UnitCostModel())
    off = SimConfig.preset("sglang").replace(**{"scheduler.async_scheduling": False})
    assert not pipeline.arrival_rule(off, make_cost_model(off.hardware))
    # vLLM's engine keeps its own rule: under the SGLang profile it is not pipelined.
    vllm = SimConfig().replace(**{"hardware.engine_overhead": "sglang"})
    assert not pipeline.arrival_rule(vllm, make_cost_model(vllm.hardware))


def test_engine_silicon_runs_the_rows_without_the_overlap_rule_when_asked():
    import pandas as pd

    from experiments import engine_silicon
    from tests.test_terms_transfer import _rows

    rows = _rows("sglang", "0.5.9", "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "bf16", 1.0)
    plain = engine_silicon.run(rows, ("sglang",), kernels=("default",), overlap=False)
    lagged = engine_silicon.run(rows, ("sglang",), kernels=("default",))
    assert plain.expressible.all() and lagged.expressible.all()
    assert (lagged.sim_ttft_ms.to_numpy() > plain.sim_ttft_ms.to_numpy()).all()
    pd.testing.assert_series_equal(plain.id, lagged.id)
