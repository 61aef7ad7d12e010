"""The SimPy internals simsched.engine.simpy_fast relies on exist and behave as it assumes.

A SimPy release that changes one fails here first, with a message naming it; pyproject.toml bounds
SimPy to the releases this passed on. Each fast path is also checked against what SimPy's public
API does for the same thing.
"""

import heapq
import itertools
import re
from importlib.metadata import version
from pathlib import Path

import pytest
import simpy
from simpy.core import NORMAL, URGENT

from simsched.engine import simpy_fast
from simsched.engine.simpy_fast import (LATE, Arrivals, RequestProcess, done_event,
                                        iteration_clock, late, request_starter)

ROOT = Path(__file__).resolve().parent.parent


def _simpy_bounds() -> tuple[tuple[int, ...], tuple[int, ...]]:
    text = (ROOT / "pyproject.toml").read_text()
    spec = re.search(r'"simpy>=([\d.]+),<([\d.]+)"', text)
    assert spec, "pyproject.toml must bound simpy from both sides (simpy_fast uses its internals)"
    return tuple(map(int, spec[1].split("."))), tuple(map(int, spec[2].split(".")))


def test_installed_simpy_is_in_the_range_pyproject_allows():
    low, high = _simpy_bounds()
    installed = tuple(int(p) for p in re.findall(r"\d+", version("simpy"))[:3])
    assert low <= installed < high, (
        f"SimPy {version('simpy')} is outside the tested range >={low},<{high}: "
        f"simsched.engine.simpy_fast relies on its internals (see that module)")


def _need(obj, *names):
    for name in names:
        assert hasattr(obj, name), (
            f"SimPy {version('simpy')}: {type(obj).__name__}.{name} is gone; "
            f"simsched.engine.simpy_fast relies on it (see its docstring)")


def test_environment_internals():
    env = simpy.Environment()
    _need(env, "_now", "_queue", "_eid", "_active_proc")
    assert isinstance(env._queue, list) and env._now == 0
    assert (URGENT, NORMAL, LATE) == (0, 1, 2)
    # schedule() pushes (now + delay, priority, next id, event) on the heap.
    event = done_event(env)                 # triggered: schedule() expects that
    env.schedule(event, NORMAL, 1.5)
    assert env._queue == [(1.5, NORMAL, 0, event)]
    assert next(env._eid) == 1 and isinstance(env._eid, type(itertools.count()))
    # The heap is the same list for the whole run (iteration_clock keeps a handle on it).
    heap, ids, ended = iteration_clock(env)
    assert heap is env._queue and ids is env._eid
    assert ended.triggered and ended.ok and ended.callbacks is None      # processed until pushed
    env.run()
    assert env._queue is heap and env.now == 1.5
    # Writing _now moves the clock (the GPU loop's direct step).
    env._now = 7.25
    assert env.now == 7.25
    assert env.timeout(1.0) in [e[3] for e in env._queue] and env._queue[0][0] == 8.25


def test_event_internals_and_processing():
    env = simpy.Environment()
    event = env.event()
    _need(event, "_value", "callbacks", "env")
    assert event._value is simpy.events.PENDING and not event.triggered
    event.succeed(3)
    _need(event, "_ok")
    assert event._ok is True and event._value == 3 and event.triggered
    seen = []
    event.callbacks.append(seen.append)
    env.step()
    # Processing calls the callbacks with the event and leaves callbacks None (processed).
    assert seen == [event] and event.callbacks is None and event.processed


@pytest.mark.parametrize("make", [simpy.Process, RequestProcess])
def test_a_done_event_fired_by_its_callbacks_resumes_its_process(make):
    """done_event: made without Event.__init__, triggered from the start; firing it as
    Environment.step processes an event resumes the waiting process with None."""
    env = simpy.Environment()
    done = done_event(env)
    assert done.triggered and done.ok and done.value is None and not done.processed
    seen = []

    def waiter():
        seen.append((yield done))
        seen.append(env.now)

    def firer():
        yield env.timeout(2.0)
        callbacks, done.callbacks = done.callbacks, None
        for callback in callbacks:
            callback(done)

    make(env, waiter())
    env.process(firer())
    env.run()
    assert seen == [None, 2.0] and done.processed


def test_process_internals():
    env = simpy.Environment()

    def gen():
        yield env.timeout(1)

    process = env.process(gen())
    _need(process, "_generator", "_target", "_resume")
    assert process._target is not None           # its Initialize event
    env.run()
    assert process.processed


def _scenarios(env, make):
    """The same processes under ``make`` (simpy.Process or RequestProcess): what they see."""
    seen = []

    def life(wait):
        try:
            got = yield env.timeout(wait, value=wait * 10)
            seen.append(("got", env.now, got))
        except simpy.Interrupt as interrupt:
            seen.append(("interrupted", env.now, interrupt.cause))
            yield env.timeout(1.0)
        return env.now

    def failing():
        yield env.timeout(0.25)
        raise KeyError("boom")

    def catching(victim):
        try:
            yield victim
        except KeyError as exc:
            seen.append(("caught", env.now, exc.args))

    a, b = make(env, life(5.0)), make(env, life(2.0))
    bad = make(env, failing())

    def watcher():
        seen.append(("joined", env.now, (yield b)))

    def interrupter():
        yield env.timeout(0.5)
        a.interrupt("kv_full")

    env.process(watcher())
    env.process(interrupter())
    env.process(catching(bad))
    env.run()
    return seen, (a.ok, a.value, b.ok, b.value, bad.ok, type(bad.value))


def test_request_process_resumes_as_simpy_process_does():
    """RequestProcess._resume is a copy of simpy.Process._resume: both give the same run."""
    expected = _scenarios(simpy.Environment(), simpy.Process)
    got = _scenarios(simpy.Environment(), RequestProcess)
    assert got == expected, (
        f"SimPy {version('simpy')}'s Process._resume now behaves differently from the copy in "
        f"simsched.engine.simpy_fast.RequestProcess: review it")
    assert expected[0][0] == ("caught", 0.25, ("boom",))


@pytest.mark.parametrize("make", [simpy.Process, RequestProcess])
def test_yielding_a_non_event_raises_simpys_error(make):
    env = simpy.Environment()

    def wrong():
        yield env.timeout(1)
        yield 42

    make(env, wrong())
    with pytest.raises(RuntimeError, match='Invalid yield value'):
        env.run()


def test_a_request_process_yielding_a_non_event_fails_the_run_clearly(monkeypatch):
    """Through a whole simulation: SimPy's error, not an AttributeError from inside simsched."""
    import simsched
    from simsched.cluster.cluster import Cluster
    from simsched.config import SimConfig
    from simsched.workloads.workload import WorkloadConfig

    def broken(self, req, record=None, process=None, done=None, now=None):
        yield "not an event"

    monkeypatch.setattr(Cluster, "_request", broken)
    config = SimConfig(workload=WorkloadConfig(name="lesson", num_requests=3, rate=1.0))
    with pytest.raises(RuntimeError, match=r"(?s)in broken.*Invalid yield value 'not an event'"):
        simsched.simulate(config)


def test_request_starter_is_env_process_less_its_initialize_event():
    """Started at an arrival, a request's process runs what env.process would run, at the same
    instants, and is handed itself and a done event that resumes it when fired."""
    runs = {}
    for how in ("simpy", "fast"):
        env = simpy.Environment()
        seen, waits = [], []

        def life(req, arg, process, done, now):
            seen.append((req.id, now, env.now, arg))
            if process is not None:
                assert env.active_process is process
            waits.append(done)
            value = yield done
            seen.append((req.id, "done", env.now, value))

        class Req:
            def __init__(self, i, at):
                self.id, self.arrival_at = i, at

        reqs = [Req(0, 0.0), Req(1, 0.5), Req(2, 0.5), Req(3, 2.0)]
        if how == "fast":
            Arrivals(env, reqs, request_starter(env, life, "arg"))
        else:
            def arrivals():
                for r in reqs:
                    if r.arrival_at > env.now:
                        yield env.timeout(r.arrival_at - env.now)
                    env.process(life(r, "arg", None, done_event(env), env.now))
            env.process(arrivals())

        def finisher():
            yield env.timeout(3.0)
            for done in waits:
                callbacks, done.callbacks = done.callbacks, None
                for callback in callbacks:
                    callback(done)
        env.process(finisher())
        env.run()
        runs[how] = seen
    assert runs["fast"] == runs["simpy"]
    assert runs["fast"][-1] == (3, "done", 3.0, None)


def test_late_events_come_after_every_other_event_of_their_instant():
    env = simpy.Environment()
    order = []
    late(env, 1.0).callbacks.append(lambda e: order.append("late"))
    env.timeout(1.0).callbacks.append(lambda e: order.append("normal"))
    urgent = env.event()
    urgent._ok, urgent._value = True, None
    env.schedule(urgent, URGENT, 1.0)
    urgent.callbacks.append(lambda e: order.append("urgent"))
    env.run()
    assert order == ["urgent", "normal", "late"] and env.now == 1.0


def test_iteration_end_event_pushed_on_the_heap_is_a_timeout_at_that_time():
    env = simpy.Environment()
    heap, ids, ended = iteration_clock(env)
    times = []

    def loop():
        for end in (0.5, 1.25):
            ended.callbacks = []
            heapq.heappush(heap, (end, LATE, next(ids), ended))
            yield ended
            times.append(env.now)

    env.process(loop())
    env.run()
    assert times == [0.5, 1.25]


def test_the_module_docstring_names_each_fast_path():
    doc = simpy_fast.__doc__
    for name in ("Arrivals", "RequestProcess", "request_starter", "done_event", "late",
                 "iteration_clock"):
        assert f"`{name}`" in doc, name


# SimPy's private names; the SimPy modules other than simpy_fast must not use them.
_PRIVATE = re.compile(r"\.(_now|_queue|_eid|_active_proc|_resume|_generator|_target|_defused|_ok|"
                      r"_value)\b|simpy\.(core|events)\b|Event\.__new__|PENDING")
# The one allowed: the GPU loop's direct clock step (a call into simpy_fast would cost every
# iteration; its docstring and test_environment_internals cover it).
# The second is no SimPy name: the scheduler's own waiting queue, which the replica's release of
# held-back arrivals pushes into directly (Replica._release).
_ALLOWED = {("simsched/engine/replica.py", "env._now = end"),
            ("simsched/engine/replica.py", "push = sched._queue.push")}


def test_simpy_internals_are_used_only_in_simpy_fast():
    from tests.test_layout import SIMPY_MODULES

    found = []
    for module in sorted(SIMPY_MODULES - {"simsched.engine.simpy_fast"}):
        rel = module.replace(".", "/") + ".py"
        for line in (ROOT / rel).read_text().splitlines():
            code = line.split("#")[0].strip()
            if _PRIVATE.search(code) and (rel, code) not in _ALLOWED:
                found.append(f"{rel}: {code}")
    assert not found, "SimPy internals outside simsched.engine.simpy_fast:\n" + "\n".join(found)
