"""Planning a batch while the previous one runs (``scheduler.plan_ahead``), as the scheduler
inherits it.

vLLM V1's async scheduler schedules batch k + 1 while batch k runs and processes batch k's output
only after that. Its decisions are those of a synchronous scheduler that plans after batch k
commits, except for what the plan cannot know yet: requests that arrived since the previous plan
(they wait for the next one), and requests whose last token batch k produces, which keep their
KV blocks and sequence slots through the plan. Such a request may still be chosen as a victim:
as in vLLM it is then a preemption like any other (counted, reported in the step, its blocks
freed early, the step's admissions stopped) of a request that finishes anyway
(:meth:`~simsched.engine.scheduler.preemption.PreemptionMixin._preempt_finished`). A plan that schedules nothing is made again at once with both
known: the engine then waits for batch k and schedules after it. One more difference lives in
:meth:`~simsched.engine.scheduler.preemption.PreemptionMixin._stop`: a preempted decoder's block filled by
the last step is not cached (vLLM caches a decode block once the token after it is known).
Timing is unchanged: iterations still run back to back.
"""

from __future__ import annotations

from simsched.request import Request


class PlanAheadMixin:
    """plan_ahead's bookkeeping for :class:`~simsched.engine.scheduler.core.Scheduler`."""

    __slots__ = ()

    def _schedule_ahead(self, now: float):
        """``schedule`` with plan_ahead (installed on the instance, so the plain one is
        untouched): plan, then let what the plan could not know become known."""
        batch = type(self).schedule(self, now)
        self._plan_made()
        return batch

    def _plan_made(self) -> None:
        """A plan was made: what it could not know becomes known. Finished requests give their
        blocks and slots back; the requests that arrived meanwhile join the queue."""
        if self._zombies:
            running = self.running
            for req in self._zombies:
                if req.id in running:               # not preempted for another's blocks
                    self._release(req)
            self._zombies.clear()
        unseen: list[Request] = self._unseen
        if unseen:
            for req in unseen:
                self._queue.push(req, req.queued_at)
            self._num_pushed += len(unseen)
            unseen.clear()
