"""Disaggregated silicon rows (experiments._silicon_layout): their workers, link, concurrency and
refusals, and one simulated end to end through experiments.validate_silicon."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments import _silicon_layout as sl
from experiments import validate_silicon as vs


def _row(**fields):
    """A disaggregated row as validate_silicon reads it (AIConfigurator's Qwen3-32B 8P2D run:
    eight TP-1 prefill workers, two TP-4 decode workers)."""
    base = dict(id="d", backend="vllm", mode="disagg", system="h100_sxm", gpu="h100-sxm",
                model="qwen3-32b-fp8", model_path="Qwen/Qwen3-32B", precision="fp8",
                tp_size=np.nan, pp_size=np.nan, attention_dp_size=np.nan, moe_tp_size=np.nan,
                moe_ep_size=np.nan, batch_size=np.nan, isl=4000, osl=1000, aic_run=True,
                prefill_batch_size=1.0, prefill_num_workers=8.0, prefill_tp_size=1.0,
                prefill_pp_size=1.0, prefill_attention_dp_size=1.0, prefill_moe_tp_size=0.0,
                prefill_moe_ep_size=0.0, decode_batch_size=224.0, decode_num_workers=2.0,
                decode_tp_size=4.0, decode_pp_size=1.0, decode_attention_dp_size=1.0,
                decode_moe_tp_size=0.0, decode_moe_ep_size=0.0, silicon_data_source="x")
    base.update(fields)
    frame = pd.DataFrame([base])
    frame["concurrency"] = sl.concurrency(frame)
    return next(frame.itertuples())


def test_concurrency_is_the_decode_workers_batch_summed():
    assert _row().concurrency == 448.0
    assert _row(decode_batch_size=7.0, decode_attention_dp_size=8.0,
                decode_num_workers=1.0).concurrency == 56.0
    agg = pd.DataFrame([dict(mode="agg", decode_batch_size=np.nan,
                             decode_attention_dp_size=np.nan, decode_num_workers=np.nan)])
    assert sl.concurrency(agg).isna().all()


def test_workers_are_laid_out_per_role():
    row = _row()
    assert vs.label_of(row) == "p8xtp1-d2xtp4"
    assert (sl.total_gpus(row), sl.link_of(row)) == (16, {"link": "ib400"})
    # AIConfigurator writes a 4-GPU DEP worker as tp 1 with 4 attention ranks.
    dep = _row(prefill_num_workers=1.0, prefill_attention_dp_size=4.0,
               decode_num_workers=1.0, decode_tp_size=2.0)
    assert vs.label_of(dep) == "p1xdep4-d1xtp2"
    assert sl.worker_gpus(sl.role_row(dep, "prefill")) == 4
    # Six GPUs fit the H100's 8-GPU NVLink domain: the KV moves over NVLink 4.
    assert sl.link_of(dep) == {"link": "nvlink", "link_bandwidth_gbps": 450.0}


def test_unrecorded_and_multi_node_workers_are_refused_by_name():
    assert vs.why_not(_row(), "vllm") == ""
    reason = vs.why_not(_row(prefill_num_workers=np.nan), "vllm")
    assert reason.startswith("disaggregated deployment: prefill worker count")
    reason = vs.why_not(_row(decode_tp_size=16.0), "vllm")
    assert "a decode worker spans 16 GPUs" in reason
    assert vs.why_not(_row(model=None), "vllm").startswith("no preset")


def test_the_cluster_has_each_roles_workers_and_settings():
    cfg, client = vs.config_of(_row(), vs.ENGINES["vllm"], num_prompts=16)
    assert client == "inferencex (assumed)"
    assert cfg.cluster.num_replicas == 10 and cfg.cluster.disaggregated
    replicas = cfg.replica_configs()
    assert [c.hardware.tensor_parallel_size for c in replicas] == [1] * 8 + [4] * 2
    assert cfg.cluster.replica_roles() == ["prefill"] * 8 + ["decode"] * 2
    assert (cfg.cluster.router, cfg.cluster.decode_router) == ("round_robin", "round_robin")
    assert cfg.client.max_concurrency == 448 and cfg.client.num_prompts == 16


def test_a_disaggregated_row_runs_prefill_and_decode_on_their_own_workers():
    row = _row(decode_batch_size=4.0, isl=512, osl=32)
    cfg, _ = vs.config_of(row, vs.ENGINES["vllm"], num_prompts=24)
    from simsched import simulate

    res = simulate(cfg)
    req = res.requests
    assert len(req) == 24 and req.prefill_replica.between(0, 7).all()
    assert req.decode_replica.between(8, 9).all()
    assert (req.kv_transfer_bytes > 0).all()
    out = vs.simulate_row(row, vs.ENGINES["vllm"], num_prompts=24)
    assert out["reason"] == "" and out["layout"] == "p8xtp1-d2xtp4"
    assert out["sim_ttft_ms"] > 0 and out["sim_tpot_ms"] > 0


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_engines_without_hand_off_say_so(engine):
    out = vs.simulate_row(_row(backend=engine), vs.ENGINES[engine], num_prompts=8)
    assert "does not model disaggregated prefill/decode" in out["reason"]


def test_engine_terms_are_refused_for_a_disaggregated_row_and_the_profile_times_each_pool():
    # One cost model from engine terms would time the TP-1 prefill workers at the decode
    # workers' TP 4; a profile by name builds each pool's own.
    import dataclasses

    from simsched.cost import vllm_silicon

    row = _row(decode_batch_size=4.0, isl=512, osl=32)
    termed = dataclasses.replace(vs.ENGINES["vllm"], engine_terms=vllm_silicon.neutral())
    out = vs.simulate_row(row, termed, num_prompts=24)
    assert "engine terms are not applied to a disaggregated row" in out["reason"]
    assert "sim_ttft_ms" not in out
    named = dataclasses.replace(vs.ENGINES["vllm"], engine_overhead="vllm_v1")
    assert vs.simulate_row(row, named, num_prompts=24)["reason"] == ""
