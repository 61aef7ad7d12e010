"""The ``vllm_v1`` engine profile: custom all-reduce, its fitted terms, the real vLLM 0.15 runs
and their end-to-end reproduction (experiments.validate_vllm)."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import validate_vllm
from simsched.config import HardwareConfig
from simsched.cost import factory, overhead, vllm_v1
from simsched.cost.base import Batch
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.hardware import GPUS, MODELS

H100_LINK = GPUS["h100-sxm"].interconnect_bandwidth / 2


def model(choice="vllm_v1", **kw):
    kw.setdefault("gpu", "h100-sxm")
    return factory.make_cost_model(HardwareConfig(engine_overhead=choice, **kw))


def test_custom_all_reduce_one_shot_two_shot_and_its_size_limit():
    lat = 2e-6
    small, big = 100 * 2**10, 1 * 2**20
    # TP 2 is always one-shot: one peer's buffer read over the link, one synchronisation.
    assert vllm_v1.custom_all_reduce(2, big, H100_LINK, lat) == pytest.approx(
        lat + big / H100_LINK)
    # TP 4: one-shot below 512 KiB (reads three peers), two-shot above (two syncs, 2 (TP-1)/TP).
    assert vllm_v1.custom_all_reduce(4, small, H100_LINK, lat) == pytest.approx(
        3 * lat + 3 * small / H100_LINK)
    assert vllm_v1.custom_all_reduce(4, big, H100_LINK, lat) == pytest.approx(
        6 * lat + 1.5 * big / H100_LINK)
    # TP 8 switches at 256 KiB.
    assert vllm_v1.custom_all_reduce(8, 300 * 2**10, H100_LINK, lat) == pytest.approx(
        14 * lat + 1.75 * 300 * 2**10 / H100_LINK)
    assert vllm_v1.custom_all_reduce(1, big, H100_LINK, lat) == 0.0
    # The step's table: 2 L + 1 custom calls below 8 MiB messages (512 tokens of 8,192 bf16
    # channels), NCCL per call from there.
    m = model(model="llama-2-70b", tensor_parallel_size=4)
    k, table = m.kernels, np.array(m._comm)
    tokens = np.array([16, 31, 32, 64, 511, 512, 600, 2048])
    msg = tokens * 8192 * 2
    per_call = np.where(msg < 8 * 2**20, vllm_v1.custom_all_reduce(
        4, msg, H100_LINK, vllm_v1.terms()["allreduce_latency"]),
        k.comm[tokens] / k.num_collectives)
    np.testing.assert_allclose(table[tokens], 161 * per_call, rtol=1e-12)
    assert msg[4] < 8 * 2**20 == msg[5]
    # Custom all-reduce is far cheaper than the 2023 NCCL profile in decode.
    assert table[16] < 0.2 * k.comm[16] and table[64] < 0.3 * k.comm[64]


def test_tensor_parallel_decode_speeds_up_as_measured():
    # Llama-3.1-8B on H100 per token, real vLLM: 8.66 ms at TP 1, 5.40 at TP 2 (ratio 0.62).
    for n in (8, 16, 32):
        b = Batch([], [], n, n * 1000)
        ratio = model(model="llama-3.1-8b", tensor_parallel_size=2).iteration_time(b) \
            / model(model="llama-3.1-8b").iteration_time(b)
        assert 0.55 < ratio < 0.72, (n, ratio)
        old = model("measured_2023", model="llama-3.1-8b", tensor_parallel_size=2) \
            .iteration_time(b) / model("measured_2023", model="llama-3.1-8b").iteration_time(b)
        assert old > 0.95          # the 2023 NCCL terms predicted (nearly) no speed-up


def test_iteration_is_its_formula_and_breakdown_sums():
    t = vllm_v1.terms()
    none = model("none", model="qwen2.5-7b")
    v1 = model(model="qwen2.5-7b")
    cpu = np.array(v1._floor)
    for b in (Batch([], [], 1, 600), Batch([], [], 48, 48 * 900), Batch([300], [600], 20, 9000)):
        g = none.iteration_time(b) + 28 * t["kernel_per_layer"] \
            + b.num_seqs * 152064 * t["sampler_per_logit"]
        want = max(g, cpu[b.num_seqs]) + t["step_gap"]
        assert v1.iteration_time(b) == pytest.approx(want, rel=1e-12)
        assert sum(v1.breakdown(b).values()) == pytest.approx(want, rel=1e-12)
    assert v1.output_delay == t["output_delay"] and none.output_delay == 0.0
    assert "vLLM 0.15" in v1.describe()
    # Sampling is GPU time: reported with the LM head, and slowed by a power cap in prefill.
    b = Batch([2048], [0])
    parts, gpu_none = v1.breakdown(b), none.breakdown(b)
    assert parts["embedding"] == pytest.approx(gpu_none["embedding"] + 152064
                                               * t["sampler_per_logit"], rel=1e-12)
    kw = dict(model="llama-2-70b", tensor_parallel_size=4)
    cap, plain = model(gpu="h100-sxm-pcap", **kw), model(**kw)
    gpu = sum(v for k, v in plain.breakdown(b).items() if k != "overhead")
    assert cap.iteration_time(b) - plain.iteration_time(b) == pytest.approx(gpu * 0.3, rel=1e-9)


def test_fitted_terms_are_physical_and_the_fit_is_deterministic():
    t = vllm_v1.fit_terms()
    assert t == vllm_v1.fit_terms()
    assert all(t[name] >= 0 for name in vllm_v1.TERMS)
    assert 0.5e-6 < t["allreduce_latency"] < 10e-6          # a few microseconds per call
    assert 1e-3 < t["output_delay"] < 20e-3
    assert t["step_gap"] == overhead.overlapped_gap()
    loo = vllm_v1.fit_terms(exclude=vllm_v1.load_runs().experiment.iloc[0])
    assert loo != t and loo["allreduce_latency"] == pytest.approx(t["allreduce_latency"],
                                                                  rel=0.5)
    with pytest.raises(ValueError, match="exclude: no run named 'nope'"):
        vllm_v1.fit_terms(exclude="nope")


def test_the_bundled_runs():
    runs = vllm_v1.load_runs()
    assert len(runs) == 13 and len(vllm_v1.load_runs(include_moe=True)) == 17
    assert set(runs.model) <= set(MODELS)
    l2 = runs[runs.experiment.str.startswith("20260217-231439")].iloc[0]
    assert (l2.prompt_tokens, l2.system_prompt_tokens) == (575, 105)
    assert l2.stages == [(8.0, 600.0), (20.0, 600.0)]
    # The published itl_mean is per re-counted token for the Llama-2 family only.
    ratio = runs.itl_mean / runs.engine_itl
    assert (ratio[runs.model == "llama-2-7b"] > 1.15).all()
    assert (ratio[~runs.model.isin(vllm_v1.LLAMA2_FAMILY)].between(0.99, 1.03)).all()
    with pytest.raises(ValueError, match="stages_rate_x_seconds: '8x'"):
        vllm_v1.parse_stages("8x")


def test_requests_reuse_prompts_as_the_load_generator_did():
    run = next(vllm_v1.load_runs().itertuples())
    df = validate_vllm.requests_of(run, [0.0, 700.0])
    stage0, stage1 = df[df.stage == 0], df[df.stage == 1]
    assert len(stage0) == 5 * 600 and len(stage1) == 10 * 600
    assert stage0.arrival_at.min() == 1.0 and stage0.arrival_at.max() < 601.0
    assert stage1.arrival_at.min() == 701.0
    ids = stage0.hash_ids.tolist()
    assert ids[0] == ids[100] and ids[0] != ids[1]              # prompt[n % 100]
    assert stage1.hash_ids.iloc[5] == ids[5]                     # each stage counts from 0
    groups = {tuple(i)[0] for i in ids[:100]}
    assert groups == set(range(10))                              # 10 system prompts
    assert df.attrs["hash_block_size"] == run.system_prompt_tokens
    assert (df.num_prompt_tokens == 592).all() and (df.num_output_tokens == 247).all()


def test_quick_validation_runs_and_vllm_v1_beats_the_2023_default():
    table = validate_vllm.main(["--quick", "--runs", "1", "--quiet", "--out",
                                str(pytest.importorskip("tempfile").mkdtemp())])
    assert set(table.profile) == {"measured_2023", "vllm_v1"}
    row = table.set_index("profile")
    assert abs(row.loc["vllm_v1", "e2e_mean_error"]) < 15
    assert abs(row.loc["vllm_v1", "e2e_mean_error"]) < abs(row.loc["measured_2023",
                                                                   "e2e_mean_error"])
    assert row.loc["vllm_v1", "ttft_steps_simulated"] > 2.5 > row.loc[
        "measured_2023", "ttft_steps_simulated"]
    assert (table.num_unfinished == 0).all()
    summary = table.attrs["summary"]
    assert list(summary.index) == ["measured_2023", "vllm_v1"]


def test_loo_terms_simulate_through_an_explicit_cost_model():
    run = next(vllm_v1.load_runs().itertuples())
    terms = {**vllm_v1.terms(), "output_delay": 0.0}
    df = validate_vllm.simulate_run(run, "vllm_v1_loo", seconds=5.0, terms=terms)
    assert "engine_first_token_at" not in df and (df.status == "finished").all()
    cm = CalibratedCostModel(MODELS[run.model], GPUS[run.gpu], 1, run.model,
                             engine_overhead="vllm_v1", engine_terms=terms)
    assert cm.output_delay == 0.0


def test_a_stage_starts_only_after_the_last_one_finished(monkeypatch):
    # With idle time guessed too short the stages would overlap: the run is redone with the
    # second stage moved past the first one's last finish.
    run = next(vllm_v1.load_runs().itertuples())
    for gap in (-4.0, -5.0):            # the second stage starts 1 s after the first, or with it
        monkeypatch.setattr(validate_vllm, "STAGE_GAP", gap)
        df = validate_vllm.simulate_run(run, "vllm_v1", seconds=5.0)
        first, second = df[df.stage == 0], df[df.stage == 1]
        assert len(first) == 25 and len(second) == 50
        # Stage 0 holds the first 25 of its own arrivals: 5 req/s from 1 s on.
        assert first.arrival_at.min() == 1.0 and first.arrival_at.max() < 6.0
        assert first.finished_at.max() < second.arrival_at.min()
        assert (df.status == "finished").all()
