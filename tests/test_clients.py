"""Benchmark clients (SimConfig.client): vllm bench serve's fixed concurrency, its random dataset
and InferenceX's, inference-perf's stages; checked against hand-built cases."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from simsched import SimConfig
from simsched.api import simulate
from simsched.config import ClientConfig
from simsched.workloads import benchmark_clients as bc

C = 16


def _config(**client) -> SimConfig:
    return SimConfig().replace(client=ClientConfig(**client))


def _peak_in_flight(df: pd.DataFrame) -> int:
    """Most requests between their send and the client's receipt (half-open intervals)."""
    df = df[df["status"] == "finished"]
    events = sorted([(t, 1) for t in df["arrival_at"]] + [(t, -1) for t in df["finished_at"]],
                    key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


@pytest.fixture(scope="module")
def thousand():
    """A fixed-concurrency random-dataset run of 1,000 requests (vllm bench serve's client)."""
    cfg = _config(client_type="concurrency", max_concurrency=C, dataset="random",
                  num_prompts=1000, random_input_len=512, random_output_len=64,
                  random_range_ratio=0.5, num_warmups=2 * C)
    return cfg, simulate(cfg)


def test_in_flight_never_exceeds_max_concurrency(thousand):
    _, res = thousand
    df = res.requests
    assert len(df) == 1000 and (df["status"] == "finished").all()
    assert _peak_in_flight(df) == C          # saturated: every slot used, never more
    assert res.info["client"]["max_num_in_flight"] == C


def test_next_request_is_sent_at_the_clients_receipt_of_a_finish(thousand):
    _, res = thousand
    df = res.requests.sort_values("request_id")
    start = res.info["client"]["benchmark_start_at"]
    sends = df["arrival_at"].to_numpy()
    # infinite rate: the first C leave at the benchmark's start (the last warm-up's receipt)
    assert (sends[:C] == start).all()
    # then the k-th send is exactly the k-th receipt (the client's finished_at, which is the
    # engine's finish plus the profile's output delay, not the engine's)
    receipts = np.sort(df["finished_at"].to_numpy())
    assert np.array_equal(sends[C:], receipts[:len(df) - C])
    assert (df["finished_at"] > df["engine_finished_at"]).all()
    # TTFT and E2E latency count from the send
    assert np.allclose(df["ttft"], df["first_token_at"] - df["arrival_at"], rtol=0, atol=0)
    assert np.array_equal(df["e2el"], df["finished_at"] - df["arrival_at"])


def test_warmups_are_sent_first_and_left_out(thousand):
    cfg, res = thousand
    info = res.info["client"]
    warm = 1 + 2 * C                         # the ready check, then 2C warm-ups
    assert info["num_warmup_requests"] == warm
    df = res.requests
    assert df["request_id"].min() == warm and len(df) == 1000
    # the warm-ups ran (the engine stepped before the measured requests were sent) ...
    assert res.iterations["started_at"].min() < info["benchmark_start_at"]
    assert (df["arrival_at"] >= info["benchmark_start_at"]).all()
    # ... and the summary counts only the measured requests
    assert res.summary()["num_requests"] == 1000


def test_one_slot_sends_each_request_at_the_previous_receipt():
    res = simulate(_config(client_type="concurrency", max_concurrency=1, dataset="random",
                           num_prompts=30, random_input_len=100, random_output_len=20,
                           random_range_ratio=0.5, ready_check=False))
    df = res.requests.sort_values("request_id")
    sends, receipts = df["arrival_at"].to_numpy(), df["finished_at"].to_numpy()
    assert sends[0] == 0.0
    assert np.array_equal(sends[1:], receipts[:-1])


def test_rate_limit_and_concurrency_interplay():
    n, rate = 400, 20.0
    cfg = _config(client_type="concurrency", max_concurrency=4, request_rate=rate,
                  burstiness=0.5, dataset="random", num_prompts=n, random_input_len=256,
                  random_output_len=128, ready_check=False)
    df = simulate(cfg).requests.sort_values("request_id")
    sched, sends = df["scheduled_at"].to_numpy(), df["arrival_at"].to_numpy()
    # the schedule is vLLM's: gamma gaps, cumulative, rescaled so the last is n / rate
    rng = np.random.default_rng(np.random.SeedSequence(cfg.seed, spawn_key=(5,)))
    expected = bc.vllm_send_offsets(rng, n, rate, 0.5)
    assert np.allclose(sched, expected, rtol=1e-12, atol=1e-12)
    assert math.isclose(expected[-1], n / rate)
    # a request leaves at its time if a slot is free, else at the receipt that frees one
    assert (sends >= sched).all()
    waited = sends > sched
    assert waited.any() and (~waited).any()          # both cases occur at this load
    receipts = set(df["finished_at"].tolist())
    assert all(s in receipts for s in sends[waited])
    assert np.array_equal(df["client_queue_time"].to_numpy(), sends - sched)
    assert _peak_in_flight(df) <= 4
    # in send order (FIFO slots): nobody overtakes
    assert (np.diff(sends) >= 0).all()


def test_without_a_concurrency_limit_each_request_leaves_at_its_time():
    df = simulate(_config(client_type="concurrency", request_rate=5.0, dataset="random",
                          num_prompts=50, random_input_len=128, random_output_len=16,
                          ready_check=False)).requests
    assert np.array_equal(df["arrival_at"].to_numpy(), df["scheduled_at"].to_numpy())
    assert (df["client_queue_time"] == 0).all()


def test_vllm_random_bounds_are_floor_and_ceil_inclusive():
    assert bc.vllm_random_bounds(1024, 128, 0.5) == (512, 1536, 64, 192)
    # floor(1024 * 0.2) of a float just below 204.8; ceil(1024 * 1.8) of 1843.2
    assert bc.vllm_random_bounds(1024, 128, 0.8) == (204, 1844, 25, 231)
    # the tokenizer's special tokens come off the sampled input (vLLM's real_input_len)
    assert bc.vllm_random_bounds(1024, 128, 0.0, num_special_tokens=1)[:2] == (1023, 1023)
    # output bounds are at least 1
    assert bc.vllm_random_bounds(10, 1, 0.9)[2:] == (1, 2)
    n = 20000
    table = bc.random_dataset(n, 7, 100, 10, 0.3, prefix_len=32, num_special_tokens=1)
    rng = np.random.default_rng(7)           # vLLM: RandomDataset's default_rng(seed)
    inputs = rng.integers(69, 129 + 1, size=n)
    outputs = rng.integers(7, 13 + 1, size=n)
    assert np.array_equal(table["num_prompt_tokens"].to_numpy(), inputs + 32 + 1)
    assert np.array_equal(table["num_output_tokens"].to_numpy(), outputs)
    sampled = table["num_prompt_tokens"] - 33
    assert sampled.min() == 69 and sampled.max() == 129        # both ends reached
    assert (table["prefix_group"] == 0).all() and (table["prefix_len"] == 33).all()


def test_inferencex_random_bounds_are_a_lower_share_of_the_length():
    assert bc.inferencex_random_bounds(1024, 1024, 0.8) == (819, 1024, 819, 1024)
    assert bc.inferencex_random_bounds(1000, 100, 1.0) == (1000, 1000, 100, 100)
    table = bc.random_dataset(5000, 3, 1024, 1024, 0.8, variant="inferencex")
    legacy = np.random.RandomState(3)        # InferenceX: np.random.seed(seed); randint
    assert np.array_equal(table["num_prompt_tokens"], legacy.randint(819, 1025, size=5000))
    assert np.array_equal(table["num_output_tokens"], legacy.randint(819, 1025, size=5000))


def test_inferencex_preset_runs_as_its_scripts_do():
    client = ClientConfig.preset("inferencex", max_concurrency=4, random_input_len=256,
                                 random_output_len=32)
    assert (client.num_prompts, client.num_warmups, client.resolved_ready_check) == (40, 8, False)
    res = simulate(SimConfig().replace(client=client))
    df = res.requests
    assert len(df) == 40 and res.info["client"]["num_warmup_requests"] == 8
    assert df["num_prompt_tokens"].between(204, 256).all()
    assert _peak_in_flight(df) <= 4


def test_prefix_and_warmup_copies_are_cached():
    res = simulate(SimConfig().replace(enable_prefix_caching=True, client=ClientConfig(
        client_type="concurrency", max_concurrency=2, dataset="random", num_prompts=20,
        random_input_len=256, random_output_len=8, random_prefix_len=512, num_warmups=2)))
    df = res.requests.sort_values("request_id")
    # the first measured request is the warm-ups' prompt: all of it but the last block hits
    assert df["num_cached_tokens"].iloc[0] >= df["num_prompt_tokens"].iloc[0] - 16
    # the others share the 512-token prefix
    assert (df["num_cached_tokens"].iloc[1:] >= 512).all()


def test_staged_client_follows_inference_perf():
    stages = ((2.0, 5.0), (4.0, 5.0))
    cfg = _config(client_type="staged", stages=stages, dataset="random",
                  random_input_len=128, random_output_len=16)
    res = simulate(cfg)
    df = res.requests.sort_values("request_id")
    assert df["stage"].value_counts().to_dict() == {0: 10, 1: 20}
    rng = np.random.default_rng(np.random.SeedSequence(cfg.seed, spawn_key=(5,)))
    first, second = (bc.constant_stage_offsets(rng, r, d) for r, d in stages)
    s0 = df[df["stage"] == 0]
    s1 = df[df["stage"] == 1]
    # stage 0 starts at 0; its timer 1 s later; its last request at the stage's end
    assert np.allclose(s0["scheduled_at"], 1.0 + first, rtol=0, atol=1e-12)
    assert math.isclose(first[-1], 5.0)
    # stage 1 starts at the first 1 s poll after stage 0's last receipt, plus 1 s
    start = math.ceil(s0["finished_at"].max()) + 1.0
    assert np.allclose(s1["scheduled_at"], start + 1.0 + second, rtol=0, atol=1e-9)
    assert (s1["arrival_at"] > s0["finished_at"].max()).all()


def test_poisson_stage_draws_a_count_per_second():
    rng = np.random.default_rng(1)
    times = bc.poisson_stage_offsets(rng, 10.0, 30.0)
    assert len(times) == 300 and (np.diff(times) > 0).all()
    rng = np.random.default_rng(1)
    count = int(rng.poisson(10.0))
    assert math.isclose(times[count - 1], 1.0)       # the first second's requests end at 1 s


def test_cycled_prompt_pool_repeats_prompts():
    cfg = SimConfig().replace(client=ClientConfig(
        client_type="staged", stages=((10.0, 3.0),), num_unique_prompts=5, dataset="random",
        random_input_len=64, random_output_len=4, random_range_ratio=0.5))
    df = simulate(cfg).requests.sort_values("request_id")
    lengths = df["num_prompt_tokens"].to_numpy()
    assert len(lengths) == 30 and np.array_equal(lengths[5:], lengths[:-5])


def test_workload_dataset_sends_the_workloads_prompts_in_order():
    base = SimConfig().replace(name="sharegpt", num_requests=50, max_prompt_tokens=3072,
                               long_prompt_policy="clip")
    table = simulate(base).requests.sort_values("request_id")
    df = simulate(base.replace(client=ClientConfig(client_type="concurrency",
                                                   max_concurrency=3, ready_check=False))
                  ).requests.sort_values("request_id")
    assert np.array_equal(df["num_prompt_tokens"], table["num_prompt_tokens"])
    assert np.array_equal(df["num_output_tokens"], table["num_output_tokens"])
    assert _peak_in_flight(df) <= 3


def test_sessions_with_a_client_are_refused():
    cfg = SimConfig().replace(name="sessions", num_requests=3, client=ClientConfig(
        client_type="concurrency", max_concurrency=2))
    with pytest.raises(ValueError, match="closed-loop sessions"):
        simulate(cfg)


def test_client_config_round_trips_through_json():
    cfg = _config(client_type="staged", stages=[[8, 600], [20, 600]], stage_load="poisson",
                  dataset="inferencex-random", random_range_ratio=0.8, max_concurrency=128)
    back = SimConfig.from_json(cfg.to_json())
    assert back == cfg and back.client.stages == ((8.0, 600.0), (20.0, 600.0))
    cfg = SimConfig().replace(client=ClientConfig.preset("aiperf", max_concurrency=8,
                                                          num_warmups=16))
    assert SimConfig.from_json(cfg.to_json()) == cfg
    cfg = _config(client_type="concurrency", max_concurrency=8)
    assert SimConfig.from_json(cfg.to_json()).client.request_rate == math.inf
    with pytest.raises(ValueError, match="max_concurency"):
        SimConfig.from_dict({"client": {"max_concurency": 4}})
    assert cfg.replace(max_concurrency=32).client.max_concurrency == 32   # flat names route


def test_default_client_is_open_and_changes_nothing():
    cfg = SimConfig().replace(num_requests=40)
    assert cfg.client.is_open
    assert simulate(cfg).requests.equals(simulate(cfg.replace(client=ClientConfig())).requests)
    assert "scheduled_at" not in simulate(cfg).requests


CONC = {"client_type": "concurrency"}
RANDOM = {"client_type": "concurrency", "dataset": "random"}
BAD = [
    ("client_type", "closed", {}, "concurrency"),
    ("max_concurrency", 0, CONC, "[1, inf]"),
    ("max_concurrency", 2.5, CONC, "integer"),
    ("request_rate", 0.0, CONC, "(0.0, inf]"),
    ("burstiness", -1.0, CONC, "(0.0, inf]"),
    ("request_timing", "sglang", CONC, "inferencex"),
    ("num_prompts", 0, CONC, "[1, inf]"),
    ("num_warmups", -1, CONC, "[0, inf]"),
    ("ready_check", "yes", CONC, "True or False"),
    ("dataset", "sharegpt", CONC, "inferencex-random"),
    ("random_input_len", 0, RANDOM, "[1, inf]"),
    ("random_input_len", 1, {**RANDOM, "random_range_ratio": 0.5}, "too small"),
    ("random_output_len", -3, RANDOM, "[1, inf]"),
    ("random_range_ratio", -0.1, RANDOM, "[0.0, 1.0]"),
    ("random_range_ratio", 1.0, RANDOM, "[0, 1)"),
    ("random_range_ratio", 1.5, {**RANDOM, "dataset": "inferencex-random"}, "[0.0, 1.0]"),
    ("random_range_ratio", 0.001, {**RANDOM, "dataset": "inferencex-random"}, "0-token"),
    ("random_range_ratio", 0.5, CONC, "not 'workload'"),
    ("random_prefix_len", -1, RANDOM, "[0, inf]"),
    ("num_special_tokens", -1, RANDOM, "[0, inf]"),
    ("ignore_eos", False, CONC, "end-of-sequence"),
    ("num_unique_prompts", 0, CONC, "[1, inf]"),
    ("prompt_order", "round_robin", CONC, "shuffle"),
    ("warmup_prompts", "last", CONC, "dataset"),
    ("stages", ((8, 0),), {"client_type": "staged"}, "stages[0].seconds"),
    ("stages", ((-1, 10),), {"client_type": "staged"}, "stages[0].rate"),
    ("stages", (8, 600), {"client_type": "staged"}, "(rate, seconds) pairs"),
    ("stages", ((0.1, 1.0),), {"client_type": "staged"}, "send no request"),
    ("stages", (), {"client_type": "staged"}, "at least one"),
    ("stages", ((8, 60),), CONC, "client_type='staged'"),
    ("stage_load", "burst", {"client_type": "staged", "stages": ((1, 5),)}, "poisson"),
    ("stage_lead_time", -1.0, {"client_type": "staged", "stages": ((1, 5),)}, "[0.0, inf]"),
    ("stage_poll_time", math.inf, {"client_type": "staged", "stages": ((1, 5),)}, "finite"),
    ("stage_interval_time", float("nan"), {"client_type": "staged", "stages": ((1, 5),)},
     "number"),
    ("max_concurrency", 4, {}, "client_type"),
    ("request_rate", 4.0, {"client_type": "staged", "stages": ((1, 5),)}, "'concurrency'"),
]


@pytest.mark.parametrize("name, value, extra, needle", BAD,
                         ids=[f"{c[0]}={c[1]!r}" for c in BAD])
def test_bad_client_field_is_refused_naming_it(name, value, extra, needle):
    with pytest.raises(ValueError) as info:
        ClientConfig(**{**extra, name: value})
    message = str(info.value)
    assert f"client.{name}" in message and needle in message


def test_every_client_field_has_a_bad_value_case():
    assert sorted({f.name for f in dataclasses.fields(ClientConfig)} - {c[0] for c in BAD}) == []


def test_cli_names_the_client(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "simsched", "run", "--client", "concurrency",
         "--max-concurrency", "4", "--dataset", "random", "--random-input-len", "256",
         "--random-output-len", "16", "--num-prompts", "24", "--num-warmups", "2",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    cfg = SimConfig.from_json(tmp_path / "config.json")
    assert cfg.client.max_concurrency == 4 and cfg.client.num_warmups == 2
    assert len(pd.read_csv(tmp_path / "requests.csv")) == 24
    bad = subprocess.run([sys.executable, "-m", "simsched", "run", "--client", "concurrency",
                          "--max-concurrency", "0", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "client.max_concurrency" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_staged_shared_prefix_pool_as_the_vllm_015_runs_sent_it():
    # inference-perf's shared-prefix prompts: a pool sent in turn, restarting each stage
    cfg = SimConfig.preset("vllm_v1", enable_prefix_caching=True).replace(
        name="shared-prefix", system_prompt_len=160, num_prefix_groups=2, prompt_len=64,
        output_len=8, client=ClientConfig(client_type="staged", stages=((4.0, 5.0), (4.0, 5.0)),
                                          num_unique_prompts=6))
    df = simulate(cfg).requests.sort_values("request_id")
    for _, stage in df.groupby("stage"):
        lengths = stage["num_prompt_tokens"].to_numpy()
        assert len(lengths) == 20 and np.array_equal(lengths[6:], lengths[:-6])
    # after the pool's first round, a repeated prompt is served from the cache
    later = df.iloc[6:20]
    assert (later["num_cached_tokens"] >= 160).all()


def test_concurrency_sweep_experiment_runs_quick(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "experiments.load_sweep", "--concurrency",
                           "--quick", "--quiet", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pd.read_csv(tmp_path / "concurrency.csv")
    assert table["max_concurrency"].tolist() == [1, 4, 16]
    assert (table["max_num_in_flight"] == table["max_concurrency"]).all()
    # the stand-in counts the wait for a slot as TTFT: far above the client's at C = 1
    assert (table["stand_in_ttft_p50"] > 10 * table["ttft_p50"]).iloc[0]


def test_validate_vllm_replays_the_015_runs_through_the_staged_client():
    from experiments import validate_vllm
    from simsched.cost import vllm_v1

    run = next(vllm_v1.load_runs().itertuples())
    df = validate_vllm.simulate_client_run(run, "vllm_v1", seconds=5.0)
    assert (df["status"] == "finished").all()
    assert df.groupby("stage").size().tolist() == [int(rate * 5.0) for rate, _ in run.stages]
    first, second = df[df["stage"] == 0], df[df["stage"] == 1]
    assert second["scheduled_at"].min() > first["finished_at"].max() + 2.0    # poll + 1 s + lead
    # the load generator's prompts: group system prompts shared through the prefix cache
    assert (df.sort_values("request_id")["num_cached_tokens"].iloc[10:] > 0).mean() > 0.5
