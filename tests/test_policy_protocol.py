"""The queue-policy protocol (simsched.policies.base.QueuePolicy): every built-in policy derives
from it, a custom policy's overridden hooks are called, hooks left at their defaults cost nothing,
and a duck-typed queue is refused with a clear error."""

import pytest

import simsched
from simsched.config import SchedulerConfig, SimConfig
from simsched.engine.kv.cache import KVCacheManager
from simsched.engine.scheduler.core import Scheduler
from simsched.policies import QUEUE_POLICIES, QueuePolicy, make_queue
from simsched.policies.queues import HeapQueue
from simsched.request import Request, Status
from simsched.workloads.workload import WorkloadConfig


def _spf_key(r, now):
    return (r.num_prompt_tokens, r.arrival_at, r.id)


@pytest.mark.parametrize("name", sorted(QUEUE_POLICIES))
def test_every_registered_policy_derives_from_the_protocol(name):
    queue = make_queue(name, {})
    assert isinstance(queue, QueuePolicy)
    # Every required method is implemented (QueuePolicy is abstract: instantiating proves it).
    assert not type(queue).__abstractmethods__


def test_hooks_left_at_their_defaults_are_never_called():
    fcfs = Scheduler(SchedulerConfig(policy="fcfs"), KVCacheManager(100, 16))
    assert fcfs._queue_update is None and fcfs._queue_refresh is None
    assert fcfs._may_preempt is None and fcfs.meter is None and not fcfs._special
    assert fcfs._static_ranks and not fcfs.preemptive
    # Policies with hooks get them read as attributes.
    lpm = Scheduler(SchedulerConfig(policy="lpm"), KVCacheManager(100, 16))
    assert lpm._queue_update == lpm.queue.update
    mlfq = Scheduler(SchedulerConfig(policy="mlfq"), KVCacheManager(100, 16))
    assert mlfq._may_preempt == mlfq.queue.may_preempt and mlfq.preemptive
    assert not mlfq._static_ranks and mlfq.queue._view is mlfq        # bound
    fair = Scheduler(SchedulerConfig(policy="fair"), KVCacheManager(100, 16))
    assert fair.meter is fair.queue.meter and fair.meter is not None
    sjf = Scheduler(SchedulerConfig(policy="sjf_oracle"), KVCacheManager(100, 16))
    assert sjf._memo_failed and not sjf._static_ranks


class _Recording(HeapQueue):
    """FCFS that records the times of its update hook."""

    def __init__(self) -> None:
        super().__init__(lambda r, now: (r.arrival_at, r.id))
        self.updates = []

    def update(self, now: float) -> None:
        super().update(now)
        self.updates.append(now)


def test_a_custom_policys_update_hook_is_called_every_iteration(monkeypatch):
    monkeypatch.setitem(QUEUE_POLICIES, "recording", lambda options, rng: _Recording())
    sched = Scheduler(SchedulerConfig(policy="recording"), KVCacheManager(100, 16))
    assert isinstance(sched.queue, _Recording)
    sched.add(Request(0, 0.0, 32, 3), 0.0)
    for now in (0.0, 1.0, 2.0, 3.0):
        sched.schedule(now)
        sched.commit(now + 0.5)
    assert sched.queue.updates == [0.0, 1.0, 2.0, 3.0]
    # A whole run with it: every request finishes, as under FCFS.
    workload = WorkloadConfig(name="lesson", num_requests=30, rate=20.0)
    config = SimConfig(workload=workload, check_invariants=True).replace(policy="recording")
    custom = simsched.simulate(config).summary()
    assert custom == simsched.simulate(config.replace(policy="fcfs")).summary()


class _Spf(HeapQueue):
    """Shortest prompt first (fixed keys)."""

    def __init__(self) -> None:
        super().__init__(_spf_key)


class _GuardedSpf(_Spf):
    """Shortest prompt first with a storm guard refusing every admission preemption."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = []

    def may_preempt(self, running: Request, waiting: Request) -> bool:
        self.asked.append((running.id, waiting.id))
        return False


def _admission_preemptions(monkeypatch, queue_type):
    monkeypatch.setitem(QUEUE_POLICIES, "custom", lambda options, rng: queue_type())
    cfg = SchedulerConfig(policy="custom", preemption=True, max_num_seqs=4,
                          max_num_batched_tokens=256)
    sched = Scheduler(cfg, KVCacheManager(12, 16))
    long = Request(0, 0.0, 120, 60)          # holds 8 of the 12 blocks after its prefill
    sched.add(long, 0.0)
    sched.schedule(0.0)
    sched.commit(1.0)
    short = Request(1, 1.0, 80, 5)           # needs 5 blocks: only preempting long frees them
    sched.add(short, 1.0)
    sched.schedule(1.0)
    return sched, [(v.id, c.reason) for v, c in sched.preempted]


def test_a_custom_policys_may_preempt_hook_decides_admission_preemptions(monkeypatch):
    # Fixed keys alone: the shorter prompt preempts the longer one.
    _, preempted = _admission_preemptions(monkeypatch, _Spf)
    assert preempted == [(0, "admission")]
    # The same keys with a storm guard: asked, it refuses, nobody is preempted (the guard was
    # ignored before the protocol: fixed keys skipped it).
    sched, preempted = _admission_preemptions(monkeypatch, _GuardedSpf)
    assert sched.queue.asked == [(0, 1)] and preempted == []
    assert sched.running and next(iter(sched.running.values())).status is Status.RUNNING


class _DuckQueue:
    """A queue with every required method but no QueuePolicy base."""

    def push(self, req, now):
        pass

    def peek(self):
        raise IndexError

    def pop(self):
        raise IndexError

    def ranks_below(self, req, other):
        return False

    def __len__(self):
        return 0

    def __iter__(self):
        return iter(())


def test_a_duck_typed_queue_is_refused_with_a_clear_error(monkeypatch):
    monkeypatch.setitem(QUEUE_POLICIES, "duck", lambda options, rng: _DuckQueue())
    with pytest.raises(TypeError, match=r"queue policy 'duck' returned a _DuckQueue, which does "
                                        r"not derive from simsched\.policies\.base\.QueuePolicy"):
        make_queue("duck", {})
    with pytest.raises(ValueError, match="scheduler.*QueuePolicy"):
        SchedulerConfig(policy="duck")
    sched = Scheduler(SchedulerConfig(), KVCacheManager(100, 16))
    with pytest.raises(TypeError, match="QueuePolicy"):
        sched.queue = _DuckQueue()


def test_a_queue_missing_a_required_method_cannot_be_built():
    class NoRanks(QueuePolicy):
        def push(self, req, now): ...
        def peek(self): ...
        def pop(self): ...
        def __len__(self): return 0
        def __iter__(self): return iter(())

    with pytest.raises(TypeError, match="ranks_below"):
        NoRanks()
