"""Every place simsched reaches inside SimPy: the fast paths of a request's life and the GPU loop.

Everything else uses SimPy's public API (``Environment``, ``env.event``, ``env.timeout``,
``env.process``, ``env.schedule``, ``Event.callbacks``, ``Process.interrupt``, ``Interrupt``).
The fast paths below save SimPy work once per request or once per iteration, where that work is
a large share of a run's cost. They rely on internals of SimPy 4.1 (``Environment._now``,
``_queue``, ``_eid``, ``_active_proc``; ``Event._ok``, ``_value``, ``_defused``;
``Process._generator``, ``_target``, ``_resume``; the event heap's entries ``(time, priority,
event id, event)``). ``tests/test_simpy_internals.py`` checks that each exists and behaves as
relied on here, so a SimPy release that changes one fails there first, naming it; pyproject.toml
bounds SimPy to the tested releases.

What each replaces, and why the result is the same:

* :class:`Arrivals` replaces an arrival process that sleeps until each arrival and starts the
  request's process with ``env.process``. It is one event pushed on the heap at each arrival time
  itself (absolute: ``now + delay`` can miss ``arrival_at`` by an ulp), and starts the processes
  of that instant in id order, each taking its first step at once: what their ``Initialize``
  events, processed next at URGENT priority in that order, would have them do.
* :class:`RequestProcess` is ``simpy.Process`` with ``Process._resume`` copied, minus the event
  at its end that nobody waits for: processing a terminated process's event with no callbacks
  only marks it processed, so it is marked at once (no heap push and pop, no step of the event
  loop; other events keep their order, as event ids only ever grow). SimPy's check that a process
  yields events is kept, off the per-step path: the same ``RuntimeError`` (``Invalid yield
  value``) when the yielded object has no ``callbacks``.
* :func:`request_starter` replaces ``env.process(generator)`` for arriving requests (see
  :class:`Arrivals`) and hands the generator its process and its done event (below).
* :func:`done_event` replaces ``env.event()`` for an event that the replica fires at once, when
  SimPy would process it next (nothing else is due before it): it is created triggered (ok,
  value None), and firing it is ``callbacks, event.callbacks = event.callbacks, None`` and
  calling each callback with it, which is what ``Environment.step`` does when processing it.
* :func:`late` and :data:`LATE`: an event processed after every URGENT (0) and NORMAL (1) event
  of its instant (priority 2, through the public ``env.schedule``), so a batch is formed after
  every arrival of the instant it starts at.
* :func:`iteration_clock`: the GPU loop's handles on the clock. When no event is due before an
  iteration ends, the loop moves the clock itself (``env._now = end``, the one write of an
  internal outside this module: a call here would cost every iteration; SimPy would process the
  loop's timeout next and set the same time); otherwise it pushes its reusable iteration-end event
  on the heap at ``end`` with priority LATE, as ``env.schedule`` would at ``now + delay``.
* :func:`move_earlier`: a run of quiet decode steps (:mod:`simsched.engine.scheduler.quiet`) waits on a
  reusable event of :func:`iteration_clock`'s kind pushed at the run's end; an arrival that
  ends the run sooner moves the event's heap entry earlier in place (a decrease-key: the entry is
  replaced and sifted towards the root), so no entry is left behind to move the clock later.
* :func:`draw_event_id` draws the id an event scheduled now would get, for an entry pushed later
  that must sort as if it had been (:class:`Arrivals` takes it as ``eid``: a sharded run's shard
  runs ahead of its window's requests, :mod:`simsched.cluster.shard`).
* :func:`run` replaces ``env.run()`` (no ``until``): the same loop over the heap as
  ``Environment.step``, inlined (a fleet processes a few events per request, and a method call
  and its ``try`` per event were a few per cent of a run), with SimPy's handling of a failed
  event nobody defused and of ``StopSimulation``.
"""

from __future__ import annotations

import heapq

import simpy
from simpy.core import NORMAL, URGENT, StopSimulation

__all__ = ["LATE", "NORMAL", "URGENT", "Arrivals", "RequestProcess", "done_event",
           "draw_event_id", "event_at", "iteration_clock", "late", "move_earlier",
           "request_starter", "run"]

# SimPy processes an instant's events by priority (URGENT 0, NORMAL 1), then by scheduling order.
LATE = 2

_new_event = simpy.Event.__new__


class Arrivals(simpy.Event):
    """Starts each request's process at its arrival time: one event, rescheduled at each new
    arrival time (absolute, so the clock lands on ``arrival_at`` itself: ``0.2 + d`` is never
    exactly 0.9 for any float ``d``, so a timeout's ``now + delay`` can miss an arrival).

    Processing it calls ``start(req, now)`` for the requests arriving at that instant, in id
    order: what an arrival process creating each with ``env.process`` would do at that instant,
    without an arrival process to resume and an ``Initialize`` event per request (a third of the
    SimPy work of a request's life).
    """

    def __init__(self, env: simpy.Environment, requests, start, eid: int | None = None) -> None:
        self.env = env
        self._value = None
        self._ok = True
        self._requests = iter(requests)
        self._next = next(self._requests, None)
        self._start = start
        # Processing an event takes its callbacks list and leaves it as it was: each
        # rescheduling hands back the same one.
        self._callbacks = [self._arrive]
        self.callbacks = self._callbacks
        if eid is None:
            # First processed where an arrival process's start would be: URGENT, now.
            env.schedule(self, URGENT)
        elif self._next is not None:
            # Made as if at the earlier instant that drew event id ``eid``, every request
            # arriving later: its processing there would only have pushed this entry (a
            # sharded run's shard ran ahead of its window's requests: simsched.cluster.shard).
            heapq.heappush(env._queue, (self._next.arrival_at, NORMAL, eid, self))

    def _arrive(self, _event) -> None:
        env, start, requests = self.env, self._start, self._requests
        now, req = env._now, self._next
        while req is not None and req.arrival_at <= now:
            start(req, now)
            req = next(requests, None)
        self._next = req
        if req is not None:
            self.callbacks = self._callbacks
            heapq.heappush(env._queue, (req.arrival_at, NORMAL, next(env._eid), self))


class RequestProcess(simpy.Process):
    """A request's process: SimPy's, except that its end schedules no event when nobody waits
    for it (a request's process has nobody waiting unless a session started it).

    SimPy schedules a terminated process as an event so that processes waiting for it resume;
    with no callbacks, processing that event does nothing but mark it processed. Marking it
    processed at once saves a heap push and pop and a step of the event loop per request; the
    order of all other events is unchanged (event ids only ever grow).
    """

    def _resume(self, event) -> None:
        # simpy.Process._resume (SimPy 4.1), but for the end of the generator (see above).
        env = self.env
        env._active_proc = self
        generator = self._generator
        while True:
            try:
                if event._ok:
                    event = generator.send(event._value)
                else:
                    # An interrupt: throw a fresh copy, as SimPy does.
                    event._defused = True
                    exc = type(event._value)(*event._value.args)
                    exc.__cause__ = event._value
                    event = generator.throw(exc)
            except StopIteration as stop:
                self._ok = True
                self._value = stop.args[0] if stop.args else None
                if self.callbacks:
                    env.schedule(self)
                else:
                    self.callbacks = None           # processed: nobody to resume
                break
            except BaseException as exc:
                self._ok = False
                exc.__traceback__ = exc.__traceback__.tb_next
                self._value = exc
                env.schedule(self)                  # fails the run, as SimPy does
                break
            try:
                if event.callbacks is not None:     # pending: resume when it is processed
                    event.callbacks.append(self._resume)
                    break
            except AttributeError:
                # Not an event (no callbacks): SimPy's error, raised out of the run as SimPy's is.
                if hasattr(event, "callbacks"):
                    raise
                raise RuntimeError(f"\n{_where(generator)}Invalid yield value {event!r}: a "
                                   f"request process must yield SimPy events") from None
        self._target = event
        env._active_proc = None


def _where(generator) -> str:
    frame = generator.gi_frame
    if frame is None:
        return ""
    code = frame.f_code
    return f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}\n'


class _Started:
    """What a process's first step is resumed with (an ``Initialize`` event's value)."""

    _ok = True
    _value = None


def request_starter(env: simpy.Environment, make, arg):
    """The ``start(req, now)`` that :class:`Arrivals` calls for each arriving request.

    It creates the request's :class:`RequestProcess` and :func:`done_event` and has the process
    take its first step at once: ``make(req, arg, process, done, now)`` is its generator (as
    ``env.process(make(...))``, less its ``Initialize`` event; see the module docstring).
    """
    new, started, event = RequestProcess.__new__, _Started(), simpy.Event

    def start(req, now: float) -> None:
        process = new(RequestProcess)
        process.env = env
        process.callbacks = []
        done = _new_event(event)            # done_event(env), inlined: once per request
        done.env = env
        done.callbacks = []
        done._ok = True
        done._value = None
        process._generator = make(req, arg, process, done, now)
        process._resume(started)
    return start


def done_event(env: simpy.Environment) -> simpy.Event:
    """A new event to be fired at once by calling its callbacks (see the module docstring):
    created triggered (ok, value None), it is processed when its callbacks have been taken
    (``callbacks`` None)."""
    done = _new_event(simpy.Event)
    done.env = env
    done.callbacks = []
    done._ok = True
    done._value = None
    return done


def late(env: simpy.Environment, delay: float) -> simpy.Event:
    """A timeout of ``delay`` processed after every URGENT and NORMAL event of its instant."""
    event = _new_event(simpy.Event)
    event.env = env
    event.callbacks = []
    event._ok = True            # triggered, as simpy.Timeout is
    event._value = None
    env.schedule(event, LATE, delay)
    return event


def event_at(env: simpy.Environment, at: float, priority: float) -> simpy.Event:
    """A triggered event processed at the absolute time ``at`` (not ``now + delay``, which can
    miss it by an ulp) with ``priority``, e.g. between NORMAL and LATE (a sharded run's window
    end, :mod:`simsched.cluster.shard`)."""
    event = _new_event(simpy.Event)
    event.env = env
    event.callbacks = []
    event._ok = True
    event._value = None
    heapq.heappush(env._queue, (at, priority, next(env._eid), event))
    return event


def draw_event_id(env: simpy.Environment) -> int:
    """An event id drawn now, for an event pushed later that must sort among an instant's
    events as if scheduled now (:class:`Arrivals`' ``eid``; a sharded run's head start)."""
    return next(env._eid)


def at_time(env: simpy.Environment, when: float) -> simpy.Event:
    """A timeout processed at the absolute time ``when`` (not before now), so the clock lands
    on ``when`` itself (see :class:`Arrivals`: a relative delay can miss it by an ulp)."""
    return event_at(env, max(when, env._now), NORMAL)


def iteration_clock(env: simpy.Environment) -> tuple[list, object, simpy.Event]:
    """The GPU loop's handles on the clock (see the module docstring): the event heap (SimPy
    never replaces it), the event-id counter, and the loop's iteration-end event (triggered, and
    processed until pushed: give it a fresh ``callbacks`` list, push ``(end, LATE, next(ids),
    event)`` on the heap and yield it)."""
    event = _new_event(simpy.Event)
    event.env, event.callbacks, event._value, event._ok = env, None, None, True
    return env._queue, env._eid, event


def move_earlier(queue: list, old: tuple, new: tuple) -> None:
    """Replace the heap entry ``old`` (the very object) by ``new``, which sorts no later."""
    i = queue.index(old)        # found by identity; no two entries share an event id
    queue[i] = new
    heapq._siftdown(queue, 0, i)


def run_until(env: simpy.Environment, event: simpy.Event):
    """``env.run(until=event)`` on this loop: stop once ``event`` is processed, or when no
    event is left before it is (where ``env.run`` would raise)."""
    if event.callbacks is not None:
        event.callbacks.append(StopSimulation.callback)
    return run(env)


def run(env: simpy.Environment):
    """``env.run()``: process events until none is left (see the module docstring)."""
    queue, pop = env._queue, heapq.heappop
    while queue:
        env._now, _, _, event = pop(queue)
        callbacks, event.callbacks = event.callbacks, None
        try:
            for callback in callbacks:
                callback(event)
        except StopSimulation as stop:
            # As Environment.step and run: the event keeps its other callbacks for later.
            event.callbacks = callbacks[callbacks.index(callback) + 1:]
            env.schedule(event, URGENT - 1)
            return stop.args[0]
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc
    return None
