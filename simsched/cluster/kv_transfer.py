"""The KV-transfer link of a disaggregated cluster: processor sharing among its transfers.

:class:`Link` is one link (a prefill replica's NIC or NVLink port, one per GPU) of a bandwidth
and a latency; concurrent transfers share its bandwidth equally, completion times recomputed
whenever a transfer starts or ends, and the latency is paid before a transfer joins the link.
:func:`transfer_time` is an idle link's time. The topology (which replica owns which link) and
the requests' two-stage life are :mod:`simsched.cluster.disagg`'s; degraded links wrap this one
(:class:`~simsched.cluster.links.FaultyLink`).
"""

from __future__ import annotations

import simpy

__all__ = ["Link", "transfer_time"]


def transfer_time(num_bytes: float, bandwidth: float, latency: float) -> float:
    """Seconds to move ``num_bytes`` over an idle link of ``bandwidth`` bytes/s."""
    return num_bytes / bandwidth + latency


class Link:
    """One link of ``bandwidth`` bytes/s and ``latency`` s; concurrent transfers share it fairly.

    :meth:`transfer` returns an event that fires when the bytes have arrived. Active transfers
    keep their remaining bytes; on every start and end the bytes drained since the last change
    (``elapsed * bandwidth / n`` each) are subtracted and the next completion is rescheduled, so
    the cost is O(active transfers) per start or end.
    """

    def __init__(self, env: simpy.Environment, bandwidth: float, latency: float) -> None:
        if not bandwidth > 0 or not latency >= 0:
            raise ValueError(f"a link needs bandwidth > 0 and latency >= 0, got {bandwidth}, "
                             f"{latency}")
        self.env = env
        self.bandwidth = float(bandwidth)
        self.latency = float(latency)
        self.active: list[list] = []     # [remaining bytes, done event]
        self._last = 0.0
        self._version = 0
        self.num_transfers = 0
        self.bytes_moved = 0.0

    def transfer(self, num_bytes: float) -> simpy.Event:
        """Start moving ``num_bytes``; the returned event fires when they have arrived."""
        done = self.env.event()
        self.num_transfers += 1
        self.bytes_moved += num_bytes
        if self.latency > 0:
            self.env.timeout(self.latency).callbacks.append(
                lambda _ev: self._join(num_bytes, done))
        else:
            self._join(num_bytes, done)
        return done

    def _drain(self) -> None:
        now = self.env.now
        if self.active:
            drained = (now - self._last) * self.bandwidth / len(self.active)
            for entry in self.active:
                entry[0] -= drained
        self._last = now

    def _join(self, num_bytes: float, done: simpy.Event) -> None:
        self._drain()
        if num_bytes <= 0:
            done.succeed()
            return
        self.active.append([float(num_bytes), done])
        self._schedule()

    def _schedule(self) -> None:
        self._version += 1
        if not self.active:
            return
        version = self._version
        delay = min(e[0] for e in self.active) * len(self.active) / self.bandwidth
        self.env.timeout(max(delay, 0.0)).callbacks.append(lambda _ev: self._wake(version))

    def _wake(self, version: int) -> None:
        if version != self._version:
            return                       # a start or end since rescheduled the completion
        self._drain()
        # The transfer this wake-up was timed for is done by construction, whatever float
        # drift left of it (a remainder too small to advance the clock would spin forever).
        eps = max(0.0, min(e[0] for e in self.active)) \
            + 1e-9 * max(1.0, max(e[0] for e in self.active))
        keep = []
        for entry in self.active:
            if entry[0] <= eps:
                entry[1].succeed()
            else:
                keep.append(entry)
        self.active = keep
        self._schedule()
