"""Clients that give up and try again: deadlines, cancellations, retries and hedged requests.

With any client behaviour of :class:`~simsched.config.faults.FaultsConfig` on, :class:`Clients`
replaces each request's life (``Cluster._request``). A *user request* (a workload row or a
session turn) is sent as one or more *attempts*, each a :class:`~simsched.request.Request` of
its own: the first is the workload's request (its id), each retry or hedge a copy appended to
the cluster's request list (a new id, ``arrival_at`` its send). Each attempt ends exactly once,
with an outcome (:data:`~simsched.config.faults.OUTCOMES`):

* its deadline passes (``ttft_timeout`` without a first token, ``request_timeout`` without its
  finish): a timer in the attempt's life fires at exactly that instant and the engine aborts it
  there (:meth:`~simsched.engine.replica.Replica.abort`: KV blocks freed at once, its computed
  tokens wasted); status ``timed_out``;
* its user cancels (``cancel_fraction`` of the user requests, ``cancel_time`` after the first
  send), or a hedged copy of it finished first: aborted the same way, status ``cancelled``;
* its replica fails (:mod:`simsched.cluster.failures`): status ``failed``;
* it is shed by admission control or rejected; or it finishes.

A ``failed`` or ``timed_out`` attempt (those in ``retry_on``) is sent again after the backoff
(:meth:`~simsched.config.faults.FaultsConfig.backoff`, jitter from the run's fault stream) while
attempts and the retry budget last. :attr:`Clients.attempts` keeps one row per attempt for the
attempts frame (:mod:`simsched.analysis.attempts`), the work each lost (:attr:`Clients.wasted`)
and the KV tokens aborts threw away by replica (:attr:`Clients.lost`), which the result checks
balance against the iterations' work.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from simsched.cluster.removal import fire
from simsched.engine.simpy_fast import done_event
from simsched.request import Content, Request, Status
from simsched.workloads.sessions import draw

FINISHED, REJECTED = Status.FINISHED, Status.REJECTED
TIMED_OUT, CANCELLED, FAILED = Status.TIMED_OUT, Status.CANCELLED, Status.FAILED
# Statuses of an attempt that has ended (its done event fired or it never reached a replica).
ENDED = frozenset((Status.FINISHED, Status.REJECTED, Status.ABORTED, TIMED_OUT, CANCELLED,
                   FAILED))
# The fault stream's spawn key (router 2, replicas 3, fleet 4, removals 5 use others).
FAULT_STREAM = 7
# attempt row fields (the attempts frame's columns, in order)
ATTEMPT_COLUMNS = ("attempt_id", "request_id", "attempt", "replica", "outcome", "sent_at",
                   "ended_at", "num_aborted_kv_tokens", "num_wasted_prefill_tokens",
                   "num_wasted_decode_tokens", "reason")


def copy_request(req: Request, rid: int, now: float) -> Request:
    """Another attempt of ``req``: the same prompt, output, labels and prefix identity, sent
    at ``now`` with id ``rid``."""
    content = req.content
    if content is not None:
        content = Content(content.keys, content.ends, content.output_key, content.session_id)
    out = Request(rid, now, req.num_prompt_tokens, req.num_output_tokens, req.priority,
                  req.tenant, content)
    out.adapter = req.adapter
    return out


class _User:
    """One user request's state: its id, first send, cancellation time and live attempts."""

    __slots__ = ("id", "first_sent_at", "cancel_at", "live", "won", "num_attempts")

    def __init__(self, rid: int, now: float, cancel_at: float) -> None:
        self.id = rid
        self.first_sent_at = now
        self.cancel_at = cancel_at
        self.live: dict[int, tuple] = {}     # attempt id -> (request, replica, done event)
        self.won = False
        self.num_attempts = 0


class Clients:
    """The client side of a run with deadlines, cancellations, retries or hedges.

    Built by the cluster, it wraps ``cluster._request`` (the plain life of one attempt is what
    it wraps: routing, queueing, waiting) with the user request's life.
    """

    def __init__(self, cluster, faults, seed: int) -> None:
        self.cluster, self.env, self.cfg = cluster, cluster.env, faults
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(FAULT_STREAM,)))
        self.attempts: list[list] = []          # rows of ATTEMPT_COLUMNS
        self.wasted: dict[int, object] = {}     # attempt id -> AbortedWork
        self.lost: dict[int, int] = {}          # replica -> KV tokens aborts threw away
        self.user_of: dict[int, int] = {}       # retry/hedge attempt id -> user request id
        self.num_first = 0                      # user requests sent
        # The workload's requests, given before the run (sessions' turns are appended, with
        # the retries, as they are sent).
        self.num_given = len(cluster.requests)
        self.num_retries = 0                    # attempts after the first (hedges too)
        self.num_open = 0                       # user requests not yet over
        self.num_budget_refusals = 0
        self.won: set[int] = set()              # user requests one of whose attempts finished
        cluster._request = self.life

    # ------------------------------------------------------------------ a user request
    def life(self, req: Request, record=None, process=None, done=None, now=None):
        """A user request's life: its attempts until one finishes or none is left."""
        env, cfg = self.env, self.cfg
        if done is None:
            process, done, now = env.active_process, done_event(env), env.now
        cancel_at = math.inf
        if cfg.cancel_fraction > 0 and self.rng.random() < cfg.cancel_fraction:
            cancel_at = now + float(draw(cfg.cancel_time, self.rng, 1, False)[0])
        user = _User(req.id, now, cancel_at)
        self.num_first += 1
        self.num_open += 1
        attempt, k = req, 1
        while True:
            outcome = yield from self._attempt(user, attempt, k, process, done)
            if user.live:
                # A hedged copy is still out: its outcome decides (it ends the user's wait).
                _, _, _, hedge = next(iter(user.live.values()))
                yield hedge
            if user.won or not self._retry(outcome, user):
                break
            wait = cfg.backoff(k, self.rng.random() if cfg.backoff_jitter else 0.0)
            if env.now + wait >= user.cancel_at:
                self.num_retries -= 1       # not sent after all
                break                       # the user gives up before the retry would leave
            if wait > 0:
                yield env.timeout(wait)
            k = user.num_attempts + 1
            attempt = self._new_attempt(req, user)
            done = done_event(env)
        self.num_open -= 1
        if user.won:
            self.won.add(user.id)
        work_end = self.cluster.work_end
        if work_end is not None:
            # Every attempt but this process's first is a request of its own to count.
            work_end.num_ended += user.num_attempts - 1
        if record is not None:
            record(req)

    def succeeded(self, rid: int) -> bool:
        """Whether user request ``rid`` (its first attempt's id) has finished, by any attempt."""
        return rid in self.won

    def _retry(self, outcome: str, user: _User) -> bool:
        """Whether the user request goes on after an attempt ended with ``outcome``."""
        cfg = self.cfg
        if outcome not in cfg.retry_on or user.num_attempts >= cfg.max_num_attempts:
            return False
        return self._take_budget()

    def _take_budget(self) -> bool:
        """Take one retry (or hedge) from the retry budget; False (counted) if it is spent.
        Taken at the decision, so retries decided during one backoff cannot overdraw it."""
        cfg = self.cfg
        if cfg.retry_budget is not None and self.num_retries + 1 > cfg.retry_budget \
                * self.num_first:
            self.num_budget_refusals += 1
            return False
        self.num_retries += 1
        return True

    def _new_attempt(self, req: Request, user: _User) -> Request:
        cluster = self.cluster
        attempt = copy_request(req, len(cluster.requests), self.env.now)
        cluster.requests.append(attempt)
        self.user_of[attempt.id] = user.id
        return attempt

    # ------------------------------------------------------------------ one attempt
    def _attempt(self, user: _User, req: Request, k: int, process, done, hedged: bool = False):
        """Send attempt ``k`` (``req``; ``hedged``: a hedge's copy, not hedged again) now and
        wait for its end; its outcome."""
        cluster, env, cfg = self.cluster, self.env, self.cfg
        now = env.now
        user.num_attempts += 1
        row = [req.id, user.id, k, -1, "", now, math.nan, 0, 0, 0, ""]
        self.attempts.append(row)
        cluster.num_arrived += 1
        load = cluster.load
        fleet = cluster.fleet
        if fleet is not None and not fleet.routable:
            # Every replica is down (simsched.cluster.failures): the send fails at once.
            req.status = FAILED
            req.reject_reason = f"failed: no replica up at t={now:g} s"
            return self._ended(row, req, "failed")
        i = 0 if load is None else cluster._route(req)
        if i < 0:
            return self._ended(row, req, "shed")
        row[3] = i
        replica = cluster.replicas[i]
        if not replica.add(req, (process, None, done), now):
            return self._ended(row, req, "rejected")
        if load is not None:
            load.routed(i, req)
        user.live[req.id] = (req, i, done, process)
        if cfg.ttft_timeout is not None:
            self._timer(cfg.ttft_timeout, req, user, "ttft")
        if cfg.request_timeout is not None:
            self._timer(cfg.request_timeout, req, user, "total")
        if user.cancel_at < math.inf:
            self._timer(max(0.0, user.cancel_at - now), req, user, "cancel")
        if cfg.hedge_delay is not None and not hedged \
                and user.num_attempts < cfg.max_num_attempts:
            self._timer(cfg.hedge_delay, req, user, "hedge")
        while True:
            try:
                yield done
                break
            except simpy.Interrupt as interrupt:
                cluster.preempted(req, interrupt)
        cluster.num_events += 1
        user.live.pop(req.id, None)
        if load is not None:
            load.aborted(i, req) if req.status is not FINISHED else load.finished(i, req)
        if req.status is FINISHED:
            user.won = True
            self._cancel_others(user, req)
        return self._ended(row, req, req.status.value)

    def took_back(self, i: int, work) -> None:
        """Replica ``i`` failed before the iteration ``work``'s abort counted ended: it was
        never computed (its attempt's row is corrected)."""
        n = work.take_back_in_flight()
        self.lost[i] -= n
        for row in self.attempts[::-1]:
            if self.wasted.get(row[0]) is work:
                row[7], row[8], row[9] = (work.num_kv_tokens, work.num_prefill_tokens,
                                          work.num_decode_tokens)
                break

    def _ended(self, row: list, req: Request, outcome: str) -> str:
        row[4] = outcome
        row[6] = self.env.now
        row[10] = req.reject_reason
        work = self.wasted.get(req.id)
        if work is not None:
            row[7], row[8], row[9] = (work.num_kv_tokens, work.num_prefill_tokens,
                                      work.num_decode_tokens)
        return outcome

    def _timer(self, delay: float, req: Request, user: _User, kind: str) -> None:
        event = self.env.timeout(delay)
        event.callbacks.append(lambda _event: self._expire(req, user, kind))

    def _expire(self, req: Request, user: _User, kind: str) -> None:
        """A timer of attempt ``req`` fired: give it up if it is still out."""
        entry = user.live.get(req.id)
        if entry is None or req.status in ENDED:
            return              # ended already (a stale timer: nothing to do)
        now = self.env.now
        if kind == "ttft":
            if req.first_token_at == req.first_token_at:
                return          # its first token came in time
            self.give_up(req, entry[1], entry[2], TIMED_OUT,
                         f"timed_out: no first token {self.cfg.ttft_timeout:g} s after its "
                         f"send (t={now:g} s)")
        elif kind == "total":
            self.give_up(req, entry[1], entry[2], TIMED_OUT,
                         f"timed_out: not finished {self.cfg.request_timeout:g} s after its "
                         f"send (t={now:g} s)")
        elif kind == "cancel":
            for other, i, done, _ in list(user.live.values()):
                if other is not None and other.status not in ENDED:
                    self.give_up(other, i, done, CANCELLED,
                                 f"cancelled: by its user at t={now:g} s")
            user.cancel_at = now
        elif not user.won and user.num_attempts < self.cfg.max_num_attempts \
                and self._take_budget():
            # kind == "hedge": a second copy, in a process of its own.
            hedge = self._new_attempt(req, user)
            process = self.env.process(self._hedge(user, hedge))
            user.live[-hedge.id - 1] = (None, -1, None, process)   # until it is sent

    def _hedge(self, user: _User, req: Request):
        """A hedged copy's process: sent now (unless the user request is over), then waited
        for."""
        user.live.pop(-req.id - 1, None)
        env = self.env
        if user.won or user.cancel_at <= env.now:
            # Over in the instant between the hedge's decision and its send: never sent.
            user.num_attempts += 1
            self.cluster.num_arrived += 1
            req.status = CANCELLED
            req.reject_reason = f"cancelled: its request was over before it was sent"
            row = [req.id, user.id, user.num_attempts, -1, "", env.now, math.nan, 0, 0, 0, ""]
            self.attempts.append(row)
            return self._ended(row, req, "cancelled")
        outcome = yield from self._attempt(user, req, user.num_attempts + 1,
                                           env.active_process, done_event(env), hedged=True)
        return outcome

    def give_up(self, req: Request, i: int, done, status: Status, reason: str) -> None:
        """Abort attempt ``req`` on replica ``i`` now with ``status`` and wake its life."""
        work = self.cluster.replicas[i].abort(req)
        self.wasted[req.id] = work
        if work.num_kv_tokens:
            self.lost[i] = self.lost.get(i, 0) + work.num_kv_tokens
        req.status = status
        req.reject_reason = reason
        fire(done)

    def _cancel_others(self, user: _User, winner: Request) -> None:
        now = self.env.now
        for other, i, done, _ in list(user.live.values()):
            if other is not None and other.status not in ENDED:
                self.give_up(other, i, done, CANCELLED,
                             f"cancelled: attempt {winner.id} finished first (t={now:g} s)")
