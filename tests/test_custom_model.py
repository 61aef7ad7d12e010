"""Custom models carried by the config (issue 17 items 10 and 11): HF config from a path or a
dict, and a model shape that reaches spawned and Ray workers without ``register_model``."""

from __future__ import annotations

import functools
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd
import pytest

from simsched import SimConfig
from simsched.analysis import executors
from simsched.analysis.sweep import sweep
from simsched.config import HardwareConfig
from simsched.cost import factory
from simsched.cost import hardware as hwmod
from simsched.cost.hardware import ModelSpec
from simsched.workloads.workload import generate

HF = {"num_hidden_layers": 28, "hidden_size": 3072, "num_attention_heads": 24,
      "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
      "hidden_act": "silu", "max_position_embeddings": 131072}
SPEC = ModelSpec.from_hf_config(HF)


def test_from_hf_config_accepts_a_path_a_folder_or_a_dict(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF))
    assert ModelSpec.from_hf_config(str(path)) == SPEC
    assert ModelSpec.from_hf_config(path) == SPEC
    assert ModelSpec.from_hf_config(tmp_path) == SPEC        # a model folder
    assert SPEC.head_dim == 128 and SPEC.num_kv_heads == 8 and SPEC.max_context == 131072
    with pytest.raises(FileNotFoundError, match="nope.json"):
        ModelSpec.from_hf_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not a JSON config"):
        ModelSpec.from_hf_config(bad)
    with pytest.raises(ValueError, match="mapping or the path"):
        ModelSpec.from_hf_config(42)


def test_generate_says_it_wants_a_workload_config():
    with pytest.raises(ValueError, match="wants a WorkloadConfig, got SimConfig; pass "
                                         "config.workload"):
        generate(SimConfig(), np.random.default_rng(0))
    with pytest.raises(ValueError, match="numpy.random.Generator"):
        generate(SimConfig().workload, 0)


def test_config_carries_the_model_shape():
    hw = HardwareConfig(model="my-3b", model_spec=SPEC, max_model_len=8192)
    assert "my-3b" not in hwmod.MODELS
    assert hwmod.model_spec(hw) == SPEC and hwmod.kv_capacity_blocks(hw, 16) > 0
    # A mapping of the spec's fields, of HF keys, or a path all give the same config.
    assert HardwareConfig(model="my-3b", model_spec=HF, max_model_len=8192) == hw
    fields = {f: getattr(SPEC, f) for f in SPEC.__dataclass_fields__}
    assert HardwareConfig(model="my-3b", model_spec=fields, max_model_len=8192) == hw
    with pytest.raises(ValueError, match="names a catalog model of another shape"):
        HardwareConfig(model="llama-2-7b", model_spec=SPEC)
    odd = ModelSpec(4, 2560, 20, 20, 6912, 32000)      # 20 heads: TP 8 cannot split them
    with pytest.raises(ValueError, match="tensor_parallel_size=8 must divide odd's 20"):
        HardwareConfig(model="odd", model_spec=odd, tensor_parallel_size=8)
    t = factory.make_cost_model(hw).iteration_time(
        __import__("simsched").cost.base.Batch([], [], 4, 2000))
    assert 0.003 < t < 0.02
    # Unknown names still fail, and say how to give a shape.
    with pytest.raises(ValueError, match="hardware.model_spec"):
        HardwareConfig(model="my-3b")


def _base():
    return SimConfig().replace(model="my-3b", model_spec=SPEC, max_model_len=4096,
                               num_requests=20, rate=5.0)


def test_spawned_sweep_workers_see_a_custom_model(monkeypatch):
    # Spawned workers start from a fresh interpreter: a register_model call made here is not
    # seen there, a shape carried by the config is.
    spawn = functools.partial(ProcessPoolExecutor, mp_context=multiprocessing.get_context("spawn"))
    monkeypatch.setattr(executors, "ProcessPoolExecutor", spawn)
    kw = dict(progress=False, policy=["fcfs", "spf"])
    got = sweep(_base(), executor="local", max_workers=2, **kw)
    want = sweep(_base(), executor="serial", **kw)
    pd.testing.assert_frame_equal(got.runs, want.runs)
    pd.testing.assert_frame_equal(got.requests, want.requests)
    assert (got.runs["num_finished"] == 20).all()


@pytest.mark.slow
def test_ray_workers_see_a_custom_model():
    ray = pytest.importorskip("ray")
    kw = dict(progress=False, policy=["fcfs", "spf"])
    try:
        got = sweep(_base(), executor="ray", **kw)
    finally:
        ray.shutdown()
    want = sweep(_base(), executor="serial", **kw)
    pd.testing.assert_frame_equal(got.runs, want.runs)


def test_a_config_head_dim_overrides_hidden_over_heads():
    # Mistral-NeMo: 5,120 hidden, 32 heads of 128 (not 160): the KV per token and the attention
    # projections follow head_dim.
    nemo = ModelSpec.from_hf_config({**HF, "num_hidden_layers": 40, "hidden_size": 5120,
                                     "num_attention_heads": 32, "head_dim": 128,
                                     "intermediate_size": 14336, "vocab_size": 131072})
    assert nemo.head_dim == 128 and nemo == hwmod.MODELS["mistral-nemo-12b"]
    assert nemo.kv_bytes_per_token == 2 * 40 * 8 * 128 * 2
    assert ModelSpec(32, 4096, 32, 8, 14336, 32000).head_dim == 128     # derived when not given
    with pytest.raises(ValueError, match="ModelSpec.head_dim must be a positive integer"):
        ModelSpec(32, 4096, 32, 8, 14336, 32000, head_dim=-1)
    with pytest.raises(ValueError, match="divisible by num_heads .* unless head_dim is given"):
        ModelSpec(4, 2500, 24, 8, 6912, 32000)
    ModelSpec(4, 2500, 24, 8, 6912, 32000, head_dim=128)               # given: no divisibility


def test_catalog_shapes_give_the_kv_blocks_vllm_logged():
    # The real vLLM 0.15 runs' start-up logs (simsched/cost/data/vllm_v1/runs.csv) against the
    # catalog shapes (H100, 90 % memory, max_model_len 4096): within 2 %, a check of the shapes.
    logged = {("llama-2-7b", 1): 7463, ("llama-3.1-70b", 4): 30251, ("mistral-nemo-12b", 2): 48009,
              ("mistral-nemo-12b", 1): 19251, ("qwen2.5-7b", 1): 65352, ("yi-34b", 2): 20793}
    for (model, tp), blocks in logged.items():
        hw = HardwareConfig(model=model, gpu="h100-sxm", tensor_parallel_size=tp,
                            max_model_len=4096)
        assert abs(hwmod.kv_capacity_blocks(hw, 16) / blocks - 1) < 0.02, (model, tp)
