"""vLLM's fitted silicon terms carried to other engines: the opt-in ``sglang_silicon`` profile
(simsched.cost.engine_profiles) and experiments.terms_transfer, which judges them on the SGLang
and TensorRT-LLM rows."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from experiments import terms_transfer as tt
from experiments import validate_silicon as vs
from simsched import SimConfig
from simsched.cost import engine_profiles, vllm_silicon
from simsched.cost.base import Batch
from simsched.cost.factory import make_cost_model
from simsched.cost.hardware import gpu_spec


def _model(model: str, profile: str, tp: int = 1, **extra):
    cfg = SimConfig.preset("sglang").replace(**{"model": model, "gpu": "h200",
                                                "tensor_parallel_size": tp,
                                                "hardware.engine_overhead": profile, **extra})
    return cfg, make_cost_model(cfg.hardware)


def test_the_profile_is_sglangs_with_vllms_fitted_terms_on_top():
    terms = engine_profiles.carried_terms("sglang_silicon")
    assert terms == {**engine_profiles.terms("sglang"), **vllm_silicon.fitted()}
    assert terms["prefill_expert_scale"] == vllm_silicon.shipped()["terms"]["prefill_expert_scale"]
    assert engine_profiles.engine_of("sglang_silicon") == "sglang"
    assert engine_profiles.engine_of("trtllm") == "trtllm"


def test_a_dense_model_on_one_gpu_times_as_sglang_and_fine_grained_experts_slower():
    prefill, decode = Batch([2048], [0]), Batch(num_decode_seqs=32, decode_context_sum=32 * 1500)
    # Llama-3.1-8B on one GPU: no experts, no all-reduce, so every term is neutral.
    _, dense = _model("llama-3.1-8b", "sglang")
    _, carried = _model("llama-3.1-8b", "sglang_silicon")
    for batch in (prefill, decode):
        assert carried.iteration_time(batch) == dense.iteration_time(batch)
    # Qwen3-30B-A3B: fine-grained experts, so prefill and decode steps both take longer.
    _, moe = _model("qwen3-30b-a3b", "sglang")
    _, moe_carried = _model("qwen3-30b-a3b", "sglang_silicon")
    for batch in (prefill, decode):
        assert moe_carried.iteration_time(batch) > moe.iteration_time(batch)
    assert "sglang_silicon" in moe_carried.describe()


def test_the_profile_reads_sglangs_own_kernel_tables_and_round_trips():
    cfg, _ = _model("llama-3.1-8b", "sglang_silicon", kernel_profile="aiconfigurator")
    assert gpu_spec(cfg.hardware).kernels == "aic-sglang-h200"
    assert SimConfig.from_json(cfg.to_json()) == cfg
    assert json.loads(cfg.to_json())["hardware"]["engine_overhead"] == "sglang_silicon"


def test_the_variants_of_each_engine():
    sg, trt = tt.variant_engine("sglang", "vllm terms"), tt.variant_engine("trtllm", "vllm terms")
    assert (sg.engine_overhead, sg.engine_terms) == ("sglang_silicon", None)
    assert trt.engine_overhead == "trtllm"
    assert trt.engine_terms == {**engine_profiles.terms("trtllm"), **vllm_silicon.fitted()}
    # SGLang's registered engine runs its preset's profile, which carries the terms.
    assert vs.ENGINES["sglang"].engine_overhead == "sglang_silicon"
    assert vs.ENGINES["trtllm"].engine_overhead == "trtllm"
    plain = tt.variant_engine("sglang", "without")
    assert (plain.engine_overhead, plain.engine_terms) == ("sglang", None)
    assert tt.variant_engine("trtllm", "without").engine_overhead == "trtllm"
    with pytest.raises(ValueError, match="variant must be one of"):
        tt.variant_engine("sglang", "fitted")


def _rows(engine: str, version: str, model: str, model_path: str, precision: str, tp: float):
    base = dict(backend=engine, backend_version=version, mode="agg", system="h200_sxm",
                gpu="h200", model=model, model_path=model_path, precision=precision,
                tp_size=tp, pp_size=1.0, attention_dp_size=1.0, moe_tp_size=tp,
                moe_ep_size=1.0, isl=1000, osl=20, silicon_ttft_ms=80.0, silicon_tpot_ms=10.0,
                silicon_data_source="test", aic_run=False)
    return pd.DataFrame([{**base, "id": f"{engine}{c}", "concurrency": float(c),
                          "batch_size": float(c)} for c in (2, 4)])


def test_the_experiment_runs_both_variants_and_the_same_in_parallel():
    rows = pd.concat([_rows("sglang", "0.5.9", "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "bf16",
                            1.0),
                      _rows("trtllm", "1.1.0", "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "bf16",
                            1.0)], ignore_index=True)
    table = tt.run(rows, jobs=1)
    assert table.expressible.all(), table.reason.unique()
    summ = tt.summary(table).set_index(["engine", "variant"])
    assert set(summ.index) == {(e, v) for e in tt.ENGINES for v in tt.VARIANTS}
    assert (summ.rows == 2).all()
    sim = table.set_index(["id", "variant"]).sim_ttft_ms
    # Fine-grained experts: vLLM's prefill expert term makes every prefill slower.
    for rid in rows.id:
        assert sim[rid, "vllm terms"] > sim[rid, "without"]
    grp = tt.groups(table)
    assert list(grp.columns) == ["backend", "gpu", "model", "layout", "ttft without",
                                 "ttft vllm terms", "tpot without", "tpot vllm terms", "rows"]
    parallel = tt.run(rows, jobs=2)
    pd.testing.assert_frame_equal(parallel, table)


def test_without_the_silicon_rows_the_experiment_says_so(tmp_path, capsys):
    empty = tt.main(["--data", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o")])
    assert empty.empty and "terms_transfer skipped" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tt.main(["--engines", "vllm", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit):
        tt.main(["--jobs", "0", "--data", str(tmp_path / "missing.csv"),
                 "--out", str(tmp_path / "o")])
