"""The prefill and fused-MoE terms fitted on the silicon rows (simsched.cost.vllm_silicon)."""

from __future__ import annotations

import numpy as np
import pytest

from simsched import SimConfig, simulate
from simsched.config.parallel import ParallelConfig
from simsched.cost import factory, vllm_silicon, vllm_v1
from simsched.cost.base import Batch
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.hardware import GPUS, MODELS

BATCHES = [Batch([900], [0], 3, 4000), Batch([], [], 8, 9000), Batch([64, 300], [0, 128], 1, 50)]


def _model(name, terms=None, gpu="h200", tp=2, profile="vllm_v1"):
    return CalibratedCostModel(MODELS[name], GPUS[gpu], tp, model_name=name,
                               engine_overhead=profile, engine_terms=terms)


def _terms(**changes):
    return {**vllm_v1.terms(), **changes}


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "llama-3-8b"])
def test_neutral_terms_are_the_vllm_v1_profile_bit_for_bit(name):
    shipped = _model(name)
    neutral = _model(name, _terms(**vllm_silicon.NEUTRAL))
    for b in BATCHES:
        assert neutral.iteration_time(b) == shipped.iteration_time(b)
    assert neutral._prefill_extra is None and shipped._prefill_extra is None


def test_expert_scale_moves_only_the_routed_experts_of_prefill_steps():
    base = _model("qwen3-30b-a3b")
    k = base.kernels
    assert k.moe_experts is not None
    # The routed experts are a part of the linear time, and the larger part of an MoE layer.
    assert np.all(k.moe_experts <= k.linear + 1e-15)
    assert k.moe_experts[4096] > 0.3 * k.linear[4096]
    scaled = _model("qwen3-30b-a3b", _terms(prefill_expert_scale=1.5, prefill_gemm_scale=1.2))
    decode, mixed = Batch([], [], 16, 16000), Batch([900], [0], 3, 4000)
    assert scaled.iteration_time(decode) == base.iteration_time(decode)
    assert scaled.breakdown(mixed)["linear"] == pytest.approx(
        base.breakdown(mixed)["linear"] + 0.2 * k.linear[903] + 1.2 * 0.5 * k.moe_experts[903],
        rel=1e-12)
    # A dense model has no routed experts: the scale changes nothing.
    dense = _model("llama-3-8b")
    dense_scaled = _model("llama-3-8b", _terms(prefill_expert_scale=3.0))
    assert getattr(dense.kernels, "moe_experts", None) is None
    assert dense_scaled.iteration_time(mixed) == dense.iteration_time(mixed)


def test_decode_expert_scale_moves_only_the_routed_experts_of_decode_steps():
    base = _model("qwen3-30b-a3b")
    k = base.kernels
    scaled = _model("qwen3-30b-a3b", _terms(decode_expert_scale=1.5))
    decode, mixed = Batch([], [], 16, 16000), Batch([900], [0], 3, 4000)
    assert scaled.breakdown(decode)["linear"] == pytest.approx(
        base.breakdown(decode)["linear"] + 0.5 * k.moe_experts[16], rel=1e-12)
    assert scaled.iteration_time(decode) > base.iteration_time(decode)
    # The fast path of decode-only runs reads the same tables.
    assert scaled.decode_iteration_times(16, 16000, 5) == pytest.approx(
        [scaled.iteration_time(Batch([], [], 16, 16000 + 16 * i)) for i in range(5)],
        rel=1e-12)
    # A step that prefills keeps prefill_gemm_scale x prefill_expert_scale, whatever this is.
    both = _model("qwen3-30b-a3b", _terms(decode_expert_scale=1.5, prefill_expert_scale=2.0))
    prefill_only = _model("qwen3-30b-a3b", _terms(prefill_expert_scale=2.0))
    assert both.iteration_time(mixed) == pytest.approx(prefill_only.iteration_time(mixed),
                                                       rel=1e-12)
    dense = _model("llama-3-8b")
    assert _model("llama-3-8b", _terms(decode_expert_scale=3.0)).iteration_time(decode) \
        == dense.iteration_time(decode)


def test_expert_terms_leave_coarse_experts_at_the_tables_time():
    # Mixtral's and Llama-4-Scout's experts are wider than the model: the expert terms, fitted
    # on fine-grained experts, do not apply (the real Scout runs got 8 -> 56 % E2E off with them).
    experts = _terms(prefill_expert_scale=3.0, decode_expert_scale=1.5)
    decode, mixed = Batch([], [], 16, 16000), Batch([900], [0], 3, 4000)
    for name in ("mixtral-8x7b", "llama-4-scout-17b-16e"):
        base = _model(name)
        assert base.kernels.moe_experts is not None
        assert vllm_silicon.fine_grained_experts(base.kernels) is None
        scaled = _model(name, experts)
        assert scaled.iteration_time(decode) == base.iteration_time(decode)
        assert scaled.iteration_time(mixed) == base.iteration_time(mixed)
    fine = _model("qwen3-30b-a3b")
    assert vllm_silicon.fine_grained_experts(fine.kernels) is fine.kernels.moe_experts
    assert _model("qwen3-30b-a3b", experts).iteration_time(mixed) > fine.iteration_time(mixed)


def test_prefill_terms_add_to_steps_that_prefill_only():
    base = _model("llama-3-8b")
    t = _terms(prefill_gemm_scale=1.2, prefill_layer_time=50e-6)
    model = _model("llama-3-8b", t)
    decode = Batch([], [], 8, 9000)
    assert model.iteration_time(decode) == base.iteration_time(decode)
    # Lazy decode runs time quiet steps in bulk: the same floats.
    assert model.decode_iteration_times(8, 9000, 3)[0] == base.iteration_time(decode)
    mixed = Batch([900], [0], 3, 4000)
    want = base.iteration_time(mixed) + 0.2 * base.kernels.linear[903] \
        + MODELS["llama-3-8b"].num_layers * 50e-6
    assert model.iteration_time(mixed) == pytest.approx(want, rel=1e-12)
    parts = model.breakdown(mixed)
    assert sum(parts.values()) == pytest.approx(model.iteration_time(mixed), rel=1e-12)


def test_terms_are_checked_by_name():
    with pytest.raises(ValueError, match="prefill_expert_scale must be > 0"):
        _model("qwen3-30b-a3b", _terms(prefill_expert_scale=0.0))
    with pytest.raises(ValueError, match="prefill_layer_time must be >= 0"):
        vllm_silicon.check({"prefill_layer_time": -1e-6})
    with pytest.raises(ValueError, match="prefill_gemm_scale must be a finite number"):
        vllm_silicon.check({"prefill_gemm_scale": float("nan")})


def test_shipped_terms_load_and_reach_a_run():
    terms = vllm_silicon.terms()
    assert set(vllm_silicon.TERMS) <= set(terms)
    assert terms["output_delay"] == vllm_v1.terms()["output_delay"]
    cfg = SimConfig().replace(model="qwen3-30b-a3b", gpu="h200", tensor_parallel_size=2,
                              parallel=ParallelConfig(enable_expert_parallel=True),
                              num_requests=20, rate=5.0, seed=3)
    model = factory.engine_terms_cost_model(cfg.hardware, terms)
    assert model is factory.engine_terms_cost_model(cfg.hardware, terms)   # cached per terms
    shipped = simulate(cfg.replace(engine_overhead="vllm_v1")).summary()
    fitted = simulate(cfg, cost_model=model).summary()
    # The default profile is vllm_silicon: the fitted terms, by name.
    assert simulate(cfg).summary()["ttft_p50"] == fitted["ttft_p50"]
    slower = any(terms[t] != vllm_silicon.NEUTRAL[t] for t in vllm_silicon.TERMS)
    assert (fitted["ttft_p50"] > shipped["ttft_p50"]) == slower


def test_large_allreduce_scale_moves_only_calls_above_the_custom_limit():
    base = _model("llama-3-8b", tp=4)
    fast = _model("llama-3-8b", _terms(large_allreduce_scale=0.5), tp=4)
    # llama-3-8b: 4,096 channels x 2 bytes = 8 KiB per token; 8 MiB from 1,024 tokens.
    small, large = Batch([], [], 64, 64000), Batch([4000], [0], 0, 0)
    assert fast.breakdown(small)["communication"] == base.breakdown(small)["communication"]
    assert fast.breakdown(large)["communication"] == pytest.approx(
        0.5 * base.breakdown(large)["communication"], rel=1e-12)
    comm = np.array(fast._comm)
    assert np.all(np.diff(comm) >= 0)           # more tokens never cost less


def test_terms_from_the_command_line():
    parse = vllm_silicon.parse
    assert parse("shipped") is None
    assert parse("fitted") == vllm_silicon.terms()
    assert parse("neutral") == {**vllm_v1.terms(), **vllm_silicon.NEUTRAL}
    t = parse("prefill_gemm_scale=1.5,large_allreduce_scale=0.5")
    assert t["prefill_gemm_scale"] == 1.5 and t["large_allreduce_scale"] == 0.5
    assert t["prefill_expert_scale"] == 1.0 and t["output_delay"] == vllm_v1.terms()["output_delay"]
    with pytest.raises(ValueError, match="unknown term 'gemm'"):
        parse("gemm=2")
    with pytest.raises(ValueError, match="not NAME=NUMBER"):
        parse("prefill_gemm_scale=fast")
    with pytest.raises(ValueError, match="prefill_gemm_scale must be > 0"):
        parse("prefill_gemm_scale=0")


def test_a_term_pass_simulates_the_registered_vllm_engine_with_its_terms():
    # The fit's and the prefill study's engines are the registered vLLM engine with terms: the
    # hooks other engines set stay keyword-only, so terms cannot land in one of them.
    import experiments.fit_silicon_terms as fit
    import experiments.validate_silicon as vs

    terms = vllm_silicon.terms()
    engine = fit._engine(terms)
    base = vs.ENGINES["vllm"]
    assert (engine.name, engine.recipe, engine.configure, engine.refuse) == \
        (base.name, base.recipe, base.configure, base.refuse)
    assert engine.terms_of(None) == terms
    with pytest.raises(TypeError):
        vs.Engine("vllm", vs.vllm_recipe, "vllm_v1", terms)


def test_the_vllm_silicon_profile_is_vllm_v1_with_the_fitted_terms():
    # engine_overhead="vllm_silicon" is the default, by name (config, CLI --set, sweeps): the
    # same model as passing the fitted terms, scheduled asynchronously as vllm_v1 is.
    cfg = SimConfig().replace(model="qwen3-30b-a3b", gpu="h200", tensor_parallel_size=2,
                              num_requests=40)
    assert cfg.hardware.engine_overhead == "vllm_silicon"
    named = factory.make_cost_model(cfg.replace(engine_overhead="vllm_silicon").hardware)
    passed = factory.engine_terms_cost_model(cfg.hardware, vllm_silicon.terms())
    plain = factory.make_cost_model(cfg.replace(engine_overhead="vllm_v1").hardware)
    for b in (Batch([], [], 16, 16000), Batch([900], [0], 3, 4000), Batch([8000], [0])):
        assert named.iteration_time(b) == passed.iteration_time(b)
        assert named.iteration_time(b) != plain.iteration_time(b)
    a = simulate(cfg.replace(engine_overhead="vllm_silicon")).requests
    b = simulate(cfg, cost_model=passed).requests
    assert a.ttft.tolist() == b.ttft.tolist()
    assert "fitted on AIConfigurator" in named.describe()
    with pytest.raises(ValueError, match="engine_overhead"):
        SimConfig().replace(engine_overhead="vllm_silicone")


@pytest.mark.parametrize("profile, base", [("vllm_silicon", "vllm_v1"),
                                           ("sglang_silicon", "sglang")])
def test_on_aiconfigurator_tables_the_silicon_terms_are_left_out(profile, base):
    # The terms correct the calibrated kernel tables they were fitted on; AIConfigurator's
    # measured tables time the fused MoE and the all-reduces as measured.
    cfg = SimConfig().replace(model="qwen3-30b-a3b", gpu="h200", tensor_parallel_size=2)
    if profile.startswith("sglang"):
        cfg = SimConfig.preset("sglang").replace(model="qwen3-30b-a3b", gpu="h200",
                                                 tensor_parallel_size=2)
    aic = cfg.replace(kernel_profile="aiconfigurator")
    with_terms = factory.make_cost_model(aic.replace(engine_overhead=profile).hardware)
    without = factory.make_cost_model(aic.replace(engine_overhead=base).hardware)
    calibrated = factory.make_cost_model(cfg.replace(engine_overhead=profile).hardware)
    calibrated_base = factory.make_cost_model(cfg.replace(engine_overhead=base).hardware)
    for b in (Batch([], [], 16, 16000), Batch([900], [0], 3, 4000), Batch([8000], [0])):
        assert with_terms.iteration_time(b) == without.iteration_time(b)
        assert calibrated.iteration_time(b) > calibrated_base.iteration_time(b) or \
            b.num_tokens >= 8000      # the all-reduce term makes a long prefill faster
    assert "silicon terms are left out" in with_terms.describe()
    assert "left out" not in calibrated.describe()
    # Passed explicitly, terms apply whatever the tables.
    passed = factory.engine_terms_cost_model(aic.hardware, vllm_silicon.terms())
    assert passed.iteration_time(Batch([900], [0], 3, 4000)) > \
        without.iteration_time(Batch([900], [0], 3, 4000))


def test_the_prefill_study_splits_the_kernel_sums_by_default():
    # silicon_prefill's --terms neutral (its default) times the prefill as the vllm_v1 profile,
    # the kernel sums it compares the measurements with; fitted adds the default's terms.
    import pandas as pd

    from experiments import silicon_prefill as sp
    from tests.test_terms_transfer import _rows

    rows = _rows("vllm", "0.12.0", "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "bf16", 1.0)
    neutral = sp.table(rows, vllm_silicon.parse("neutral"))
    fitted = sp.table(rows, vllm_silicon.parse("fitted"))
    assert len(neutral) == len(fitted) == 2
    v1 = _model("qwen3-30b-a3b", tp=1)
    for r, n in zip(rows.itertuples(), neutral.itertuples()):
        assert n.step_ms == pytest.approx(1e3 * v1.iteration_time(
            Batch([int(r.isl)], [0], int(r.concurrency) - 1, (int(r.concurrency) - 1)
                  * int(r.isl))), rel=0.05)
    assert (fitted.step_ms > neutral.step_ms).all()
    pd.testing.assert_series_equal(neutral.ttft_ms, fitted.ttft_ms)
