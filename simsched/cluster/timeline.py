"""One link's bandwidth over time: the degraded intervals of ``faults.link_events`` and those
drawn with ``faults.link_mtbf`` (:mod:`simsched.cluster.links` applies them).

A :class:`LinkTimeline` is a piecewise-constant *fraction* of the link's nominal bandwidth: 1
outside every event, the lowest fraction of the events covering an instant inside them (0: the
link is down). Drawn events are made lazily, as far ahead as a question needs, from the link's
own seeded stream (up time of the ``link_mtbf`` lifetime after the previous event's end, then an
event of a ``link_mttr`` lifetime at ``link_fraction``), so the timeline is fixed by the seed and
the same whoever asks first. :meth:`LinkTimeline.finish` answers when a transfer started at some
instant is over on it (the remote KV tier's analytic link asks that).
"""

from __future__ import annotations

import bisect
import heapq
import math

from simsched.config.lifetimes import draw_lifetime

__all__ = ["LinkTimeline"]

# Drawn events made per extension (each extension rebuilds the merged pieces).
_BATCH = 16


class LinkTimeline:
    """A link's bandwidth fraction over time (see the module docstring).

    ``events``: scheduled ``(start, end, fraction)`` intervals; ``drawn``: None or ``(mtbf,
    mttr, fraction, rng)`` (lifetimes from :mod:`simsched.config.lifetimes`, a seeded
    Generator).
    """

    def __init__(self, events, drawn=None) -> None:
        self.events = [tuple(e) for e in events]
        self.drawn = drawn
        self._drawn_until = 0.0         # end of the last drawn event
        # Start of the last drawn event (-inf: none drawn yet; inf: nothing is drawn).
        self._last_start = math.inf if drawn is None else -math.inf
        self.starts: list[float] = []
        self.pieces: list[tuple] = []   # merged (start, end, fraction), fraction < 1, in order
        self._merge()

    def _extend(self, t: float) -> None:
        """Draw events until one starts after ``t`` (so the pieces up to ``t`` are final)."""
        if self.drawn is None or self._last_start > t:
            return
        mtbf, mttr, fraction, rng = self.drawn
        while self._last_start <= t:
            # Batches as large as what is drawn already: merges cost O(n log n) in all.
            for _ in range(max(_BATCH, len(self.events))):
                start = self._drawn_until + draw_lifetime(mtbf, rng)
                end = start + max(draw_lifetime(mttr, rng), 0.0)
                if end > start:
                    self.events.append((start, end, fraction))
                self._last_start, self._drawn_until = start, end
        self._merge()

    def _merge(self) -> None:
        events = sorted(self.events)
        bounds = sorted({b for s, e, _ in events for b in (s, e)})
        pieces: list[list] = []
        active: list[tuple] = []        # heap of (fraction, end) of events begun
        k = 0
        # Each span between consecutive boundaries takes the lowest fraction covering it.
        for lo, hi in zip(bounds, bounds[1:]):
            while k < len(events) and events[k][0] <= lo:
                heapq.heappush(active, (events[k][2], events[k][1]))
                k += 1
            while active and active[0][1] <= lo:
                heapq.heappop(active)   # the lowest has ended; others that ended go in turn
            if not active:
                continue
            fraction = active[0][0]
            if pieces and pieces[-1][1] == lo and pieces[-1][2] == fraction:
                pieces[-1][1] = hi
            else:
                pieces.append([lo, hi, fraction])
        self.pieces = [tuple(p) for p in pieces]
        self.starts = [p[0] for p in self.pieces]

    def piece_at(self, t: float) -> tuple[float, float]:
        """``(fraction, until)``: the bandwidth fraction from ``t`` and when it next changes
        (inf: never)."""
        self._extend(t)
        k = bisect.bisect_right(self.starts, t) - 1
        if k >= 0 and t < self.pieces[k][1]:
            return self.pieces[k][2], self.pieces[k][1]
        if k + 1 < len(self.pieces):
            return 1.0, self.pieces[k + 1][0]
        return 1.0, (self._last_start if self.drawn is not None else math.inf)

    def down_at(self, t: float) -> bool:
        """Whether the link is down at ``t``."""
        return self.piece_at(t)[0] == 0.0

    def finish(self, start: float, latency: float, num_bytes: float, bps: float) -> float:
        """When ``num_bytes`` sent at ``start`` (after ``latency``) at ``bps`` times the
        fraction are through. A transfer that meets the link down starts again, whole, when it
        is back (one started while it is down waits for it)."""
        t = start
        while True:
            fraction, until = self.piece_at(t)
            if fraction == 0.0:
                t = until                   # down: wait until it is back
                continue
            # The latency: interrupted if the link goes down before it has passed.
            cur, sent = t, t + latency
            while cur < sent:
                fraction, until = self.piece_at(cur)
                if fraction == 0.0:
                    break
                cur = until
            if cur < sent:
                t = cur
                continue
            cur, left = sent, float(num_bytes)
            while True:
                fraction, until = self.piece_at(cur)
                if fraction == 0.0:
                    break                   # down mid-transfer: start again when it is back
                end = cur + left / (bps * fraction)
                if end <= until:
                    return end
                left -= (until - cur) * bps * fraction
                cur = until
            t = cur

    def rows(self, link: str, until: float) -> list[tuple]:
        """``(link, started_at, ended_at, bandwidth_fraction)`` of each piece starting before
        ``until``."""
        self._extend(until)
        return [(link, s, e, f) for s, e, f in self.pieces if s < until]
