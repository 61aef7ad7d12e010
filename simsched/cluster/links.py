"""Degraded links (``faults.link_events``, ``faults.link_mtbf``): KV-transfer links of a
disaggregated cluster and the remote KV tier's link slow down or go down for intervals.

Built by the cluster only when link faults are on (:class:`LinkFaults`); otherwise nothing here
runs and results are bit-identical. Each link has a :class:`~simsched.cluster.timeline.
LinkTimeline` (its bandwidth fraction over time).

**Disaggregated links** (one per prefill replica, :class:`~simsched.cluster.kv_transfer.
Link`) become :class:`FaultyLink`\\ s, driven through their timelines by a process each. At a
change of fraction the bytes drained so far are counted at the old bandwidth and every active
transfer's finish is recomputed at the new one (processor sharing, as before), so a transfer in
flight at half bandwidth takes exactly twice its remaining time. When the link goes down every
transfer on it (active, or still paying the latency) fails at that instant, and a transfer
started while it is down fails at once. Then (``faults.on_link_down``):

* ``retry``: the transfer is sent again, whole (latency and all bytes), at the instant the link
  is back; meanwhile the prompt's KV stays held on the prefill replica and reserved on the
  decode replica (memory counted on both, backpressure as for a slow transfer);
* ``recompute``: the prefill replica frees the KV (its prefix cache keeps the blocks, as after a
  transfer), the decode replica frees its reservation (keeping the prefix it matched) and queues
  the request to prefill its prompt and first token again (vLLM's
  ``kv_load_failure_policy="recompute"``); the dropped prompt KV counts as recomputed tokens.

Each transfer attempt is a row of :attr:`LinkFaults.transfers` (``Results.transfers``): its
request, prefill and decode replicas, start, end, bytes, ``outcome`` (``arrived``, ``failed``)
and what followed a failure (``retry``, ``recompute``; ``lost``: its sender or receiver failed,
:mod:`simsched.cluster.disagg_failures`).

**The remote KV tier** (``"remote"``) keeps its analytic link: its loads and stores take their
bytes at the timeline's bandwidth (:meth:`~simsched.cluster.timeline.LinkTimeline.finish`);
one that meets the link down starts again, whole, when it is back; and while it is down the
tier serves no hit (admission recomputes the prefix instead).

``Results.links`` holds every link's timeline: one row per degraded interval (``link``: the
prefill replica's index as a string, or ``"remote"``; ``started_at``, ``ended_at``,
``bandwidth_fraction``).
"""

from __future__ import annotations

import math

import numpy as np

from simsched.cluster.kv_transfer import Link
from simsched.cluster.timeline import LinkTimeline
from simsched.engine.simpy_fast import at_time
from simsched.request import Status

FAILED = Status.FAILED

__all__ = ["FaultyLink", "LinkFaults", "TRANSFER_COLUMNS", "LINK_COLUMNS"]

# The link streams' spawn key (router 2, replicas 3, fleet 4, removals 5, faults 7, failures 8).
LINK_STREAM = 9
TRANSFER_COLUMNS = ("request_id", "prefill_replica", "decode_replica", "started_at", "ended_at",
                    "num_bytes", "outcome", "then")
LINK_COLUMNS = ("link", "started_at", "ended_at", "bandwidth_fraction")


class FaultyLink(Link):
    """A :class:`~simsched.cluster.kv_transfer.Link` whose bandwidth changes and which can go down.

    A transfer's event succeeds with False when the transfer failed (the link went down), with
    None when its bytes arrived.
    """

    def __init__(self, env, bandwidth: float, latency: float) -> None:
        super().__init__(env, bandwidth, latency)
        self.nominal = self.bandwidth
        self.down = False
        self.back = None            # an event fired when the link is back up
        self.joining: list[list] = []   # [bytes, done] of transfers still paying the latency

    def transfer(self, num_bytes: float):
        """Start moving ``num_bytes`` (fails at once while the link is down)."""
        done = self.env.event()
        self.num_transfers += 1
        if self.down:
            done.succeed(False)
            return done
        self.bytes_moved += num_bytes
        if self.latency > 0:
            entry = [num_bytes, done]
            self.joining.append(entry)
            self.env.timeout(self.latency).callbacks.append(lambda _ev: self._joined(entry))
        else:
            self._join(num_bytes, done)
        return done

    def _joined(self, entry: list) -> None:
        if entry[1].triggered:
            return                  # failed while paying the latency
        self.joining.remove(entry)
        self._join(entry[0], entry[1])

    def set_fraction(self, fraction: float) -> None:
        """Run at ``fraction`` of the nominal bandwidth from now (0: down)."""
        if fraction == 0.0:
            if not self.down:
                self._go_down()
            return
        if self.down:
            self.down = False
            self._last = self.env.now
            self.bandwidth = self.nominal * fraction
            back, self.back = self.back, None
            back.succeed()
            return
        self._drain()               # the bytes moved so far, at the old bandwidth
        self.bandwidth = self.nominal * fraction
        self._schedule()

    def cut(self) -> None:
        """Fail every transfer on the link now (its sender failed); the link stays up."""
        self._drain()
        failed = self.active + self.joining
        self.active, self.joining = [], []
        self._version += 1          # the scheduled completion is void
        for entry in failed:
            entry[1].succeed(False)

    def _go_down(self) -> None:
        self.down = True
        self.back = self.env.event()
        self.cut()


class LinkFaults:
    """The run's degraded links (see the module docstring); built by the cluster."""

    def __init__(self, cluster, faults, seed: int) -> None:
        self.cluster, self.env, self.cfg = cluster, cluster.env, faults
        self.seed = seed
        self.timelines: dict[str, LinkTimeline] = {}
        self.transfers: list[list] = []         # rows of TRANSFER_COLUMNS
        d = cluster.disagg
        if d is not None:
            for i in sorted(d.links):
                old = d.links[i]
                link = d.links[i] = FaultyLink(cluster.env, old.bandwidth, old.latency)
                timeline = self._timeline(str(i), (0, i))
                self.env.process(self._drive(link, timeline))
        tier = cluster.remote_tier
        if tier is not None:
            tier.timeline = self._timeline("remote", (1,))
            for replica in cluster.replicas:
                replica.kv.link_faults = True

    def _timeline(self, name: str, key: tuple) -> LinkTimeline:
        cfg = self.cfg
        events = [(at, at + duration, fraction) for at, duration, link, fraction
                  in cfg.link_events if str(link) == name]
        drawn = None
        if cfg.link_mtbf is not None:
            rng = np.random.default_rng(np.random.SeedSequence(self.seed,
                                                               spawn_key=(LINK_STREAM,) + key))
            drawn = (cfg.link_mtbf, cfg.link_mttr, cfg.link_fraction, rng)
        timeline = self.timelines[name] = LinkTimeline(events, drawn)
        return timeline

    def _drive(self, link: FaultyLink, timeline: LinkTimeline):
        """Apply ``timeline`` to ``link`` at each change (at the exact instants)."""
        t = self.env.now
        while True:
            fraction, until = timeline.piece_at(t)
            link.set_fraction(fraction)
            if math.isinf(until):
                return
            yield at_time(self.env, until)
            t = until

    # ------------------------------------------------------------------ a transfer
    def move(self, req, i: int, j: int, shard_bytes: float, num_bytes: float):
        """Move ``req``'s KV (``shard_bytes`` per GPU, ``num_bytes`` in all) over prefill replica
        ``i``'s link to decode replica ``j`` (a generator for the request's process): True when
        it has arrived, False when it is to be recomputed on ``j``."""
        env, link = self.env, self.cluster.disagg.links[i]
        while True:
            started = env.now
            failed = (yield link.transfer(shard_bytes)) is False
            row = [req.id, i, j, started, env.now, num_bytes, "failed" if failed else "arrived",
                   ""]
            self.transfers.append(row)
            if req.status is FAILED:    # its sender or receiver failed (disagg_failures)
                row[7] = "lost"
                return False
            if not failed:
                return True
            if self.cfg.on_link_down == "recompute":
                row[7] = "recompute"
                return False
            row[7] = "retry"
            if link.down:
                yield link.back
            if req.status is FAILED:
                return False

    # ------------------------------------------------------------------ records
    def transfers_frame(self):
        """One row per transfer attempt (see the module docstring)."""
        import pandas as pd

        return pd.DataFrame(self.transfers, columns=list(TRANSFER_COLUMNS))

    def links_frame(self, until: float):
        """One row per degraded interval of each link starting before ``until``."""
        import pandas as pd

        rows = [row for name, t in self.timelines.items() for row in t.rows(name, until)]
        frame = pd.DataFrame(rows, columns=list(LINK_COLUMNS))
        return frame.sort_values(["started_at", "link"], kind="stable").reset_index(drop=True)

    def info(self) -> dict:
        """Run totals: transfers failed, retried and recomputed."""
        then = [row[7] for row in self.transfers if row[6] == "failed"]
        return {"num_kv_transfer_failures": len(then),
                "num_kv_transfer_retries": then.count("retry"),
                "num_kv_transfer_recomputes": then.count("recompute")}
