"""Issue 40's semantic defects 3, 8, 9, 14, 15 and 16: each test failed on the code before its fix
(or pins behaviour the docs now explain)."""

from __future__ import annotations

import pytest

import simsched
from simsched import SimConfig
from simsched.config.parallel import ParallelConfig
from simsched.cost.base import Batch
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.hardware import GPUS, MODELS


# ----------------------------------------------------------------------------- defect 3: MoE skew


@pytest.mark.parametrize("model,gpu,tp", [("qwen3-30b-a3b", "h100-sxm", 4),
                                          ("llama-4-scout-17b-16e", "a100-80gb", 2)])
def test_routing_skew_never_makes_an_expert_parallel_step_faster(model, gpu, tp):
    # Before: a Zipf skew thinned the experts each rank read, so a memory-bound decode of
    # Qwen3-30B-A3B at TP 4 + EP ran 19 % faster at skew 2 than with uniform routing (batch 32).
    def times(skew):
        par = ParallelConfig(enable_expert_parallel=True, expert_routing_skew=skew)
        m = CalibratedCostModel(MODELS[model], GPUS[gpu], tp, engine_overhead="none",
                                parallel=par)
        decodes = [m.iteration_time(Batch([], [], b, b * 300)) for b in (2, 8, 32, 128, 512)]
        return decodes + [m.iteration_time(Batch([c], [0])) for c in (256, 4096)]

    uniform = times(0.0)
    for skew in (0.5, 1.0, 2.0, 4.0):
        assert all(s >= u for s, u in zip(times(skew), uniform)), skew
    # A big prefill is compute bound: there the busiest rank's extra rows show.
    assert times(2.0)[-1] > uniform[-1]


def test_routing_skew_costs_expert_parallel_decode_time_end_to_end():
    # A burst of 256 requests: every step is a big batch, the schedule is the same up to its
    # step times, so the busiest rank's extra rows show end to end. (At a light Poisson load
    # the queueing's own variation, about 2 % between seeds, is larger than skew's cost.)
    def run(skew):
        cfg = SimConfig().replace(model="qwen3-30b-a3b", gpu="h100-sxm", tensor_parallel_size=4,
                                  num_requests=256, rate=1000.0, seed=1,
                                  parallel=dict(enable_expert_parallel=True,
                                                expert_routing_skew=skew))
        s = simsched.simulate(cfg).summary()
        return s["tpot_p50"], s["duration"]

    (tpot_skewed, end_skewed), (tpot_uniform, end_uniform) = run(2.0), run(0.0)
    assert tpot_skewed > tpot_uniform and end_skewed > end_uniform


def test_routing_skew_changes_nothing_without_expert_parallelism():
    # Every TP rank holds a slice of every expert, so an uneven load still splits evenly.
    def linear(skew):
        m = CalibratedCostModel(MODELS["qwen3-30b-a3b"], GPUS["h100-sxm"], 4,
                                engine_overhead="none",
                                parallel=ParallelConfig(expert_routing_skew=skew))
        return [m.breakdown(Batch([], [], b, b * 300))["linear"] for b in (1, 32, 512)]

    assert linear(2.0) == linear(0.0)


# ----------------------------------------------------------------------------- defect 8: run end

def _autoscaled(workload, auto, num_replicas=2, **config):
    import dataclasses

    from simsched.config.cluster import ClusterConfig

    cfg = dataclasses.replace(SimConfig(**config), workload=workload, cluster=ClusterConfig(
        num_replicas=num_replicas, autoscaling=auto))
    return simsched.simulate(cfg)


def _short_burst():
    from simsched.workloads.workload import WorkloadConfig

    return WorkloadConfig(name="custom", lengths="fixed", prompt_len=256, output_len=64,
                          num_requests=40, rate=20.0)


def _slow_scale_up(**changes):
    from simsched.config.autoscaling import AutoscalingConfig

    return AutoscalingConfig(policy="scheduled", plan=((0.5, 4),), provisioning_time=30.0,
                             model_load_time=30.0, interval=1.0, price_per_hour=3600.0,
                             **changes)


def test_an_autoscaled_run_and_its_bill_end_with_the_work():
    # Before: the two replicas still provisioning (60 s from 0.5 s) carried the run to 60.5 s
    # and the bill to 241 replica-seconds, though the last request ended at 3.0 s.
    res = _autoscaled(_short_burst(), _slow_scale_up())
    fixed = simsched.simulate(SimConfig(workload=_short_burst()).replace(num_replicas=2))
    assert res.requests.equals(fixed.requests)      # the extra replicas never became routable
    assert res.sim_time == fixed.sim_time < 4.0
    units = res.fleet.units
    assert units["billed_time"].tolist() == pytest.approx(
        [res.sim_time, res.sim_time, res.sim_time - 0.5, res.sim_time - 0.5])
    # Price 3600 per hour: the cost is the replica-seconds billed.
    assert res.fleet.cost == pytest.approx(4 * res.sim_time - 1.0)
    timeline = res.fleet.timeline
    assert timeline["at"].iloc[-1] == res.sim_time
    assert timeline["cost"].iloc[-1] == pytest.approx(res.fleet.cost)


def test_an_autoscaled_run_stops_at_max_sim_time_if_the_work_goes_on():
    res = _autoscaled(_short_burst(), _slow_scale_up(), max_sim_time=1.0)
    assert res.sim_time == 1.0
    assert res.fleet.cost == pytest.approx(4 * 1.0 - 1.0)


def test_an_autoscaled_closed_loop_run_does_not_end_between_turns():
    # Every turn is followed by a 3 s think time with nothing in flight: the run must wait for
    # the sessions, not stop when the requests so far have ended.
    from simsched.config.autoscaling import AutoscalingConfig
    from simsched.workloads.workload import WorkloadConfig

    wl = WorkloadConfig(name="sessions", num_turns=3, rate=4.0, num_requests=4,
                        think_time=("fixed", 3.0), lengths="uniform",
                        prompt_range=(20, 60), output_range=(10, 40))
    auto = AutoscalingConfig(policy="threshold", metric="running", target=4.0, interval=0.5,
                             min_replicas=1, max_replicas=3)
    res = _autoscaled(wl, auto, num_replicas=1)
    assert len(res.requests) == 12 and (res.requests["status"] == "finished").all()
    assert res.sim_time > 6.0


# ----------------------------------------------------------------------------- defect 9: aborts

def _scale_down(mode):
    from simsched.config.autoscaling import AutoscalingConfig
    from simsched.config.cluster import ClusterConfig
    from simsched.workloads.workload import WorkloadConfig

    wl = WorkloadConfig(name="custom", arrival="poisson", lengths="fixed", prompt_len=256,
                        output_len=128, rate=20.0, duration=20.0)
    auto = AutoscalingConfig(policy="scheduled", plan=((0.0, 4), (10.0, 2)),
                             provisioning_time=0.0, model_load_time=0.0, interval=5.0,
                             on_remove=mode)
    cfg = SimConfig(workload=wl, check_invariants=True, cluster=ClusterConfig(
        num_replicas=4, router="least_tokens", autoscaling=auto)).replace(max_num_seqs=16)
    return simsched.simulate(cfg)


def test_an_aborted_request_recomputes_nothing():
    # Before: the 16 requests aborted at a scale-down (none preempted) reported 4,949
    # num_recomputed_tokens, the KV they had computed.
    res = _scale_down("abort")
    df = res.requests
    aborted = df[df["status"] == "aborted"]
    assert len(aborted) > 5 and (aborted["num_preemptions"] == 0).all()
    assert (aborted["num_recomputed_tokens"] == 0).all()
    assert res.summary()["num_aborted"] == len(aborted)
    # The work they lost is counted apart, by replica (the invariant checks balance it: the
    # run above has check_invariants on).
    lost = res.info["num_aborted_kv_tokens"]
    assert lost > 0 and lost == sum(n for _, n in res.info["aborted_kv_tokens_by_replica"])
    # Migrating the same requests recomputes exactly what aborting them threw away.
    migrated = _scale_down("migrate")
    assert int(migrated.requests["num_recomputed_tokens"].sum()) == lost
    assert migrated.info["num_aborted_kv_tokens"] == 0


# ----------------------------------------------------------------------------- defect 14: stream_to

@pytest.mark.parametrize("target,match", [
    ("file", r"stream_to '.*file' is a file, not a directory"),
    ("file/sub", r"stream_to '.*file/sub' is under '.*file', which is a file"),
    ("/proc/simsched-stream", r"stream_to '/proc/simsched-stream': cannot make the directory"),
    (5, r"stream_to must be a directory path \(str or os.PathLike\), got int 5"),
    ("", r"stream_to must be a directory path, got an empty string"),
])
def test_a_bad_stream_to_is_refused_in_one_line_before_the_run(tmp_path, monkeypatch, target,
                                                               match):
    pytest.importorskip("pyarrow")
    from simsched.analysis import runner

    (tmp_path / "file").write_text("not a directory")
    if isinstance(target, str) and target and not target.startswith("/"):
        target = str(tmp_path / target)
    drawn = []
    monkeypatch.setattr(runner, "workload_requests", lambda config: drawn.append(config))
    # Before: NotADirectoryError, FileNotFoundError or TypeError from pathlib, raised once the
    # workload was drawn and the run set up.
    with pytest.raises(ValueError, match=match) as err:
        simsched.simulate(SimConfig().replace(num_requests=5), stream_to=target)
    assert "\n" not in str(err.value) and err.value.__cause__ is None
    assert not drawn


def test_a_good_stream_to_is_made_before_the_run(tmp_path):
    pytest.importorskip("pyarrow")
    run = simsched.simulate(SimConfig().replace(num_requests=5), stream_to=tmp_path / "a" / "b")
    assert len(run.frames()["requests"]) == 5


# ----------------------------------------------------------------------------- defect 15: steps

@pytest.mark.parametrize("mode", ["drain", "abort", "migrate"])
def test_record_steps_covers_replicas_added_and_removed_during_the_run(mode):
    from simsched.config.autoscaling import AutoscalingConfig
    from simsched.workloads.workload import WorkloadConfig

    wl = WorkloadConfig(name="custom", lengths="fixed", prompt_len=256, output_len=64,
                        num_requests=300, rate=20.0)
    auto = AutoscalingConfig(policy="scheduled", plan=((0.0, 1), (3.0, 4), (9.0, 2)),
                             provisioning_time=0.5, model_load_time=0.5, interval=1.0,
                             on_remove=mode)
    import dataclasses

    from simsched.config.cluster import ClusterConfig

    cfg = dataclasses.replace(SimConfig(), workload=wl,
                              cluster=ClusterConfig(num_replicas=1, autoscaling=auto))
    res = simsched.simulate(cfg, record_steps=True)
    steps, df, it = res.steps, res.requests, res.iterations
    # Before: only replica 0 (there at the start) was recorded; 134 of the 300 requests, all
    # served by the three replicas added at 3 s, had no step at all.
    assert sorted(steps["replica"].unique()) == [0, 1, 2, 3]
    assert set(steps["request_id"]) == set(df.loc[df["num_generated_tokens"] > 0, "request_id"])
    # One recorded step per logged iteration, replica by replica.
    per_replica = steps.groupby("replica")["step"].nunique()
    assert per_replica.to_dict() == it.groupby("replica").size().to_dict()
    # A finished request's decode tokens are all there (the first token ends its prefill; a
    # migrated one's recompute prefill also yields one, so those are left out here).
    done = df[df["status"] == "finished"].set_index("request_id")
    if "num_migrations" in done:
        assert done["num_migrations"].sum() >= 5
        done = done[done["num_migrations"] == 0]
    decoded = steps.groupby("request_id")["num_decode_tokens"].sum()
    assert (decoded[done.index] == done["num_output_tokens"] - 1).all()


# ----------------------------------------------------------------------------- defect 16: tiers

def test_a_small_lru_tier_loses_a_prefix_to_the_next_requests_own_blocks():
    from simsched.config.kv_tiers import KVTierConfig
    from simsched.engine.kv.tier import Tier

    mib = 2 ** 20
    tier = Tier(KVTierConfig(name="cpu", capacity_gib=12 * 8 / 1024), 8 * mib)
    assert tier.capacity_blocks == 12
    tier.store(1, 0, 10, 0.0)           # a system prompt's 10 blocks, evicted by the GPU
    tier.store(2, 0, 3, 0.0)            # then a question's: the prompt loses its tail
    assert tier.blocks[1] == [0, 9] and tier.num_used == 12
    tier.touch(1)                       # a hit makes it the most recent
    tier.store(3, 0, 2, 0.0)
    assert tier.blocks[2] == [0, 1] and tier.blocks[1] == [0, 9]     # the question pays
    tier.store(4, 0, 16, 0.0)           # one request's own 16 blocks: nothing else is left
    assert list(tier.blocks) == [4] and tier.blocks[4] == [0, 12]
    assert tier.inconsistency() is None


def test_a_cpu_tier_below_the_prefix_working_set_adds_almost_nothing():
    # 40 groups of 160-token prefixes, a 40-block GPU: the tier pays with its size, and a
    # 0.1 GiB one (12 blocks, fewer than one request stores) adds under a point (documented:
    # docs/kv_tiers.md, "A tier smaller than the prefix working set").
    from tools.docs.doc_kv_tiers import SMALL_CAPACITIES, small_tier_sweep

    t = small_tier_sweep().set_index("gib")
    assert SMALL_CAPACITIES[:2] == (0.0, 0.1)
    gain = t["hit_rate"] - t.loc[0.0, "hit_rate"]
    assert gain.loc[0.1] < 0.01 < 0.4 < gain.loc[float("inf")]
    assert gain.drop(0.0).is_monotonic_increasing
    assert t.loc[0.1, "blocks"] == 12 < t.loc[0.1, "stored_per_request"]
