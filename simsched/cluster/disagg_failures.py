"""Replica failures in a disaggregated pool (``faults.replica_failures`` / ``faults.mtbf`` with
prefill/decode roles).

A disaggregated cluster routes through its own pools (:mod:`simsched.cluster.disagg`), not a
fleet, so its failures are kept here. At a failure of replica ``g`` (:meth:`DisaggFailures.fail`)
every request whose KV is on ``g`` ends at once, status ``failed``, with a reason naming the
replica and the instant, and its KV is lost (the computed tokens count as aborted work,
``info["num_aborted_kv_tokens"]``):

* the requests ``g`` runs or queues (a prefill on a prefill or mixed replica, a decode on a
  decode or mixed one; the iteration in flight is lost);
* as a prefill replica, the requests whose prompt KV it holds for a hand-off: waiting for
  decode memory (their reservation elsewhere is freed) or moving over its links (the transfers
  are cut);
* as a decode replica, the requests whose KV it reserved: arrived, in transfer (the prefill
  replica frees what it holds; the bytes still under way finish on their link, to nobody) or
  waiting for memory there.

``g`` leaves both pools' choices at that instant (a router that still picks it, from a stale
view, is overridden by the least loaded replica of the pool that is up; with none up the request
fails) and is back, with an empty KV cache, ``restart_time + model_load_time`` later. Drawn
failures (``mtbf``) and ``restart_time`` may be per pool: the pools are the roles (``prefill``,
``decode``, ``mixed``). Client timeouts and retries are not modelled in a disaggregated pool
(the config refuses them), so a failed request is not sent again.
"""

from __future__ import annotations

import numpy as np

from simsched.cluster.failures import (DEFAULT_MODEL_LOAD_TIME, DEFAULT_RESTART_TIME,
                                       FAILURE_STREAM, _lost_admissions, failures_frame,
                                       scheduled)
from simsched.cluster.removal import fire
from simsched.config.lifetimes import draw_lifetime, for_pool
from simsched.request import Status
from simsched.workloads.sessions import draw

FAILED = Status.FAILED


class DisaggFailures:
    """The failures of a disaggregated cluster's replicas (see the module docstring)."""

    def __init__(self, cluster, faults, seed: int) -> None:
        from simsched.cluster.links import FaultyLink

        self.cluster, self.env, self.cfg = cluster, cluster.env, faults
        self.d = d = cluster.disagg
        self.model_load_time = faults.model_load_time or DEFAULT_MODEL_LOAD_TIME
        self.rng = np.random.default_rng(np.random.SeedSequence(seed,
                                                                spawn_key=(FAILURE_STREAM,)))
        self.rows: list[list] = []      # [replica, failed_at, back_at, num_failed_requests]
        self.back: dict[int, object] = {}
        self.num_aborted_kv_tokens = 0
        # A failed prefill replica's transfers are cut: its links must be able to fail them.
        for i, link in list(d.links.items()):
            if not isinstance(link, FaultyLink):
                d.links[i] = FaultyLink(cluster.env, link.bandwidth, link.latency)
        if faults.replica_failures:
            self.env.process(scheduled(self.env, faults.replica_failures, self.fail))
        if faults.mtbf is not None:
            for g, role in enumerate(d.roles):
                mtbf = for_pool(faults.mtbf, role)
                if mtbf is not None:
                    self.env.process(self._drawn(g, mtbf))

    def _drawn(self, g: int, mtbf: tuple):
        env = self.env
        while True:
            yield env.timeout(draw_lifetime(mtbf, self.rng))
            back = self.back.get(g)
            if back is not None:
                yield back              # down already (a scheduled failure): wait for it
                continue
            self.fail(g)

    # ------------------------------------------------------------------ a failure
    def _lose(self, req, reason: str, tokens: int) -> None:
        req.status = FAILED
        req.reject_reason = reason
        self.num_aborted_kv_tokens += tokens

    def fail(self, g: int) -> bool:
        """Replica ``g`` fails now; False if it is down already."""
        d, env = self.d, self.env
        if g in d.down:
            return False
        now = env.now
        d.down.add(g)
        replicas = self.cluster.replicas
        replica = replicas[g]
        reason = f"failed: replica {g} failed at t={now:g} s"
        num_failed = 0
        in_flight, lost_hits = _lost_admissions(replica)
        # Prompt KV held on a prefill replica for a hand-off to g, or on g for one elsewhere.
        for i in d.links:
            sched = replicas[i].scheduler
            for req in list(sched.held.values()):
                j = d.decode_replica[req.id]
                if i != g and j != g:
                    continue
                if j >= 0 and j != g:
                    if req.id in replicas[j].scheduler.incoming:
                        replicas[j].scheduler.drop_reservation(req)
                        replicas[j].wake()
                    replicas[j].notify_memory()     # (a waiter for memory there ends)
                tokens = req.num_computed_tokens
                sched.release_held(req)
                replicas[i]._live.pop(req.id, None)
                self._lose(req, reason, tokens)
                num_failed += 1
            if i != g:
                replicas[i].wake()
                replicas[i].notify_memory()     # its held blocks are free again
        sched = replica.scheduler
        # Reserved on g: arrived (it holds them) or still to come (freed above on its sender).
        arrived = []
        for req in list(getattr(sched, "incoming", {}).values()):
            sched.drop_reservation(req)
            handles = replica._live.pop(req.id, None)
            if handles is not None:
                self._lose(req, reason, req.num_computed_tokens)
                arrived.append(handles)
                num_failed += 1
        if getattr(sched, "ready", None):
            sched.ready.clear()
        taken = replica.remove_requests()
        for req, handles, dropped in taken:
            if lost_hits and req.id in in_flight:
                # Admitted by the lost iteration: its prefix-cache hits were never logged.
                took = min(lost_hits, dropped)
                dropped -= took
                lost_hits -= took
            self._lose(req, reason, dropped)
            arrived.append(handles)
        num_failed += len(taken)
        if g in d.links:
            d.links[g].cut()            # its transfers under way: their KV is gone
        for _, first, done in arrived:
            if first is not None and not first.triggered:
                first.succeed()
            else:
                fire(done)
        row = [g, now, np.nan, num_failed]
        self.rows.append(row)
        restart_time = for_pool(self.cfg.restart_time, d.roles[g], DEFAULT_RESTART_TIME)
        delay = float(draw(restart_time, self.rng, 1, False)[0]) \
            + float(draw(self.model_load_time, self.rng, 1, False)[0])
        self.back[g] = env.event()
        env.process(self._restart(g, delay, row))
        return True

    def _restart(self, g: int, delay: float, row: list):
        yield self.env.timeout(delay)
        self.cluster.replicas[g].restart()
        self.d.down.discard(g)
        row[2] = self.env.now
        self.back.pop(g).succeed()

    def frame(self):
        """One row per failure (:func:`~simsched.cluster.failures.failures_frame`)."""
        return failures_frame(self.rows)
