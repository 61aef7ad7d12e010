"""The defaults decide as vLLM V1 does; ``preset("classic")`` keeps the defaults before (issue 40).

``SimConfig()`` is ``SimConfig.preset("vllm_v1")`` field for field, replays every recorded vLLM
0.33 step (sync with a synchronous engine, async when the engine, by its profile or its
``async_scheduling`` flag, schedules asynchronously), and ``preset("classic")`` is exactly the
config of simsched before the change (the literal values below, copied from the code of
commit 445bf7d).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import simsched
from simsched import SimConfig, UnitCostModel
from simsched.config import SchedulerConfig, pipeline
from simsched.cost import overhead
from simsched.cost.factory import make_cost_model
from simsched.engine.kv.cache import KVCacheManager
from simsched.engine.scheduler.core import Scheduler
from simsched.policies import VICTIM_POLICIES
from simsched.request import Request

from benchmarks.parity.cases import MAX_MODEL_LEN, Case
from benchmarks.parity.compare import compare, unpack
from benchmarks.parity.sim import sim_requests, steps_of

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "vllm_parity"

# simsched's defaults before issue 40 (simsched/config/parts.py at 445bf7d), written out.
OLD_SCHEDULER = dict(
    style="stall_free", policy="fcfs", victim_policy="fewest_generated", preemption=False,
    preemption_mode="recompute", max_num_batched_tokens=2048, max_num_seqs=256,
    max_num_prefills=None, enable_chunked_prefill=True, max_num_preemptions=8,
    admit_after_preemption=False, reserve_full_isl=False, plan_ahead=False, policy_options={},
    async_scheduling=None, lora=None, speculative=None)
OLD_CACHE = dict(
    block_size=16, num_blocks=None, watermark=0.01, swap_space_gib=4.0,
    swap_bandwidth_gbps=25.0, enable_prefix_caching=False, prefix_hit_rule="token",
    watermark_counts_null_block=False, prefix_cache_model="segments", kv_tiers=None)
# What the vllm_v1 preset set before issue 40 (simsched/config/presets.py at 445bf7d), less
# its victim, which depended on the queue policy (newest; priority_arrival under priority).
OLD_VLLM_PRESET = dict(
    style="stall_free", preemption=False, preemption_mode="recompute",
    max_num_preemptions=sys.maxsize, admit_after_preemption=False,
    enable_chunked_prefill=True, max_num_prefills=None, reserve_full_isl=True,
    watermark=0.0, prefix_hit_rule="block", watermark_counts_null_block=True,
    prefix_cache_model="blocks")


def _fields(cfg: SimConfig) -> dict:
    return {f"{part}.{f.name}": getattr(getattr(cfg, part), f.name)
            for part in SimConfig._PARTS for f in dataclasses.fields(getattr(cfg, part))}


def test_the_defaults_are_the_vllm_v1_preset_field_for_field():
    plain, preset = SimConfig(), SimConfig.preset("vllm_v1")
    assert _fields(plain) == _fields(preset) and plain == preset
    for changes in ({"policy": "priority"}, {"max_num_seqs": 8, "enable_prefix_caching": True},
                    {"cache.watermark": 0.02, "victim_policy": "largest_kv"}):
        assert SimConfig.preset("vllm_v1", **changes) == SimConfig().replace(**changes)


def test_the_defaults_set_what_the_vllm_v1_preset_set():
    flat = SimConfig().flat()
    assert {k: flat[k] for k in OLD_VLLM_PRESET} == OLD_VLLM_PRESET
    # The victim and the pipeline follow the queue policy and the engine profile at run time.
    assert (flat["victim_policy"], flat["plan_ahead"]) == ("vllm_v1", None)


def test_classic_is_exactly_the_old_defaults():
    classic, plain = SimConfig.preset("classic"), SimConfig()
    for part, old in (("scheduler", OLD_SCHEDULER), ("cache", OLD_CACHE)):
        now = {f.name: getattr(getattr(classic, part), f.name)
               for f in dataclasses.fields(getattr(classic, part))}
        assert {k: now[k] for k in old} == old, part
        # A field added since keeps its default in both.
        assert {k: v for k, v in now.items() if k not in old} == \
            {k: getattr(getattr(plain, part), k) for k in now if k not in old}
    for part in ("hardware", "workload", "cluster"):
        assert getattr(classic, part) == getattr(plain, part)
    assert SimConfig.preset("classic", max_num_seqs=8, watermark=0.05).flat()["watermark"] == 0.05


@pytest.mark.parametrize("name", ["classic", "vllm_v1"])
def test_presets_round_trip_through_json(name):
    cfg = SimConfig.preset(name, policy="priority", seed=3)
    text = cfg.to_json()
    assert SimConfig.from_json(text) == cfg
    assert SimConfig.from_dict(json.loads(text)) == cfg
    if name == "vllm_v1":
        assert json.loads(text)["scheduler"]["plan_ahead"] is None


def test_a_preset_accepts_the_workload_name():
    # "name" is the workload's field; the preset's own name is positional only.
    cfg = SimConfig.preset("classic", name="azure-conv", rate=2.0)
    assert cfg.workload.name == "azure-conv" and cfg.scheduler.max_num_preemptions == 8


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown preset 'vllm_v2'; known: \['classic', "
                                         r"'sglang', 'trtllm', 'vllm_v1'\]"):
        SimConfig.preset("vllm_v2")


# ------------------------------------------------------------------ victims
def _running(specs):
    reqs = []
    for rid, (prio, arrival, seq) in enumerate(specs):
        r = Request(rid, arrival, 4, 4, priority=prio)
        r.admitted_seq = seq
        reqs.append(r)
    return reqs


@pytest.mark.parametrize("policy, rule", [("fcfs", "newest"), ("priority", "priority_arrival"),
                                          ("spf", "newest")])
def test_the_default_victim_is_vllms_under_each_policy(policy, rule):
    sched = Scheduler(SchedulerConfig(policy=policy), KVCacheManager(100, 16))
    assert sched.cfg.victim_policy == "vllm_v1"
    # Request 0 is the least urgent, latest arrival; request 2 the newest admitted.
    reqs = _running([(2, 5.0, 0), (0, 0.0, 1), (1, 1.0, 2)])
    expected = VICTIM_POLICIES[rule](reqs, sched).id
    assert expected == (0 if rule == "priority_arrival" else 2)
    assert sched.choose_victim(reqs, sched).id == expected


def test_an_explicit_victim_policy_still_wins():
    cfg = SimConfig().replace(policy="priority", victim_policy="fewest_generated")
    sched = Scheduler(cfg.scheduler, KVCacheManager(100, 16))
    assert sched.choose_victim is VICTIM_POLICIES["fewest_generated"]


# ------------------------------------------------------------------ sync or async by profile
class UnitProfile(UnitCostModel):
    """Unit steps under the vllm_v1 engine profile (an asynchronous engine)."""

    engine_overhead = "vllm_v1"


@pytest.mark.parametrize("profile, ahead", [("vllm_v1", True), ("measured_2023", False),
                                            ("overlapped", False)])
def test_plan_ahead_follows_the_engine_profile(profile, ahead):
    cfg = SimConfig().replace(engine_overhead=profile)
    cost = make_cost_model(cfg.hardware)
    assert overhead.async_scheduling(cfg, cost) is ahead      # the engine is pipelined
    assert pipeline.plan_ahead(cfg, cost) is ahead
    assert pipeline.arrival_rule(cfg, cost) is False           # one model of the pipeline
    classic = SimConfig.preset("classic", engine_overhead=profile)
    assert pipeline.plan_ahead(classic, cost) is False
    assert pipeline.arrival_rule(classic, cost) is ahead       # the arrival rule, as before


def test_plan_ahead_follows_the_flag_and_stays_off_under_speculation():
    unit = UnitCostModel()
    assert not pipeline.plan_ahead(SimConfig(), unit)
    assert pipeline.plan_ahead(SimConfig().replace(async_scheduling=True), unit)
    assert not pipeline.plan_ahead(SimConfig().replace(async_scheduling=False), UnitProfile())
    assert pipeline.plan_ahead(SimConfig().replace(plan_ahead=True), unit)
    spec = SimConfig().replace(speculative={"num_speculative_tokens": 2})
    assert not pipeline.plan_ahead(spec, UnitProfile())
    assert pipeline.arrival_rule(spec, UnitProfile())


def test_the_default_run_plans_ahead_under_the_default_profile():
    base = SimConfig().replace(num_requests=60, rate=40.0, max_num_seqs=4, num_blocks=40)
    cols = ["first_scheduled_at", "finished_at", "num_preemptions"]
    run = {v: simsched.simulate(base.replace(plan_ahead=v)).requests[cols]
           for v in (None, True, False)}
    assert run[None].equals(run[True])
    assert not run[None].equals(run[False])     # the case is one where the two models differ


def _fixture(mode: str):
    data = json.loads((FIXTURES / f"{mode}.json").read_text())
    for record in data["cases"]:
        yield Case.from_json(record["case"]), unpack(record["steps"])


def _limits(case: Case) -> dict:
    """The case's limits and knobs (vLLM's num_gpu_blocks counts its null block)."""
    return dict(policy=case.policy, max_num_seqs=case.max_num_seqs,
                max_num_batched_tokens=case.max_num_batched_tokens,
                block_size=case.block_size, num_blocks=case.num_blocks - 1,
                enable_prefix_caching=case.enable_prefix_caching, watermark=case.watermark,
                max_model_len=MAX_MODEL_LEN)


def _plain(case: Case, **changes) -> SimConfig:
    """Plain SimConfig() at the case's limits and knobs: no preset, no rule switched."""
    return SimConfig().replace(**_limits(case), reserve_full_isl=case.reserve_full_isl,
                               **changes)


@pytest.mark.parametrize("mode, cost_model, changes", [
    ("sync", UnitCostModel, {}),
    ("async", UnitProfile, {}),                         # async as the profile says
    ("async", UnitCostModel, {"async_scheduling": True}),  # async as the flag says
], ids=["sync", "async-profile", "async-flag"])
def test_plain_defaults_replay_every_recorded_vllm_step(mode, cost_model, changes):
    failures = []
    for case, vllm_steps in _fixture(mode):
        res = simsched.simulate(_plain(case, **changes), sim_requests(case),
                                cost_model=cost_model(), record_steps=True)
        outcome = compare(vllm_steps, steps_of(res.steps))
        if not outcome.identical:
            failures.append(f"{case.label()}\n{outcome.diff}")
    assert not failures, f"{len(failures)} cases differ:\n\n" + "\n\n".join(failures[:3])


def test_classic_differs_from_vllm_on_recorded_cases():
    # The classic rules are not vLLM's: some recorded sync cases tell them apart.
    differ = 0
    for case, vllm_steps in _fixture("sync"):
        cfg = SimConfig.preset("classic").replace(**_limits(case))
        res = simsched.simulate(cfg, sim_requests(case), cost_model=UnitCostModel(),
                                record_steps=True)
        differ += not compare(vllm_steps, steps_of(res.steps)).identical
    assert differ > 0


def test_static_batching_with_the_default_block_pool_is_refused_naming_the_fields():
    # The block pool's books did not hold under static batching (kv_conservation broke in the
    # fuzz campaign); it is refused at config time, the segments model runs.
    with pytest.raises(ValueError, match=r"style='static'.*prefix_cache_model='segments'"):
        SimConfig().replace(style="static", enable_prefix_caching=True)
    with pytest.raises(ValueError, match=r"cluster.replicas\[0\].*style='static'"):
        SimConfig().replace(enable_prefix_caching=True, num_replicas=2,
                            replicas=({"style": "static"},))
    cfg = SimConfig().replace(style="static", enable_prefix_caching=True,
                              prefix_cache_model="segments", num_requests=20, rate=5.0,
                              check_invariants=True)
    assert simsched.simulate(cfg).summary()["num_finished"] == 20


def test_cli_preset_classic(tmp_path):
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "simsched", "run", "--preset", "classic",
                    "--policy", "priority", "--num-requests", "5", "--num-blocks", "64",
                    "--cost-model", "unit", "--out", str(out)],
                   check=True, cwd=ROOT, capture_output=True)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["scheduler"]["victim_policy"] == "fewest_generated"
    assert (cfg["scheduler"]["plan_ahead"], cfg["cache"]["prefix_cache_model"]) \
        == (False, "segments")
