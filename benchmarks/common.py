"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import resource
import sys
import time


class TimedCostModel:
    """Wraps a cost model and notes the wall clock at every call: one call per iteration.

    The wall time between the first and the last call is the simulation's iteration loop alone,
    without start-up (arrivals at t=0) or building the result frames. ``clock`` is the clock
    read (a subclass may read another, e.g. ``time.process_time``).
    """

    clock = staticmethod(time.perf_counter)

    def __init__(self, inner) -> None:
        self.inner = inner
        self.first_at = None
        self.last_at = None
        self.num_calls = 0

    def iteration_time(self, batch) -> float:
        """Delegate, noting the time."""
        now = self.clock()
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        self.num_calls += 1
        return self.inner.iteration_time(batch)

    def per_iteration_us(self) -> float:
        """Mean wall microseconds per iteration between the first and last call."""
        return (self.last_at - self.first_at) / max(1, self.num_calls - 1) * 1e6


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024
