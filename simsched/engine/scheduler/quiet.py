"""Quiet decode steps in one clock event: an exact fast path of the GPU loop.

A *quiet* step is a decode step that nobody outside the replica can tell apart from its neighbours:
every running request decodes one token, no request is admitted, finishes or is preempted, every
decoder's new KV block is free, and no arrival reaches the replica before the step is planned. The
GPU loop (:meth:`~simsched.engine.replica.Replica._gpu`) otherwise pays one SimPy event per
iteration, most of a busy fleet's cost; here it plans a run of quiet steps at once (their times
from the cost model, exactly as each iteration would have them), waits on the clock once for the
run's end and then applies the steps (:meth:`~simsched.engine.scheduler.decode.DecodeMixin.take_quiet_steps`)
and logs their rows. A run may end with a step at which decoders finish (their last token): it is
planned and timed as the others, and the finish is applied at the run's end, which is that step's
end, as ``commit()`` would (:meth:`~simsched.engine.scheduler.core.Scheduler.finish_quiet_step`), so
the finish costs no loop step and no clock event of its own.

What it replaces, and why the result is the same:

* the steps' times are the same floats: each is ``cost_model.iteration_time`` of the batch
  ``schedule()`` would build (its decoders and their context), added to the clock in the same
  order; a step whose time needs the loop's float-resolution check ends the run first;
* the scheduler's state after the run is what the steps' ``schedule()``/``commit()`` pairs leave
  (step counters, KV growth per group, in the same order);
* an arrival at the replica during the run (:meth:`QuietSteps.cut`) ends it at the step whose plan
  would first have seen the request (the next step's start without async scheduling; a step
  later with it, as the engine's plan of the running step is made already), by moving the run's
  end event earlier on the heap: the loop then resumes there as it would have;
* nothing outside reads the replica's state during a run: the fast path is only taken where that
  holds (:meth:`QuietSteps.for_replica` and the cluster's call of :meth:`Replica.allow_quiet_steps
  <simsched.engine.replica.Replica.allow_quiet_steps>`): open-loop arrivals only (no sessions,
  disaggregation or autoscaling), no router reading KV use every iteration, no prefix caching,
  swapping, KV tiers, LoRA, speculative decoding, step recording, invariant checks, queue time
  hooks, plan-ahead or time limit, and a cost model that declares ``pure_iteration_time`` (its
  time depends on the batch alone).

Iteration ends of different replicas at the very same instant may be processed in another order
than one event per step would give; with only open-loop arrivals (which come before iteration ends
at an instant) nothing observable depends on that order.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from heapq import heappush
from itertools import accumulate

from simsched.cost.base import Batch
from simsched.engine.scheduler.core import Scheduler
from simsched.engine.simpy_fast import LATE, iteration_clock, move_earlier

#: Most quiet steps planned in one run. A longer run saves loop turns, and an arrival wastes
#: the plans of the steps after it: 48 cost fewest instructions of 16 to 128 on a 64-replica
#: fleet at a quiet hour and at a busy one (``python -m benchmarks.instructions``).
MAX_QUIET_STEPS = 48

_NONE: list = []        # no request finished (never appended to)


class QuietRun:
    """One run of planned quiet steps: ``times`` (the first step's start, then each step's end),
    ``durations``, how many steps were planned and how many to take, whether a decoder finishes
    at the last planned one, and the heap entry of its end (None while the loop has not waited
    on it; the entry's event is the planner's, one per replica)."""

    __slots__ = ("times", "durations", "num_planned", "num_steps", "finishes", "entry")

    def __init__(self, times: list, durations: list, finishes: bool) -> None:
        self.times = times
        self.durations = durations
        self.num_planned = self.num_steps = len(durations)
        self.finishes = finishes    # a decoder's last token is the last planned step's
        self.entry = None


_TIME_METHODS = ("iteration_time", "_gpu_time", "_whole_iteration")


def promised(cost_model, attr: str) -> bool:
    """Whether ``cost_model``'s class promises ``attr`` for the time it computes: declared by
    the class that defines its iteration time, or by a subclass of it (a subclass that overrides
    the time without declaring ``attr`` again does not inherit the promise)."""
    for cls in type(cost_model).__mro__:
        if attr in vars(cls):
            return bool(getattr(cost_model, attr))
        if any(name in vars(cls) for name in _TIME_METHODS):
            return False
    return False


def decode_times_of(cost_model):
    """``cost_model``'s timer of decode-only batches, chosen once: ``(num_seqs,
    first_context_sum, num_steps) -> times`` of ``num_steps`` batches of ``num_seqs`` sequences,
    the first with ``first_context_sum`` context tokens, each next with ``num_seqs`` more. The
    model's own ``decode_iteration_times`` where it promises one (the same floats, what the
    batches share computed once), else one ``iteration_time`` call per batch."""
    if promised(cost_model, "decode_iteration_times"):
        return cost_model.decode_iteration_times

    def each(num_seqs: int, first_context_sum: int, num_steps: int) -> list:
        batch = Batch((), (), num_seqs, first_context_sum)
        times = []
        for j in range(num_steps):
            batch.decode_context_sum = first_context_sum + num_seqs * j
            times.append(cost_model.iteration_time(batch))
        return times

    return each


def decode_iteration_times(cost_model, num_seqs: int, first_context_sum: int,
                           num_steps: int) -> list:
    """``cost_model.iteration_time`` of ``num_steps`` decode-only batches (see
    :func:`decode_times_of`)."""
    return decode_times_of(cost_model)(num_seqs, first_context_sum, num_steps)


class QuietSteps:
    """A replica's planner of quiet-step runs (see the module docstring)."""

    def __init__(self, replica, limit: int) -> None:
        self.replica = replica
        self.scheduler = replica.scheduler
        self.kv = replica.kv
        self.limit = limit
        self.decode_times = decode_times_of(replica.cost_model)
        # A model's own decode_iteration_times returns floats; any other's times are checked.
        self.checked = not promised(replica.cost_model, "decode_iteration_times")
        self.asynchronous = replica.async_scheduling
        # The heap, the event ids and the event every run's end reuses: a run's end is processed
        # before the loop plans the next run, so one run at a time holds it.
        self.queue, self.eid, self.event = iteration_clock(replica.env)
        self.scheduler.track_due_steps()
        self.run: QuietRun | None = None        # the run the loop waits on, if any

    @classmethod
    def for_replica(cls, replica) -> "QuietSteps | None":
        """The planner, or None where quiet runs would not be exact (module docstring)."""
        sched = replica.scheduler
        limit = replica.max_quiet_steps
        if limit < 2 or type(sched) is not Scheduler or replica.kv.prefix_caching \
                or sched.swapping or sched._special or sched._prefill_first \
                or sched._plan_ahead or sched.meter is not None or replica.lora is not None \
                or replica.on_kv is not None or replica.on_iteration is not None \
                or "schedule" in vars(sched) or "commit" in vars(sched) \
                or getattr(replica.config.cache, "kv_tiers", None) is not None \
                or not promised(replica.cost_model, "pure_iteration_time"):
            return None
        return cls(replica, limit)

    def plan(self, now: float, ulp_below: float, ulp_floor: float) -> QuietRun | None:
        """The quiet steps from ``now`` (at least two), or None. ``ulp_below`` and ``ulp_floor``
        are the loop's float-resolution bounds: a run with a step they would check is not
        planned (the loop takes that step itself)."""
        sched = self.scheduler
        k = sched.quiet_steps(self.limit)
        if not k:
            return None
        finishes = sched.step + k in sched.finish_due
        if k < 2 and not finishes:
            return None         # one step without a finish: the loop's own step costs less
        n = len(sched.decoding)
        first = sched.ctx_base_sum + n * (sched.step + 1)
        durations = self.decode_times(n, first, k)
        if self.checked and any(d.__class__ is not float for d in durations):
            return None             # the loop checks and converts each time itself
        # The clock after each step, added in order as the loop would (one float add each).
        times = list(accumulate(durations, initial=now))
        if times[-2] >= ulp_below:
            # The clock's resolution changes from a step on: the run ends before it (the loop
            # takes that step itself and learns the new resolution).
            k = bisect_left(times, ulp_below, 0, k)
            if k < 2:
                return None
            del times[k + 1:], durations[k:]
            finishes = False
        if not (min(durations) >= ulp_floor and times[-1] < math.inf):
            return None
        return QuietRun(times, durations, finishes)

    def wait(self, run: QuietRun):
        """Schedule ``run``'s end on the clock (LATE, as an iteration's end) and return the event
        the loop yields; :meth:`cut` may move it earlier."""
        event = self.event
        event.callbacks = []            # pending again (the loop's resume goes in it)
        run.entry = entry = (run.times[-1], LATE, next(self.eid), event)
        heappush(self.queue, entry)
        self.run = run
        return event

    def cut(self, now: float) -> None:
        """A request reaches the replica at ``now`` during the run: end the run at the step whose
        plan sees it (module docstring): the step after the first to end at or after ``now``;
        with async scheduling, the step after the first to start at or after it."""
        run = self.run
        times = run.times
        if self.asynchronous:
            m = bisect_left(times, now, 0, run.num_steps) + 1
        else:
            m = bisect_left(times, now, 1, run.num_steps + 1)
        if m < run.num_steps:
            run.num_steps = m
            entry = (times[m], LATE, next(self.eid), self.event)
            move_earlier(self.queue, run.entry, entry)
            run.entry = entry

    def take(self, run: QuietRun, log) -> tuple[float, float, list]:
        """Apply ``run``'s steps to the scheduler and log their rows (``log``: the replica's
        :class:`~simsched.engine.log.IterationLog`); return (the last step's end, its start,
        the requests that finished there)."""
        self.run = None
        m = run.num_steps
        times, durations = run.times, run.durations
        sched = self.scheduler
        n = len(sched.decoding)
        used = self.kv.num_blocks - self.kv.num_free     # before the first step's growth
        needs = sched.take_quiet_steps(m, times[m - 1], times[m])
        # Requests that arrived during the run (async scheduling keeps them in ``pending``) wait
        # from the first step that starts after them; without async scheduling none arrived
        # before a quiet step.
        waiting = 0
        pending = self.replica.pending
        if pending:
            waiting = [0] * m
            for at, _ in pending:
                for j in range(bisect_left(times, at, 0, m), m):
                    waiting[j] += 1
        log.add_run(times, durations, m, n, waiting, used, needs)
        if run.finishes and m == run.num_planned:
            return times[m], times[m - 1], sched.finish_quiet_step()
        return times[m], times[m - 1], _NONE
