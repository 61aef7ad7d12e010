"""hardware.all_reduce: vLLM's custom all-reduce timed from AIConfigurator's measured tables
instead of the fitted latency term."""

from __future__ import annotations

import numpy as np
import pytest

from simsched import SimConfig, simulate
from simsched.cost import aiconfigurator as aic
from simsched.cost import factory, vllm_v1
from simsched.cost.base import Batch
from simsched.cost.hardware import gpu_spec

MODEL = "llama-3.1-70b-fp8"


def _model(tp: int, all_reduce: str, gpu: str = "h100-sxm", **extra):
    cfg = SimConfig().replace(model=MODEL, gpu=gpu, tensor_parallel_size=tp,
                              all_reduce=all_reduce, **extra)
    return cfg, factory.make_cost_model(cfg.hardware)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_measured_custom_all_reduce_is_the_gpus_table_per_call(tp):
    _, cm = _model(tp, "measured")
    k = cm.kernels
    msg = np.arange(len(k.comm), dtype=float) * k.spec.hidden_size * k.spec.bytes_per_param
    small = (msg > 0) & (msg < vllm_v1.CUSTOM_AR_MAX_BYTES)
    want = vllm_v1.num_collectives(k) * aic.all_reduce("h100-sxm", tp, msg)
    # The step's all-reduce time below vLLM's custom limit is the measured call, 2 L + 1 times.
    np.testing.assert_allclose(np.asarray(cm._comm)[small], want[small], rtol=1e-12)
    _, fitted = _model(tp, "fitted")
    assert not np.allclose(np.asarray(fitted._comm)[small], want[small])
    # Above the limit both keep the NCCL estimate (and the fitted large-call scale).
    large = msg >= vllm_v1.CUSTOM_AR_MAX_BYTES
    np.testing.assert_array_equal(np.asarray(cm._comm)[large][-10:],
                                  np.asarray(fitted._comm)[large][-10:])


def test_measured_tables_move_the_decode_step_as_they_differ_from_the_fitted_term():
    batch = Batch(num_decode_seqs=16, decode_context_sum=16 * 1500)
    steps = {}
    for tp in (2, 8):
        for ar in ("fitted", "measured"):
            _, cm = _model(tp, ar)
            steps[tp, ar] = (cm.iteration_time(batch), cm.breakdown(batch)["communication"])
    # At TP 2 the measured call (6 us for 256 KiB) is slower than the fitted one (3 us), at
    # TP 8 faster (12 us against the fitted two-shot's 32 us); only communication moves.
    assert steps[2, "measured"][1] > steps[2, "fitted"][1]
    assert steps[8, "measured"][1] < steps[8, "fitted"][1]
    for tp in (2, 8):
        moved = steps[tp, "measured"][0] - steps[tp, "fitted"][0]
        assert moved == pytest.approx(steps[tp, "measured"][1] - steps[tp, "fitted"][1],
                                      abs=1e-9)


def test_tensor_parallel_one_and_the_default_are_unchanged():
    batch = Batch([512], [0], num_decode_seqs=8, decode_context_sum=8 * 700)
    cfg = SimConfig().replace(model="llama-3.1-8b", gpu="h100-sxm")
    assert cfg.hardware.all_reduce == "fitted"
    assert gpu_spec(cfg.hardware).all_reduce == "fitted"
    one = factory.make_cost_model(cfg.hardware).iteration_time(batch)
    measured = cfg.replace(all_reduce="measured")
    assert factory.make_cost_model(measured.hardware).iteration_time(batch) == one


def test_a_run_with_measured_all_reduces_differs_and_round_trips():
    cfg, _ = _model(8, "measured", num_requests=40, rate=8.0, seed=3)
    assert SimConfig.from_json(cfg.to_json()) == cfg
    a = simulate(cfg).summary()
    b = simulate(cfg.replace(all_reduce="fitted")).summary()
    assert a["tpot_mean"] < b["tpot_mean"]      # TP 8's measured calls are the faster


@pytest.mark.parametrize("change, words", [
    ({"all_reduce": "nccl"}, "hardware.all_reduce must be one of"),
    ({"all_reduce": "measured", "engine_overhead": "eager_2023"}, "hardware.engine_overhead"),
    ({"all_reduce": "measured", "kernel_profile": "aiconfigurator"}, "hardware.kernel_profile"),
])
def test_bad_choices_are_refused_naming_the_field(change, words):
    with pytest.raises(ValueError, match=words.replace(".", r"\.")):
        SimConfig().replace(model=MODEL, gpu="h100-sxm", tensor_parallel_size=2, **change)


def test_gpus_without_their_own_tables_read_their_twins():
    # The A100 40 GB has the 80 GB's NVLink 3 links, the power-capped H100 the H100's.
    for gpu, twin in (("a100-40gb", "a100-80gb"), ("h100-sxm-pcap", "h100-sxm")):
        cfg = SimConfig().replace(model="llama-3.1-8b", gpu=gpu, tensor_parallel_size=2,
                                  all_reduce="measured")
        k = factory.make_cost_model(cfg.hardware).kernels
        msg = np.array([16.0 * k.spec.hidden_size * k.spec.bytes_per_param])
        per_call = np.asarray(factory.make_cost_model(cfg.hardware)._comm)[16] \
            / vllm_v1.num_collectives(k)
        assert per_call == pytest.approx(aic.all_reduce(twin, 2, msg)[0], rel=1e-12)


def test_validate_silicon_refuses_measured_all_reduces_on_measured_kernel_tables(capsys):
    from experiments import validate_silicon

    with pytest.raises(SystemExit):
        validate_silicon.main(["--all-reduce", "measured", "--kernels", "aiconfigurator",
                               "--quiet"])
    assert "--kernels aiconfigurator times every all-reduce" in capsys.readouterr().err


def test_the_measured_choice_names_every_vllm_form_profile():
    from simsched.cost.calibrated import VLLM_FORM
    from simsched.cost.profile_names import CUSTOM_ALL_REDUCE

    assert CUSTOM_ALL_REDUCE == set(VLLM_FORM)


def test_auto_measures_where_it_can_and_is_the_sglang_and_trtllm_presets():
    batch = Batch(num_decode_seqs=16, decode_context_sum=16 * 1500)
    preset = SimConfig.preset("trtllm").replace(model=MODEL, gpu="h100-sxm",
                                                tensor_parallel_size=8)
    assert preset.hardware.all_reduce == "auto"
    assert SimConfig.from_json(preset.to_json()) == preset
    assert SimConfig.preset("vllm_v1").hardware.all_reduce == "fitted"
    assert SimConfig.preset("sglang").hardware.all_reduce == "auto"

    def step(cfg):
        return factory.make_cost_model(cfg.hardware).iteration_time(batch)

    # On a GPU with tables and default kernels auto is measured, step for step.
    assert gpu_spec(preset.hardware).all_reduce == "measured"
    assert step(preset) == step(preset.replace(all_reduce="measured"))
    assert step(preset) != step(preset.replace(all_reduce="fitted"))
    # Where measured would be refused, auto is what the engine has without it.
    tables = preset.replace(kernel_profile="aiconfigurator")
    assert gpu_spec(tables.hardware).all_reduce == "fitted"
    assert step(tables) == step(tables.replace(all_reduce="fitted"))
    eager = preset.replace(engine_overhead="eager_2023")
    assert step(eager) == step(eager.replace(all_reduce="fitted"))


def test_auto_on_a_gpu_without_measured_all_reduces_is_fitted(monkeypatch):
    from simsched.cost import hardware

    monkeypatch.setattr(hardware, "all_reduce_tables", lambda gpu: None)
    cfg = SimConfig.preset("trtllm").replace(model=MODEL, gpu="h200", tensor_parallel_size=4)
    assert gpu_spec(cfg.hardware).all_reduce == "fitted"
    with pytest.raises(ValueError, match=r"no measured all-reduces for hardware\.gpu='h200'"):
        cfg.replace(all_reduce="measured")
