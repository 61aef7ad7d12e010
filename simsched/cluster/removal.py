"""What a removed replica does with its requests when it does not drain them: abort or migrate.

An autoscaled fleet (:mod:`simsched.cluster.fleet`) removes a replica by taking it out of the
routing set; with ``cluster.autoscaling.on_remove`` ``"abort"`` or ``"migrate"`` it then calls
:meth:`Remover.remove`, which empties the replica at once
(:meth:`~simsched.engine.replica.Replica.remove_requests`: its GPU loop ends, an iteration in
progress is lost, every request is stopped as a recompute preemption stops it), so the replica
stops billing at that instant.

* ``abort``: each request ends there, status ``aborted``, its ``reject_reason`` naming the
  replica and the time; its process wakes and is recorded as any ending request is. The tokens
  it received keep their times. It recomputes nothing, so its ``num_recomputed_tokens`` counts
  only what earlier preemptions dropped; the KV it had computed is work lost, counted by
  replica in :attr:`Remover.lost` (the run's info: ``num_aborted_kv_tokens``).
* ``migrate``: each request leaves the replica (its load is taken off the replica's figures) and,
  ``migration_time`` seconds later, is routed by the cluster's router to a routable replica and
  queued there, as a recomputed request: the prompt and the tokens generated so far are prefilled
  again (vLLM's recompute; the dropped tokens count in ``num_recomputed_tokens`` when it lands),
  after which it goes on generating. Its process keeps waiting on the
  same done event throughout; ``cluster.replica_of`` follows it, so its load and its row name the
  replica that finished it. ``moves`` counts each request's migrations (the request frame's
  ``num_migrations``). A request the chosen replica can never serve (a pool with a shorter
  context) is aborted there instead, with that reason, and its ``replica`` is -1.
"""

from __future__ import annotations

import numpy as np

from simsched.request import Status
from simsched.workloads.sessions import draw

ABORTED = Status.ABORTED


def fire(done) -> None:
    """Fire a request's done event at once (a :func:`~simsched.engine.simpy_fast.done_event`),
    as a replica does when the request finishes: its process resumes now."""
    callbacks, done.callbacks = done.callbacks, None
    for callback in callbacks:
        callback(done)


class Remover:
    """Aborts or migrates the requests of replicas removed from ``fleet`` (``mode``: the
    config's ``on_remove``, ``"abort"`` or ``"migrate"``)."""

    def __init__(self, fleet, mode: str, seed: int) -> None:
        self.fleet, self.env, self.mode = fleet, fleet.env, mode
        self.delay = fleet.auto.migration_time
        # Its own stream: drawing migration delays leaves the provisioning delays' draws as
        # they are.
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(5,)))
        self.num_aborted = 0
        self.moves: dict[int, int] = {}         # request id -> migrations
        self.in_transit: dict[int, object] = {}     # request id -> request, between replicas
        self.dropped: dict[int, tuple] = {}         # request id -> (replica, KV tokens dropped)
        self.lost: dict[int, int] = {}              # replica -> KV tokens aborts threw away

    def remove(self, g: int) -> None:
        """Empty replica ``g`` (already out of the routing set) now."""
        replica = self.fleet.replicas[g]
        # A streamed run keeps the decode step ends its log has written out (analysis.stream).
        kept = getattr(self.fleet.cluster.requests, "step_ends", None)
        taken = replica.remove_requests(kept(g, replica.iteration_rows) if kept else None)
        if self.mode == "abort":
            for req, handles, dropped in taken:
                self._lose(g, dropped)
                self.abort(req, handles[2], f"aborted: replica {g} removed at t={self.env.now:g} s")
        else:
            self.migrate(g, taken)

    def _lose(self, g: int, tokens: int) -> None:
        """``tokens`` of KV computed on replica ``g`` were thrown away with an aborted request."""
        if tokens:
            self.lost[g] = self.lost.get(g, 0) + tokens

    def abort(self, req, done, reason: str) -> None:
        """End ``req`` unfinished for ``reason`` and wake its process."""
        req.status = ABORTED
        req.reject_reason = reason
        self.num_aborted += 1
        fire(done)

    def migrate(self, g: int, taken: list) -> None:
        """Take ``taken``'s requests off replica ``g``'s load and send each on after its delay."""
        fleet, moves, transit = self.fleet, self.moves, self.in_transit
        for req, _, dropped in taken:
            fleet.left(g, req)
            moves[req.id] = moves.get(req.id, 0) + 1
            transit[req.id] = req
            self.dropped[req.id] = (g, dropped)
        if self.delay == ("fixed", 0.0):
            # No delay: routed once every removal of this decision is done (none lands on a
            # replica the same decision removes next).
            self.env.process(self._later_all([(req, handles) for req, handles, _ in taken]))
            return
        delays = draw(self.delay, self.rng, len(taken), False)
        for (req, handles, _), delay in zip(taken, delays.tolist()):
            self.env.process(self._later(req, handles, delay))

    def _later(self, req, handles, delay: float):
        yield self.env.timeout(delay)
        self.arrive(req, handles)

    def _later_all(self, batch: list):
        yield self.env.timeout(0.0)
        for req, handles in batch:
            self.arrive(req, handles)

    def arrive(self, req, handles) -> None:
        """``req`` arrives from a removed replica: the router places it on a routable one."""
        del self.in_transit[req.id]
        g, dropped = self.dropped.pop(req.id)
        cluster, now = self.fleet.cluster, self.env.now
        h = cluster._choose(cluster.view, req)
        if cluster.replicas[h].add(req, handles, now):
            cluster.replica_of[req.id] = h
            req.num_recomputed_tokens += dropped        # prefilled again where it landed
            self.fleet.arrived(h, req)
            return
        cluster.replica_of[req.id] = -1
        self._lose(g, dropped)
        self.abort(req, handles[2], f"aborted: migrated to replica {h}, which cannot serve it "
                                    f"({req.reject_reason})")
