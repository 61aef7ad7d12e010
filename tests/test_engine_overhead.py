"""Each engine-overhead choice gives the documented per-iteration time (docs/cost_model.md)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import simsched
from simsched import SimConfig
from simsched.config import HardwareConfig
from simsched.cost import factory, overhead, serving
from simsched.cost import calibration as cal
from simsched.cost import hardware as hwmod
from simsched.cost.base import Batch

DECODE_1 = Batch([], [], 1, 1000)
DECODE_64 = Batch([], [], 64, 64000)
MIXED = Batch([512], [0], 32, 32000)
# ms, Llama-2-7B at TP 1, as docs/cost_model.md lists them (experiments.calibrate_overhead).
DOCUMENTED = {
    ("a100-80gb", "measured_2023"): (11.01, 39.75, 54.84),
    ("a100-80gb", "eager_2023"): (17.91, 56.42, 63.03),
    ("a100-80gb", "overlapped"): (10.23, 36.34, 52.72),
    ("a100-80gb", "none"): (10.13, 36.24, 52.62),
    ("a100-80gb", "vllm_v1"): (10.24, 36.51, 52.81),
    ("h200", "measured_2023"): (5.48, 15.90, 18.29),
    ("h200", "eager_2023"): (12.27, 29.11, 29.96),
    ("h200", "overlapped"): (4.70, 12.49, 16.17),
    ("h200", "none"): (4.60, 12.39, 16.07),
    ("h200", "vllm_v1"): (4.70, 12.66, 16.26),
}


def model(gpu="a100-80gb", choice="measured_2023", **kw):
    return factory.make_cost_model(HardwareConfig(gpu=gpu, engine_overhead=choice, **kw))


@pytest.mark.parametrize("key", sorted(DOCUMENTED))
def test_documented_iteration_times(key):
    m = model(*key)
    got = tuple(round(m.iteration_time(b) * 1e3, 2) for b in (DECODE_1, DECODE_64, MIXED))
    assert got == pytest.approx(DOCUMENTED[key], abs=0.011)


@pytest.mark.parametrize("gpu", ["a100-80gb", "h200"])
def test_each_choice_is_its_formula(gpu):
    none, meas, over = model(gpu, "none"), model(gpu, "measured_2023"), model(gpu, "overlapped")
    cpu_coef = cal.fit_all()["cpu"]
    gap = overhead.overlapped_gap()
    assert gap == pytest.approx(0.104e-3, abs=1e-6)  # H200 graph round trip minus GPU time
    for b in (DECODE_1, DECODE_64, MIXED):
        g = none.iteration_time(b)
        cpu = float(cal.predict_cpu_overhead(cpu_coef, 1, b.num_seqs))
        assert meas.iteration_time(b) == pytest.approx(g + cpu, rel=1e-12)
        assert over.iteration_time(b) == pytest.approx(max(g, cpu) + gap, rel=1e-12)
        assert none.breakdown(b)["overhead"] == 0.0
        assert sum(over.breakdown(b).values()) == pytest.approx(over.iteration_time(b), rel=1e-12)
    # measured_2023 at TP 1: 0.84 ms per iteration + 0.042 ms per sequence (Vidur CPU profile).
    assert cpu_coef["a"] == pytest.approx(0.84e-3, abs=0.01e-3)
    assert cpu_coef["b"] == pytest.approx(0.042e-3, abs=0.001e-3)


def test_eager_formula_at_tp4():
    kw = dict(model="llama-2-70b", tensor_parallel_size=4)
    none, eager = model(choice="none", **kw), model(choice="eager_2023", **kw)
    t = serving.engine_terms()["dgx-a100"]
    layers, coll = 80, 160
    for b, prefill in ((DECODE_1, False), (DECODE_64, False), (MIXED, True)):
        k = eager.kernels
        big = float(serving.large_iteration_bytes(k, b.num_tokens)) \
            * t["large_iteration_time_per_byte"]
        comm = none.breakdown(b)["communication"]
        gpu = none.iteration_time(b) + comm * (t["comm_scale"] - 1) + big \
            + coll * 3 * t["sync_per_collective"]
        floor = layers * max(t["floor_per_layer"],
                             t["floor_per_layer_prefill"] if prefill else 0.0)
        want = max(gpu, floor) + t["serial_per_seq"] * b.num_seqs
        assert eager.iteration_time(b) == pytest.approx(want, rel=1e-9)
        assert sum(eager.breakdown(b).values()) == pytest.approx(want, rel=1e-9)


def test_default_is_vllm_silicon_with_async_scheduling_and_client_times():
    assert HardwareConfig().engine_overhead == overhead.DEFAULT_ENGINE_OVERHEAD == "vllm_silicon"
    default = factory.make_cost_model(HardwareConfig())
    assert default is model(choice="vllm_silicon") and default is not model(choice="vllm_v1")
    assert default.output_delay > 0
    # A default run is the vllm_silicon profile spelled out: async scheduling, client-side
    # times; for a dense model at TP 1 it is the vllm_v1 profile's run, bit for bit (the
    # silicon terms move fine-grained experts and all-reduces only).
    cfg = SimConfig().replace(num_requests=60, rate=20.0, num_blocks=200, seed=3)
    spelled = cfg.replace(engine_overhead="vllm_silicon", async_scheduling=True)
    got, want = simsched.simulate(cfg).requests, simsched.simulate(spelled).requests
    pd.testing.assert_frame_equal(got, want)
    v1 = simsched.simulate(cfg.replace(engine_overhead="vllm_v1")).requests
    pd.testing.assert_frame_equal(got, v1)
    np.testing.assert_allclose(got.first_token_at - got.engine_first_token_at,
                               default.output_delay)
    # measured_2023 (the default before) is still there, synchronous and without delay.
    old = simsched.simulate(cfg.replace(engine_overhead="measured_2023")).requests
    assert "engine_first_token_at" not in old and not old.first_token_at.equals(got.first_token_at)


@pytest.mark.parametrize("choice", ["eager_2023", "overlapped", "none", "vllm_v1"])
def test_positive_finite_for_every_gpu_and_tp(choice):
    batches = [Batch([], [], 1, 1), Batch([1], [0]), Batch([100000], [0]),
               Batch([2048, 64], [4000, 0], 100, 200000), Batch([], [], 20000, 200000)]
    for name in ("llama-2-7b", "llama-2-70b", "bloom-176b"):
        for gpu in hwmod.GPUS:
            for tp in hwmod.TP_SIZES:
                try:
                    hw = HardwareConfig(model=name, gpu=gpu, tensor_parallel_size=tp,
                                        engine_overhead=choice)
                except ValueError:
                    continue
                m = factory.make_cost_model(hw)
                for b in batches:
                    t = m.iteration_time(b)
                    assert math.isfinite(t) and t > 0, (name, gpu, tp, b)
                    assert sum(m.breakdown(b).values()) == pytest.approx(t, rel=1e-9)
