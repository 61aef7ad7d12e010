"""AIConfigurator's own silicon runs as its generator deploys and benchmarks them
(experiments._silicon_aic), and validate_silicon's choice between that and InferenceX's client."""

from __future__ import annotations

import dataclasses
import functools

import pandas as pd
import pytest

from experiments import _silicon_aic as aic
from experiments import aic_runs, engine_silicon
from experiments import validate_silicon as vs


def _row(**fields):
    base = dict(id="r", backend="vllm", backend_version="0.12.0", mode="agg",
                system="h100_sxm", gpu="h100-sxm", model="llama-3.1-8b",
                model_path="meta-llama/Llama-3.1-8B-Instruct", precision="bf16", tp_size=1.0,
                pp_size=1.0, attention_dp_size=1.0, moe_tp_size=1.0, moe_ep_size=1.0,
                isl=1000, osl=100, concurrency=16.0, batch_size=16.0, aic_run=True)
    base.update(fields)
    return next(pd.DataFrame([base]).itertuples())


def test_the_generator_limits_and_aiperf_client_per_engine():
    row = _row()
    cfg, kind = vs.config_of(row, vs.ENGINES["vllm"])
    assert kind == aic.CLIENT
    sched, client = cfg.scheduler, cfg.client
    # vllm.rule: max_num_tokens = bs + ISL + 1500, max_seq_len = ISL + OSL + 1500.
    assert (sched.max_num_seqs, sched.max_num_batched_tokens) == (16, 16 + 1000 + 1500)
    assert cfg.hardware.max_model_len == 1000 + 100 + 1500
    # aiperf: fixed lengths, 20 x C measured after 2 x C warm-ups.
    assert (client.random_range_ratio, client.num_prompts, client.num_warmups) == (1.0, 320, 32)
    cfg, _ = vs.config_of(_row(backend="trtllm", backend_version="1.0.0rc3"),
                          vs.ENGINES["trtllm"])
    # trtllm.rule: rounded up to the 32-token block.
    assert cfg.scheduler.max_num_batched_tokens == (16 + 1000 + 1500 + 31) // 32 * 32
    assert cfg.scheduler.max_num_seqs == 16 and not cfg.scheduler.enable_chunked_prefill
    cfg, _ = vs.config_of(_row(backend="sglang", backend_version="0.5.6.post2"),
                          vs.ENGINES["sglang"])
    opts = cfg.scheduler.engine_options
    assert (opts["max_prefill_tokens"], opts["enable_mixed_chunk"]) == (2500, True)
    assert cfg.scheduler.max_num_seqs == 16


def test_sglang_mixed_chunk_follows_the_generators_history():
    assert aic.mixed_chunk(_row(backend_version="0.5.6.post2"))
    assert aic.mixed_chunk(_row(backend_version="0.5.8.post1"))
    assert not aic.mixed_chunk(_row(backend_version="0.5.1.post1"))
    row = _row(backend="sglang", backend_version="0.5.1.post1")
    cfg, _ = vs.config_of(row, vs.ENGINES["sglang"])
    assert cfg.scheduler.engine_options["enable_mixed_chunk"] is False
    forced = dataclasses.replace(vs.ENGINES["sglang"], aic_mixed=True)
    cfg, _ = vs.config_of(row, forced)
    assert cfg.scheduler.engine_options["enable_mixed_chunk"] is True


def test_only_aiconfigurators_runs_and_only_on_request():
    # InferenceX's rows keep InferenceX's client and the recipe's limits.
    cfg, kind = vs.config_of(_row(aic_run=False), vs.ENGINES["vllm"])
    assert kind == "inferencex" and cfg.client.random_range_ratio == 0.8
    assert cfg.scheduler.max_num_batched_tokens == 8192
    # aic_recipe='inferencex': what was assumed before for AIConfigurator's runs.
    before = dataclasses.replace(vs.ENGINES["vllm"], aic_recipe="inferencex")
    cfg, kind = vs.config_of(_row(), before)
    assert kind == "inferencex (assumed)" and cfg.client.random_range_ratio == 0.8
    with pytest.raises(ValueError, match="aic_recipe"):
        dataclasses.replace(vs.ENGINES["vllm"], aic_recipe="aiperf")


def test_reused_prompts_are_aiperfs_default_dataset():
    row = _row()
    cfg, _ = vs.config_of(row, vs.ENGINES["vllm"])
    assert (cfg.client.num_unique_prompts, cfg.client.prompt_order) == (None, "sequential")
    reused = dataclasses.replace(vs.ENGINES["vllm"], aic_reused=True)
    cfg, _ = vs.config_of(row, reused)
    client = cfg.client
    assert (client.num_unique_prompts, client.prompt_order, client.warmup_prompts) == \
        (100, "shuffle", "dataset")
    assert (client.num_prompts, client.num_warmups) == (320, 32)
    # 176 sends over 100 prompts, vLLM's prefix caching on: the repeats come from the cache
    short = _row(isl=4000, osl=8, concurrency=8.0, batch_size=8.0)
    fresh = vs.simulate_row(short, vs.ENGINES["vllm"])
    again = vs.simulate_row(short, reused)
    assert again["sim_ttft_ms"] < 0.7 * fresh["sim_ttft_ms"]


def test_the_recipe_column_names_the_generator():
    out = vs.simulate_row(_row(isl=200, osl=20, concurrency=4.0, batch_size=4.0),
                          vs.ENGINES["vllm"], num_prompts=8)
    assert out["reason"] == "" and out["recipe"] == aic.SOURCE
    assert out["client"] == aic.CLIENT and out["sim_ttft_ms"] > 0


def test_fixed_lengths_keep_sglangs_unmixed_waves_in_lock_step():
    # Without mixed chunks every waiting prompt is prefilled before any decode runs, so a
    # closed loop of fixed-length requests keeps starting together: the mean TTFT is most of
    # a wave's prefills. Mixed chunks let the first requests decode (and finish) earlier.
    # SGLang's overlap loop (the default) makes every arrival wait a step longer, which costs
    # the mixed waves' early first tokens some of their lead; the normal loop shows the waves
    # alone.
    base = _row(backend="sglang", backend_version="0.5.1.post1", isl=2000, osl=20,
                concurrency=8.0, batch_size=8.0)
    ttft = {}
    for overlap in (False, True):
        for mixed in (False, True):
            eng = dataclasses.replace(vs.ENGINES["sglang"], aic_mixed=mixed)
            if not overlap:
                eng = dataclasses.replace(eng, configure=functools.partial(
                    engine_silicon._without_overlap, eng.configure))
            ttft[overlap, mixed] = vs.simulate_row(base, eng, num_prompts=64)["sim_ttft_ms"]
    assert ttft[False, False] > 1.5 * ttft[False, True]
    assert ttft[True, False] > 1.2 * ttft[True, True]
    # The lock-stepped unmixed waves start each step with every arrival already waiting.
    assert ttft[True, False] == pytest.approx(ttft[False, False], rel=0.02)
    assert ttft[True, True] > ttft[False, True]


def test_the_comparison_experiment_runs_each_variant(tmp_path):
    rows = pd.DataFrame([_row(id=f"r{c}", concurrency=float(c), batch_size=float(c), isl=300,
                              osl=20, silicon_ttft_ms=50.0, silicon_tpot_ms=10.0)._asdict()
                         for c in (2, 4)]).drop(columns="Index")
    sg = rows.assign(id=rows.id + "s", backend="sglang", backend_version="0.5.1.post1")
    table = aic_runs.run(pd.concat([rows, sg], ignore_index=True), ("vllm", "sglang"))
    summ = aic_runs.summary(table)
    reused = "generator, 100 prompts reused"
    assert set(zip(summ.engine, summ.variant)) == {
        ("vllm", "generator"), ("vllm", "inferencex"), ("vllm", reused),
        ("sglang", "generator"), ("sglang", "generator, mixed chunk on"),
        ("sglang", "generator, mixed chunk off"), ("sglang", reused), ("sglang", "inferencex")}
    assert (summ.rows == 2).all()
    # The version rule picks unmixed for 0.5.1: the same figures as forcing it off.
    s = summ.set_index(["engine", "variant"])
    assert s.loc[("sglang", "generator"), "ttft_error"] == \
        s.loc[("sglang", "generator, mixed chunk off"), "ttft_error"]


def test_without_the_silicon_rows_the_experiment_says_so(tmp_path, capsys):
    empty = aic_runs.main(["--data", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o")])
    assert empty.empty and "aic_runs skipped" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        aic_runs.main(["--engines", "vllm,mlc", "--out", str(tmp_path / "o")])
