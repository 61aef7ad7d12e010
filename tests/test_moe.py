"""Mixture-of-experts models, quantisation, expert and pipeline parallelism (issue 26)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import simsched
from simsched import SimConfig
from simsched.config.parallel import ParallelConfig
from simsched.cost import factory, hardware, moe, shapes
from simsched.cost.base import Batch
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.hardware import GPUS, MODELS, ModelSpec
from simsched.cost.parallel import ParallelCostModel, transfer_time

SCOUT = "llama-4-scout-17b-16e"
H100 = GPUS["h100-sxm"]


# ----------------------------------------------------------------------------- routing


@pytest.mark.parametrize("num_experts,top_k,skew", [(8, 2, 0.0), (16, 1, 0.0), (128, 8, 0.0),
                                                    (64, 4, 1.0)])
def test_expected_distinct_experts_matches_a_monte_carlo_of_routing(num_experts, top_k, skew):
    rng = np.random.default_rng(0)
    share = shapes.expert_hit_probabilities(num_experts, top_k, skew)
    share = share / share.sum()
    for tokens in (1, 3, 10, 40, 100):
        trials = 400
        # Each token picks top_k distinct experts, by popularity (Gumbel top-k: sampling
        # without replacement in proportion to ``share``).
        keys = np.log(share) + rng.gumbel(size=(trials, tokens, num_experts))
        picks = np.argsort(-keys, axis=2)[:, :, :top_k].reshape(trials, -1)
        hit = np.array([len(np.unique(row)) for row in picks])
        expected = float(shapes.expected_distinct_experts(tokens, num_experts, top_k, skew))
        if skew == 0.0:
            assert expected == pytest.approx(num_experts * (1 - (1 - top_k / num_experts)
                                                            ** tokens))
        # Uniform routing is exact; Zipf without replacement is close to independent hits.
        tol = 0.03 if skew == 0.0 else 0.08
        assert expected == pytest.approx(hit.mean(), rel=tol), (tokens, expected, hit.mean())


def test_skewed_routing_hits_fewer_experts_than_uniform():
    n = np.array([4, 16, 64])
    uniform = shapes.expected_distinct_experts(n, 64, 4)
    skewed = shapes.expected_distinct_experts(n, 64, 4, skew=1.2)
    assert (skewed < uniform).all()


# ----------------------------------------------------------------------------- shapes, memory


def test_presets_have_their_published_sizes():
    total = {"mixtral-8x7b": 46.7e9, "mixtral-8x22b": 140.6e9, SCOUT: 107.8e9,
             "qwen3-30b-a3b": 30.5e9, "deepseek-v3": 671.0e9}
    for name, params in total.items():
        assert MODELS[name].num_params == pytest.approx(params, rel=0.01), name
    # DeepSeek-V3's MLA caches 576 values per token and layer, not 2 x 128 heads x 128.
    ds = MODELS["deepseek-v3"]
    assert ds.kv_bytes_per_token == 61 * (512 + 64) * 2


def test_fp8_halves_weight_bytes_and_doubles_kv_capacity():
    spec = MODELS["mixtral-8x7b"]
    fp8 = dataclasses.replace(spec, weight_dtype="fp8")
    counts = shapes.param_counts(spec)
    linear = counts["dense"] + counts["experts"]
    bf16_linear = spec.param_bytes - (counts["embedding"] + counts["other"]) * 2
    fp8_linear = fp8.param_bytes - (counts["embedding"] + counts["other"]) * 2
    assert bf16_linear == 2 * linear and fp8_linear == linear
    int4 = dataclasses.replace(spec, weight_dtype="int4")
    assert int4.param_bytes - (counts["embedding"] + counts["other"]) * 2 == linear // 2
    # KV: half the bytes per token, so (for the same free memory) twice the blocks.
    kv8 = dataclasses.replace(spec, kv_cache_dtype="fp8")
    assert kv8.kv_bytes_per_token * 2 == spec.kv_bytes_per_token
    hw = dict(model="mixtral-8x7b", gpu="h100-sxm", tensor_parallel_size=2)
    cfg = SimConfig().replace(**hw).hardware
    cfg8 = SimConfig().replace(**{**hw, "model": "mixtral-kv8"}, model_spec=kv8).hardware
    b16, b8 = hardware.kv_capacity_blocks(cfg, 16), hardware.kv_capacity_blocks(cfg8, 16)
    assert b8 in (2 * b16, 2 * b16 + 1)
    # FP8 weights free memory for KV: more blocks.
    cfgw = SimConfig().replace(**{**hw, "model": "mixtral-fp8"},
                               model_spec=dataclasses.replace(spec, weight_dtype="fp8")).hardware
    assert hardware.kv_capacity_blocks(cfgw, 16) > 1.5 * b16


def test_fp8_weights_make_bandwidth_bound_decode_faster():
    spec = MODELS["mixtral-8x7b"]
    bf = CalibratedCostModel(spec, H100, 2, engine_overhead="none")
    f8 = CalibratedCostModel(dataclasses.replace(spec, weight_dtype="fp8"), H100, 2,
                             engine_overhead="none")
    b = Batch([], [], 8, 8 * 500)
    ratio = f8.breakdown(b)["linear"] / bf.breakdown(b)["linear"]
    assert 0.45 < ratio < 0.7   # weights halve; activations and fixed launch times do not


def test_more_tokens_hit_more_experts_and_cost_more_but_sublinearly():
    m = CalibratedCostModel(dataclasses.replace(MODELS[SCOUT], weight_dtype="fp8"), H100, 2,
                            engine_overhead="none")
    t = [m.breakdown(Batch([], [], n, n * 500))["linear"] for n in (1, 4, 16, 64)]
    assert t == sorted(t)
    # 1 token reads 1 of 16 experts; 64 tokens nearly all 16, so far less than 64x the time.
    assert t[-1] / t[0] < 8


def test_hf_config_of_each_moe_layout():
    mixtral = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
               "max_position_embeddings": 32768, "num_local_experts": 8,
               "num_experts_per_tok": 2, "hidden_act": "silu"}
    assert ModelSpec.from_hf_config(mixtral) == MODELS["mixtral-8x7b"]
    scout = {"text_config": {"num_hidden_layers": 48, "hidden_size": 5120,
                             "num_attention_heads": 40, "num_key_value_heads": 8,
                             "head_dim": 128, "intermediate_size": 8192,
                             "intermediate_size_mlp": 16384, "vocab_size": 202048,
                             "max_position_embeddings": 131072, "num_local_experts": 16,
                             "num_experts_per_tok": 1, "interleave_moe_layer_step": 1}}
    assert ModelSpec.from_hf_config(scout) == MODELS[SCOUT]
    qwen = {"num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "vocab_size": 151936, "num_experts": 128,
            "num_experts_per_tok": 8, "decoder_sparse_step": 1,
            "max_position_embeddings": 40960}
    assert ModelSpec.from_hf_config(qwen) == MODELS["qwen3-30b-a3b"]
    ds = {"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
          "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
          "vocab_size": 129280, "n_routed_experts": 256, "num_experts_per_tok": 8,
          "n_shared_experts": 1, "first_k_dense_replace": 3, "moe_layer_freq": 1,
          "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
          "qk_nope_head_dim": 128, "v_head_dim": 128, "max_position_embeddings": 163840,
          "quantization_config": {"quant_method": "fp8"}}
    assert ModelSpec.from_hf_config(ds) == MODELS["deepseek-v3"]


@pytest.mark.parametrize("bad,field", [(dict(num_experts=8, experts_per_token=9),
                                        "experts_per_token"),
                                       (dict(experts_per_token=2), "num_experts"),
                                       (dict(weight_dtype="fp4"), "weight_dtype"),
                                       (dict(kv_cache_dtype="int4"), "kv_cache_dtype"),
                                       (dict(moe_layer_step=0), "moe_layer_step")])
def test_bad_moe_fields_are_refused_naming_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        ModelSpec(32, 4096, 32, 8, 14336, 32000, **bad)


# ----------------------------------------------------------------------------- expert parallel


def test_all_to_all_grows_with_tokens_and_ranks():
    spec = MODELS["qwen3-30b-a3b"]
    link = H100.interconnect_bandwidth / 2
    tokens = np.array([1, 16, 256, 2048])
    by_tokens = moe.all_to_all_time(tokens, 8, spec, link)
    assert (np.diff(by_tokens) > 0).all()
    by_ranks = [float(moe.all_to_all_time(256, r, spec, link)) for r in (2, 4, 8, 16)]
    assert by_ranks == sorted(by_ranks) and by_ranks[0] < by_ranks[-1]
    assert float(moe.all_to_all_time(256, 1, spec, link)) == 0.0


def test_expert_parallel_step_waits_for_the_slowest_rank():
    spec = MODELS["qwen3-30b-a3b"]
    par = ParallelConfig(enable_expert_parallel=True)
    uniform = CalibratedCostModel(spec, H100, 4, engine_overhead="none", parallel=par)
    skewed = CalibratedCostModel(spec, H100, 4, engine_overhead="none",
                                 parallel=dataclasses.replace(par, expert_routing_skew=1.5))
    b = Batch([4096], [0])
    # Every expert is hit either way; skew puts more of the tokens on the rank holding the
    # popular experts, and the step waits for it.
    assert skewed.breakdown(b)["linear"] > uniform.breakdown(b)["linear"]
    # Attention tensor-parallel (dp 1): every rank holds every token and the block's output
    # all-reduce combines the experts' rows, so EP sends nothing more; across data-parallel
    # ranks the tokens go to their experts' ranks and back (two all-to-alls per layer).
    plain = CalibratedCostModel(spec, H100, 4, engine_overhead="none")
    assert uniform.breakdown(b)["communication"] == plain.breakdown(b)["communication"]
    dep = CalibratedCostModel(spec, H100, 1, engine_overhead="none", parallel=ParallelConfig(
        enable_expert_parallel=True, data_parallel_size=4))
    dp_only = CalibratedCostModel(spec, H100, 1, engine_overhead="none",
                                  parallel=ParallelConfig(data_parallel_size=4))
    assert dep.breakdown(b)["communication"] > dp_only.breakdown(b)["communication"] == 0.0


# ----------------------------------------------------------------------------- pipeline


def test_pipeline_with_one_micro_batch_is_the_sum_of_stage_times():
    spec = MODELS["mixtral-8x7b"]
    par = ParallelConfig(pipeline_parallel_size=2, num_micro_batches=1)
    pp = ParallelCostModel(spec, H100, 2, par, "mixtral-8x7b")
    half = dataclasses.replace(spec, num_layers=16)
    last = CalibratedCostModel(half, H100, 2, engine_overhead="vllm_v1", parallel=par)
    first = CalibratedCostModel(half, H100, 2, engine_overhead="none", parallel=par)
    for b in (Batch([], [], 32, 32 * 700), Batch([1024], [0], 8, 8 * 300)):
        hop = b.num_tokens * spec.hidden_size * 2 / (H100.interconnect_bandwidth / 2)
        assert pp.iteration_time(b) == pytest.approx(
            first.iteration_time(b) + last.iteration_time(b) + hop, rel=1e-12)
        assert transfer_time(b.num_tokens, spec, H100, False, 50e9) == pytest.approx(hop)
    # A lone decode is not sped up by the pipeline (each stage pays its launches).
    whole = CalibratedCostModel(spec, H100, 2, engine_overhead="vllm_v1")
    lone = Batch([], [], 1, 500)
    assert whole.iteration_time(lone) < pp.iteration_time(lone) < 1.5 * whole.iteration_time(lone)


def test_pipeline_micro_batches_in_flight_shorten_a_big_batch_iteration():
    spec = MODELS["mixtral-8x7b"]
    one = ParallelCostModel(spec, H100, 2, ParallelConfig(pipeline_parallel_size=4,
                                                          num_micro_batches=1))
    four = ParallelCostModel(spec, H100, 2, ParallelConfig(pipeline_parallel_size=4))
    big = Batch([2048, 2048, 2048, 2048], [0, 0, 0, 0])
    assert four.iteration_time(big) < 0.5 * one.iteration_time(big)
    # Fewer sequences than stages: the bubble, no gain.
    lone = Batch([], [], 1, 100)
    assert four.iteration_time(lone) == one.iteration_time(lone)


def test_pipeline_stages_hold_fewer_weights_and_more_kv_per_gpu():
    base = dict(model="mixtral-8x7b", gpu="h100-sxm", tensor_parallel_size=2)
    plain = hardware.kv_capacity_blocks(SimConfig().replace(**base).hardware, 16)
    pp = SimConfig().replace(**base, parallel=ParallelConfig(pipeline_parallel_size=2))
    assert hardware.kv_capacity_blocks(pp.hardware, 16) > 2 * plain


# ----------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("model,tp,par,match", [
    ("mixtral-8x7b", 2, dict(pipeline_parallel_size=2, num_gpus=8), "= 4 GPUs, but num_gpus"),
    ("llama-2-7b", 1, dict(data_parallel_size=2), "mixture-of-experts"),
    ("llama-2-7b", 1, dict(enable_expert_parallel=True), "mixture-of-experts"),
    ("mixtral-8x7b", 4, dict(enable_expert_parallel=True, data_parallel_size=4),
     "16 ranks, which must divide"),
    ("mixtral-8x7b", 1, dict(pipeline_parallel_size=64), "exceeds"),
    ("mixtral-8x7b", 2, dict(pipeline_parallel_size=2, num_micro_batches=3),
     "num_micro_batches"),
])
def test_invalid_parallel_layouts_are_refused_with_a_clear_message(model, tp, par, match):
    with pytest.raises(ValueError, match=match):
        SimConfig().replace(model=model, gpu="h100-sxm", tensor_parallel_size=tp,
                            parallel=par)


def test_parallel_config_round_trips_through_json():
    cfg = SimConfig().replace(model="qwen3-30b-a3b", gpu="h100-sxm", tensor_parallel_size=2,
                              parallel=ParallelConfig(data_parallel_size=4,
                                                      enable_expert_parallel=True,
                                                      num_gpus=8))
    assert SimConfig.from_json(cfg.to_json()) == cfg


# ----------------------------------------------------------------------------- end to end


def test_dense_model_with_new_fields_at_defaults_is_bit_identical():
    base = SimConfig().replace(num_requests=60, rate=8.0, seed=3)
    spec = dataclasses.replace(MODELS["llama-2-7b"], num_experts=0, weight_dtype="auto",
                               kv_cache_dtype="auto", kv_lora_rank=0)
    assert spec == MODELS["llama-2-7b"]
    a = simsched.simulate(base).requests
    b = simsched.simulate(base.replace(parallel=None)).requests
    assert a.equals(b)


@pytest.mark.parametrize("par", [None, dict(pipeline_parallel_size=2),
                                 dict(data_parallel_size=2, enable_expert_parallel=True)])
def test_moe_runs_hold_the_engine_invariants(par):
    cfg = SimConfig(check_invariants=True).replace(
        model="mixtral-8x7b", gpu="h100-sxm", tensor_parallel_size=2, num_requests=80,
        rate=20.0, seed=1, parallel=par, enable_prefix_caching=True)
    res = simsched.simulate(cfg)
    done = res.requests[res.requests.status == "finished"]
    assert len(done) == 80
    assert (done.ttft > 0).all() and (done.e2el >= done.ttft).all()


def test_held_out_mixtral_runs_go_through_the_same_validation(tmp_path):
    from experiments import validate_moe

    (tmp_path / "runs.csv").write_text(
        "experiment,model,gpu,tp,precision,max_num_batched_tokens,gpu_memory_utilization,"
        "cpu_offload,workload,stages_rate_x_seconds,system_tokens,question_tokens,"
        "output_tokens,kv_blocks_from_log\n"
        "m1,mixtral-8x7b (MoE),h100,2,bf16/fp16,2048,0.9,,general,2x600,100,447,248,\n"
        "d1,llama-2-7b,h100,1,bf16/fp16,2048,0.9,,general,2x600,100,447,248,\n")
    rows = [("m1", f"{m}_{k}", v * (1 + 0.2 * i)) for m, v in (("e2e", 4000.0), ("ttft", 60.0))
            for i, k in enumerate(("mean", "p90", "p99"))] + [("m1", "itl_mean", 16.0)]
    rows += [("d1", m, v) for _, m, v in rows]
    (tmp_path / "measured.csv").write_text(
        "experiment,metric,measured_ms\n" + "".join(f"{e},{m},{v}\n" for e, m, v in rows))
    runs = validate_moe.load_runs(tmp_path)
    assert list(runs.experiment) == ["m1"] and runs.model_spec[0] == MODELS["mixtral-8x7b"]
    res = validate_moe.run(quick=True, quiet=True, data_dir=tmp_path)["runs"]
    assert np.isfinite(res.e2e_mean_simulated).all() and (res.num_unfinished == 0).all()


def test_parallel_layout_from_the_command_line():
    from simsched.cli.configs import parse_set_value

    assert parse_set_value("hardware.parallel", '{"pipeline_parallel_size":2}') == \
        {"pipeline_parallel_size": 2}
    with pytest.raises(ValueError, match="parallel takes a mapping"):
        parse_set_value("parallel", "2")


def test_dense_model_with_a_default_parallel_layout_is_bit_identical():
    base = SimConfig().replace(model="llama-3-8b", gpu="h100-sxm", num_requests=60, rate=10.0,
                               seed=2)
    with_layout = base.replace(parallel=ParallelConfig())
    assert hardware.kv_capacity_blocks(with_layout.hardware, 16) == \
        hardware.kv_capacity_blocks(base.hardware, 16)
    a, b = simsched.simulate(base).requests, simsched.simulate(with_layout).requests
    assert a.equals(b)


def test_one_expert_top_one_costs_about_the_dense_mlp_it_is():
    # The MoE path reuses the dense GEMM model: an "MoE" of one always-chosen expert is the
    # dense model plus a router and the token permutation.
    dense = dataclasses.replace(MODELS["llama-3-8b"], weight_dtype="fp8")
    one = dataclasses.replace(dense, num_experts=1, experts_per_token=1)
    a = CalibratedCostModel(dense, H100, 1, engine_overhead="none")
    b = CalibratedCostModel(one, H100, 1, engine_overhead="none")
    # The fixed routing kernels (router GEMM, top-k, alignment) cost at most ~25 us a layer.
    fixed = dense.num_layers * 25e-6
    for n in (1, 16, 256, 2048):
        batch = Batch([n], [0])
        la, lb = a.breakdown(batch)["linear"], b.breakdown(batch)["linear"]
        assert la < lb < 1.1 * la + fixed, n


def test_kv_dtype_and_mla_scale_the_decode_attention_reads():
    spec = MODELS["llama-3-8b"]
    a = CalibratedCostModel(spec, H100, 1, engine_overhead="none")
    b = CalibratedCostModel(dataclasses.replace(spec, kv_cache_dtype="fp8"), H100, 1,
                            engine_overhead="none")
    assert b.kernels.dec_s[5] == pytest.approx(a.kernels.dec_s[5] / 2)
    # A KV-dtype change alone keeps the measured linear table.
    assert (b.kernels.linear == a.kernels.linear).all()
    ds = MODELS["deepseek-v3"]
    assert moe.kv_read_scale(ds, 8) == pytest.approx((512 + 64) / (2 * 16 * 128))
