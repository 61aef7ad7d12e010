"""The end of an autoscaled run's work: the run, its bill and its timeline stop there.

An autoscaled fleet keeps processes that are not work: a replica still provisioning waits out
its delay, the autoscaler samples every ``interval``. Run to exhaustion, their timers carried
the clock (and with it every unit's bill) past the last request: a 60 s provisioning delay
requested at 0.5 s made a run whose last request ended at 3.0 s end at 60.5 s, billed to then
(issue 40, defect 8). :class:`WorkEnd` counts the requests whose processes have ended and the
sessions still open, and fires :attr:`WorkEnd.event` when the last one ends; the run stops at
that event (or at ``max_sim_time``), so ``sim_time`` is the work's end and every replica, those
still provisioning included, is billed up to it.
"""

from __future__ import annotations

import math

from simsched.engine.simpy_fast import run_until


class WorkEnd:
    """Fires :attr:`event` when every request of ``cluster`` has ended and no session is open.

    It wraps ``cluster._request`` (each request's process) to count the ends; ``on_end()`` is
    called once, at the end, before the event fires (the autoscaler's last timeline row).
    """

    def __init__(self, cluster, on_end=None, settle: bool = False) -> None:
        self.cluster, self.env, self.on_end = cluster, cluster.env, on_end
        # settle: the work's end also waits for the iterations in flight (an aborted request's
        # last iteration still runs and is logged); each replica reports falling idle.
        self.settle = settle
        self.event = cluster.env.event()
        self.num_ended = 0
        self.sessions_left = 0
        inner = cluster._request

        def tracked(req, record=None, process=None, done=None, now=None):
            yield from inner(req, record, process, done, now)
            self.num_ended += 1
            self.check()

        cluster._request = tracked

    def session_ended(self) -> None:
        """A closed-loop session sent its last turn (or stopped at a rejected one)."""
        self.sessions_left -= 1
        self.check()

    def idle(self, replica) -> None:
        """``replica`` falls idle (with ``settle``): the work may be over now."""
        self.check(replica)

    def _busy(self, idle) -> bool:
        return any(r is not idle and r._idle is None and r.gpu_process.is_alive
                   for r in self.cluster.replicas)

    def check(self, idle=None) -> None:
        """Fire the event if the work is over: every request ended, every session closed
        (with ``settle``: and no iteration in flight; ``idle`` is a replica falling idle)."""
        if self.num_ended == len(self.cluster.requests) and self.sessions_left <= 0 \
                and not self.event.triggered and not (self.settle and self._busy(idle)):
            if self.on_end is not None:
                self.on_end()
            self.event.succeed()

    def run(self, until: float) -> None:
        """Run the environment to the work's end, or to ``until`` if that comes first."""
        env = self.env
        self.check()                        # no request and no session: over at once
        stop = self.event
        if not math.isinf(until):
            stop = env.any_of([stop, env.timeout(max(until - env.now, 0.0))])
        # (If nothing is left to happen while some request never ended, the run is over, as
        # a run to exhaustion would be.)
        run_until(env, stop)
