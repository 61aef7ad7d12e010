"""Each engine's own AIConfigurator kernel tables (SGLang 0.5.9, TensorRT-LLM 1.2.0rc5 on the
H100 and H200): shipped, registered as profiles, chosen by the engine profile, vLLM unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from simsched import SimConfig
from simsched.cost import aiconfigurator as aic
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.base import Batch
from simsched.cost.hardware import gpu_spec, model_spec
from simsched.cost.profiles import PROFILES

SETS = ("sglang-h100-sxm", "sglang-h200", "trtllm-h100-sxm", "trtllm-h200")


def _raw(name: str) -> dict:
    with np.load(aic.DATA / f"{name}.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def test_engine_table_sets_are_shipped_with_their_versions_and_profiles():
    assert aic.engine_sets() == sorted(SETS)
    for name in SETS:
        entry = aic.entry(name)
        engine = name.split("-", 1)[0]
        assert entry["engine"] == engine and entry[engine] == {"sglang": "0.5.9",
                                                              "trtllm": "1.2.0rc5"}[engine]
        profile = PROFILES[f"aic-{name}"]
        assert profile.gpu_name == name and entry[engine] in profile.description
    # The vLLM sets are what they were (nine GPUs); engine sets are not GPUs.
    assert "sglang-h200" not in aic.gpus() and "h200" in aic.gpus()
    with pytest.raises(ValueError, match="engine sets"):
        aic.tables("sglang-b200")


def test_engine_tables_are_read_at_their_measured_points():
    for name in ("sglang-h200", "trtllm-h100-sxm"):
        raw = _raw(name)
        m, n, k = list(raw["gemm_m"]), list(raw["gemm_n"]), list(raw["gemm_k"])
        i, j, l = m.index(1024), n.index(4096), k.index(4096)
        cell = float(raw["gemm_bfloat16"][i, j, l]) * 1e-3
        assert aic.gemm(name, "bfloat16", [1024], 4096, 4096)[0] == pytest.approx(cell,
                                                                                  rel=1e-12)
    # The engines' kernels are their own measurements, not vLLM's copied.
    ours = aic.gemm("trtllm-h200", "fp8", [64, 1024, 4096], 14336, 4096)
    vllm = aic.gemm("h200", "fp8", [64, 1024, 4096], 14336, 4096)
    assert not np.allclose(ours, vllm, rtol=1e-3)


@pytest.mark.parametrize("preset, want", [("vllm_v1", "aic-h200"),
                                          ("sglang", "aic-sglang-h200"),
                                          ("trtllm", "aic-trtllm-h200")])
def test_kernel_profile_aiconfigurator_reads_the_engines_own_tables(preset, want):
    cfg = SimConfig.preset(preset, model="llama-3.1-8b", gpu="h200",
                           kernel_profile="aiconfigurator")
    assert gpu_spec(cfg.hardware).kernels == want
    # Without the option every engine keeps the GPU's default kernels.
    assert gpu_spec(SimConfig.preset(preset, gpu="h200").hardware).kernels == "h200"


def test_an_engine_without_tables_on_a_gpu_reads_that_gpus_vllm_tables():
    cfg = SimConfig.preset("sglang", model="llama-3.1-8b", gpu="b200",
                           kernel_profile="aiconfigurator")
    assert gpu_spec(cfg.hardware).kernels == "aic-b200"


def test_engine_tables_change_the_iteration_time():
    times = {}
    for preset in ("vllm_v1", "sglang", "trtllm"):
        hw = SimConfig.preset(preset, model="llama-3.1-8b", gpu="h100-sxm",
                              kernel_profile="aiconfigurator").hardware
        # The same engine profile for all three: only the kernel tables differ.
        cm = CalibratedCostModel(model_spec(hw), gpu_spec(hw), 1, "llama-3.1-8b",
                                 engine_overhead="vllm_v1")
        times[preset] = (cm.iteration_time(Batch(num_decode_seqs=32, decode_context_sum=32 * 2048)),
                         cm.iteration_time(Batch(prefill_new_tokens=(2048,),
                                                 prefill_cached_tokens=(0,))))
    assert times["sglang"] != times["vllm_v1"] and times["trtllm"] != times["vllm_v1"]
    for t in times.values():         # same order of magnitude: the same GPU and model
        assert 0.5 < t[0] / times["vllm_v1"][0] < 2 and 0.5 < t[1] / times["vllm_v1"][1] < 2
