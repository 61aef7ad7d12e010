"""The batching baselines: static batching, prefill-first (no chunking) and stall-free."""

import simsched
from simsched.config import SchedulerConfig, SimConfig
from simsched.engine.kv.cache import KVCacheManager
from simsched.request import Request
from simsched.engine.scheduler.core import Scheduler
from simsched.workloads.workload import WorkloadConfig

WORKLOAD = WorkloadConfig(name="lesson", num_requests=120, rate=30.0, lengths="uniform",
                          prompt_range=(20, 600), output_range=(10, 200))


def test_static_batching_never_admits_mid_batch():
    sched = Scheduler(SchedulerConfig(style="static", max_num_seqs=4,
                                      max_num_batched_tokens=512), KVCacheManager(500, 16))
    for i in range(10):
        sched.add(Request(i, 0.0, 30 + 10 * i, 5 + 3 * i), 0.0)
    now, batches = 0.0, 0
    while sched.has_work():
        before = set(sched.running)
        sched.schedule(now)
        admitted = set(sched.running) - before
        assert not admitted or not before, "admitted while a batch was running"
        batches += bool(admitted)
        sched.commit(now + 1)
        now += 1
    assert batches == 3   # 4 + 4 + 2


def test_prefill_first_never_mixes_prefill_and_decode():
    config = SimConfig(workload=WORKLOAD, check_invariants=True).replace(
        style="prefill_first", max_num_seqs=32)
    it = simsched.simulate(config).iterations
    mixed = it[(it["num_prefill_tokens"] > 0) & (it["num_decode_tokens"] > 0)]
    assert len(mixed) == 0
    assert (it["num_prefill_tokens"] > 0).any() and (it["num_decode_tokens"] > 0).any()
    stall_free = simsched.simulate(config.replace(style="stall_free")).iterations
    assert ((stall_free["num_prefill_tokens"] > 0) & (stall_free["num_decode_tokens"] > 0)).any()


def test_continuous_batching_beats_static_on_throughput():
    config = SimConfig(workload=WORKLOAD).replace(rate=60.0, max_num_seqs=32)
    tput = {style: simsched.simulate(config.replace(style=style)).summary()["output_throughput"]
            for style in ("static", "prefill_first", "stall_free")}
    assert tput["stall_free"] > tput["static"] and tput["prefill_first"] > tput["static"]
