"""When things go wrong (``SimConfig.faults``): client deadlines, cancellations, retries, hedges
and replica failures.

Everything is off by default, and a run with the defaults is the run without this section.

Clients (every request, single engine or cluster; :mod:`simsched.cluster.retries`):

* ``ttft_timeout``: an attempt whose first token has not come ``ttft_timeout`` seconds after it
  was sent is given up at that instant (outcome ``timed_out``); ``request_timeout`` does the
  same for the whole attempt (no finish by then). The engine aborts it as vLLM aborts a request
  whose client went away: its KV blocks are freed at that instant and the tokens it computed
  are wasted work.
* ``cancel_fraction``: that share of the requests (drawn per request) is cancelled by its user
  ``cancel_time`` seconds after its first send (a number or a distribution as
  ``("exponential", mean)``, ``("uniform", lo, hi)``, ``("lognormal", mu, sigma)``), unless it
  has finished; a cancelled request is never retried (outcome ``cancelled``).
* Retries: an attempt that ended ``failed`` (its replica failed) or ``timed_out`` (the outcomes
  in ``retry_on``; ``shed`` may be added) is sent again, at most ``max_num_attempts`` attempts
  in all (1: no retries), after an exponential backoff: attempt ``k + 1`` (``k`` >= 1) waits
  ``min(backoff_max_time, backoff_base_time * backoff_multiplier ** (k - 1))``, times
  ``1 - backoff_jitter * u`` with ``u`` uniform in [0, 1) drawn from the run's seeded fault
  stream (``backoff_jitter=1``: AWS's full jitter). ``retry_budget`` caps retries at that share
  of the first attempts sent so far (gRPC/Envoy retry budgets; None: no cap).
* ``hedge_delay``: a second copy of an attempt is sent that many seconds after it if it has not
  finished by then; the first to finish wins and the other is cancelled (outcome
  ``cancelled``); a hedge counts as an attempt.
* ``session_on_failure``: a closed-loop session whose turn fails (after its retries) ``stop``\\ s
  (the default, as a rejected turn stops it) or ``continue``\\ s with its next turn.

Replicas (clusters; :mod:`simsched.cluster.failures`):

* ``replica_failures``: ``((at seconds, replica index), ...)`` scheduled failures; ``mtbf``:
  each replica also fails after exponential times with that mean (seconds; None: never).
  A failed replica loses at once its running and queued requests (outcome ``failed``, reason
  naming the replica and the time) and its KV cache, prefix cache included; it is out of the
  routers' set until it is back, ``restart_time`` plus ``model_load_time`` seconds later
  (numbers or distributions; ``model_load_time`` None: the autoscaler's
  ``cluster.autoscaling.model_load_time``, 60 s without autoscaling). ``bill_while_down``:
  whether its GPUs are billed while it is down. ``mtbf`` and ``restart_time`` may also be
  lifetime distributions (exponential, Weibull, lognormal; :mod:`simsched.config.lifetimes`) or
  per pool, ``((pool name, value), ...)`` (the autoscaling pools' names; a disaggregated
  cluster's roles, ``prefill``, ``decode``, ``mixed``; a fixed cluster's one pool is
  ``"default"``); a pool ``mtbf`` does not name never fails. In a disaggregated pool a failure
  also loses the hand-offs from and to the replica (:mod:`simsched.cluster.disagg_failures`).

Links (disaggregated clusters' KV-transfer links, the remote KV tier's link;
:mod:`simsched.cluster.links`):

* ``link_events``: ``((at, duration, link, fraction), ...)``: from ``at`` for ``duration``
  seconds link ``link`` (a prefill replica's index: its outgoing KV links; ``"remote"``: the
  cluster's remote KV tier) runs at ``fraction`` of its bandwidth (0: down). Overlapping events
  take the lowest fraction. ``link_mtbf`` draws events per link too: up times of that lifetime,
  events lasting ``link_mttr`` at ``link_fraction``.
* A transfer in flight on a slowed link slows down (the shared-bandwidth model recomputes its
  finish); on a link going down it fails at that instant, and so does one started while it is
  down. ``on_link_down``: ``retry`` sends it again, whole, when the link is back (its KV held on
  both sides meanwhile), ``recompute`` drops it and prefills the request again on its decode
  replica (vLLM's ``kv_load_failure_policy="recompute"``). A remote tier that is down serves no
  hit (the prefix is recomputed) and a load in flight on it restarts when it is back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simsched.config.checks import check_bool, check_choice, check_float, check_int, plain
from simsched.config.lifetimes import parse_lifetime, parse_per_pool
from simsched.config.serialize import _tuples
from simsched.workloads.sessions import parse_distribution

__all__ = ["FaultsConfig", "OUTCOMES", "RETRYABLE", "SESSION_ON_FAILURE", "ON_LINK_DOWN"]

_OWNER = "faults"
# How an attempt ends (the attempts frame's ``outcome``).
OUTCOMES = ("finished", "timed_out", "cancelled", "failed", "shed", "rejected", "unfinished")
RETRYABLE = ("failed", "timed_out", "shed")
SESSION_ON_FAILURE = ("stop", "continue")
ON_LINK_DOWN = ("retry", "recompute")
REMOTE_LINK = "remote"


def _delay(name: str, value) -> tuple:
    try:
        return parse_distribution(name, _tuples(value), False)
    except ValueError as exc:
        raise ValueError(str(exc).replace("workload.", f"{_OWNER}.")) from None


@dataclass(frozen=True)
class FaultsConfig:
    """Client deadlines, cancellations, retries, hedges and replica failures (see the module
    docstring); validated on construction, all off by default."""

    ttft_timeout: float | None = None
    request_timeout: float | None = None
    cancel_fraction: float = 0.0
    cancel_time: float | tuple = ("exponential", 10.0)
    max_num_attempts: int = 1
    retry_on: tuple = ("failed", "timed_out")
    backoff_base_time: float = 1.0
    backoff_multiplier: float = 2.0
    backoff_max_time: float = 60.0
    backoff_jitter: float = 0.0
    retry_budget: float | None = None
    hedge_delay: float | None = None
    session_on_failure: str = "stop"
    replica_failures: tuple = ()
    mtbf: float | tuple | None = None
    restart_time: float | tuple = 30.0
    model_load_time: float | tuple | None = None
    bill_while_down: bool = True
    link_events: tuple = ()
    link_mtbf: float | tuple | None = None
    link_mttr: float | tuple = 30.0
    link_fraction: float = 0.0
    on_link_down: str = "retry"

    def __post_init__(self) -> None:
        plain(self)
        for name in ("ttft_timeout", "request_timeout", "hedge_delay"):
            value = getattr(self, name)
            if value is not None:
                check_float(_OWNER, name, value, 0.0, low_open=True, finite=True)
        check_float(_OWNER, "cancel_fraction", self.cancel_fraction, 0.0, 1.0)
        object.__setattr__(self, "cancel_time", _delay("cancel_time", self.cancel_time))
        check_int(_OWNER, "max_num_attempts", self.max_num_attempts, 1, 1000)
        retry_on = _tuples(self.retry_on)
        if not isinstance(retry_on, tuple):
            retry_on = (retry_on,)
        for outcome in retry_on:
            check_choice(_OWNER, "retry_on", outcome, RETRYABLE)
        object.__setattr__(self, "retry_on", retry_on)
        check_float(_OWNER, "backoff_base_time", self.backoff_base_time, 0.0, finite=True)
        check_float(_OWNER, "backoff_multiplier", self.backoff_multiplier, 1.0, finite=True)
        check_float(_OWNER, "backoff_max_time", self.backoff_max_time, 0.0, finite=True)
        check_float(_OWNER, "backoff_jitter", self.backoff_jitter, 0.0, 1.0)
        if self.retry_budget is not None:
            check_float(_OWNER, "retry_budget", self.retry_budget, 0.0, finite=True)
        check_choice(_OWNER, "session_on_failure", self.session_on_failure, SESSION_ON_FAILURE)
        object.__setattr__(self, "replica_failures", self._failures())
        if self.mtbf is not None:
            object.__setattr__(self, "mtbf", parse_per_pool(f"{_OWNER}.mtbf", self.mtbf,
                                                            parse_lifetime))
        object.__setattr__(self, "restart_time", parse_per_pool(
            f"{_OWNER}.restart_time", self.restart_time, lambda _w, v: _delay("restart_time", v)))
        if self.model_load_time is not None:
            object.__setattr__(self, "model_load_time",
                               _delay("model_load_time", self.model_load_time))
        check_bool(_OWNER, "bill_while_down", self.bill_while_down)
        object.__setattr__(self, "link_events", self._link_events())
        if self.link_mtbf is not None:
            object.__setattr__(self, "link_mtbf",
                               parse_lifetime(f"{_OWNER}.link_mtbf", self.link_mtbf))
        object.__setattr__(self, "link_mttr", parse_lifetime(f"{_OWNER}.link_mttr",
                                                             self.link_mttr))
        check_float(_OWNER, "link_fraction", self.link_fraction, 0.0, 1.0)
        if self.link_fraction >= 1.0:
            raise ValueError(f"{_OWNER}.link_fraction must be below 1 (1: nothing happens), got "
                             f"{self.link_fraction!r}")
        check_choice(_OWNER, "on_link_down", self.on_link_down, ON_LINK_DOWN)

    def _link_events(self) -> tuple:
        plan = _tuples(self.link_events)
        usage = (f"{_OWNER}.link_events must be ((at seconds >= 0, duration seconds > 0, link: "
                 f"a prefill replica index or {REMOTE_LINK!r}, bandwidth fraction in [0, 1)), "
                 f"...), got {plan!r}")
        if not isinstance(plan, tuple):
            raise ValueError(usage)
        out = []
        for entry in plan:
            if not isinstance(entry, tuple) or len(entry) != 4:
                raise ValueError(usage)
            at, duration, link, fraction = entry
            numbers = (at, duration, fraction)
            if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)
                   for x in numbers) or at < 0 or duration <= 0 or not 0 <= fraction < 1 \
                    or not (link == REMOTE_LINK or (isinstance(link, int)
                                                    and not isinstance(link, bool)
                                                    and link >= 0)):
                raise ValueError(usage)
            out.append((float(at), float(duration), link, float(fraction)))
        return tuple(sorted(out, key=lambda e: (e[0], e[1], str(e[2]), e[3])))

    def _failures(self) -> tuple:
        plan = _tuples(self.replica_failures)
        usage = (f"{_OWNER}.replica_failures must be ((at seconds >= 0, replica index >= 0), ...), "
                 f"got {plan!r}")
        if not isinstance(plan, tuple):
            raise ValueError(usage)
        out = []
        for entry in plan:
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise ValueError(usage)
            at, replica = entry
            if isinstance(at, bool) or not isinstance(at, (int, float)) \
                    or not math.isfinite(at) or at < 0 or isinstance(replica, bool) \
                    or not isinstance(replica, int) or replica < 0:
                raise ValueError(usage)
            out.append((float(at), replica))
        return tuple(sorted(out))

    @property
    def clients(self) -> bool:
        """Whether any client-side behaviour is on (deadlines, cancellations, retries, hedges)."""
        return (self.ttft_timeout is not None or self.request_timeout is not None
                or self.cancel_fraction > 0 or self.max_num_attempts > 1
                or self.hedge_delay is not None)

    @property
    def replicas(self) -> bool:
        """Whether replicas fail (scheduled or drawn)."""
        return bool(self.replica_failures) or self.mtbf is not None

    @property
    def links(self) -> bool:
        """Whether links slow down or go down (scheduled or drawn)."""
        return bool(self.link_events) or self.link_mtbf is not None

    @property
    def enabled(self) -> bool:
        """Whether anything in this section is on."""
        return self.clients or self.replicas or self.links

    def backoff(self, k: int, u: float) -> float:
        """The wait before attempt ``k + 1`` after attempt ``k`` (>= 1) ended, ``u`` uniform in
        [0, 1): exponential, capped, then jittered."""
        try:
            grown = self.backoff_base_time * self.backoff_multiplier ** (k - 1)
        except OverflowError:       # a huge multiplier: the cap holds
            grown = math.inf
        return min(self.backoff_max_time, grown) * (1.0 - self.backoff_jitter * u)
