"""The SimPy objects of a request's start and end: arrivals and request processes.

:class:`Arrivals` starts each request's process at its arrival time, as the process's first step;
:class:`RequestProcess` is SimPy's process, minus the event at its end that nobody waits for.
"""

from __future__ import annotations

import heapq

import simpy
from simpy.core import NORMAL, URGENT


class Arrivals(simpy.Event):
    """Starts each request's process at its arrival time: one event, rescheduled at each new
    arrival time (absolute, so the clock lands on ``arrival_at`` itself: ``0.2 + d`` is never
    exactly 0.9 for any float ``d``, so a timeout's ``now + delay`` can miss an arrival).

    Processing it starts the processes of the requests arriving at that instant, in id order, as
    their processes' first steps: what an arrival process creating each with ``env.process``
    would do at that instant, without an arrival process to resume and an ``Initialize`` event
    per request (a third of the SimPy work of a request's life).
    """

    def __init__(self, env: simpy.Environment, requests, start) -> None:
        self.env = env
        self._value = None
        self._ok = True
        self._requests = iter(requests)
        self._next = next(self._requests, None)
        self._start = start
        # Processing an event takes its callbacks list and leaves it as it was: each
        # rescheduling hands back the same one.
        self._callbacks = [self._arrive]
        # First processed where an arrival process's start would be: URGENT, now.
        self.callbacks = self._callbacks
        env.schedule(self, URGENT)

    def _arrive(self, _event) -> None:
        env, start, requests = self.env, self._start, self._requests
        now, req = env._now, self._next
        while req is not None and req.arrival_at <= now:
            start(req)
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
        env = self.env
        env._active_proc = self
        generator = self._generator
        while True:
            try:
                if event._ok:
                    event = generator.send(event._value)
                else:
                    # An interrupt: throw a fresh copy, as SimPy does (see Process._resume).
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
            if event.callbacks is not None:         # pending: resume when it is processed
                event.callbacks.append(self._resume)
                break
        self._target = event
        env._active_proc = None


class Started:
    """What a process's first step is resumed with (an ``Initialize`` event's value)."""

    _ok = True
    _value = None
