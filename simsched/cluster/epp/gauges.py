"""The queue gauges llm-d's router reads of every replica, and its default profile's fused terms.

:class:`QueueGauges` reads the waiting and running gauges vLLM exports (``num_requests_waiting``,
``num_requests_running``) from a view's replicas, and sums llm-d's default profile's first two
scorers (queue-scorer, kv-cache-utilization-scorer) per endpoint in one pass.

With exact state, a router reads the gauges at every arrival. In a cluster where only a
replica's own GPU loop and its arrivals change its queues (no aborts, removals, failures or KV
transfers: :class:`~simsched.cluster.cluster.Cluster` decides), each replica reports, through
``Replica.on_queue``, that its queues may have changed (at each add and each step of its
loop), into the view's ``queue_changed`` set. The gauges then recount only those replicas, keep
the replicas grouped by count, each group ordered by KV term (which changes only in the same
steps). The queue scorer's min and max are then the least and greatest count present, and the
best fused score is the best of each group's top (the sum of a group's one queue term and a KV
term grows with the KV term, rounding included), its ties a walk down from the tops. What this
replaces: a count of every replica's four queues, a min and a max over them, every endpoint's
two terms and a max, a count and an index over them, per request (most of llm-d's routing time
on 64 replicas). Each figure is the
same integer, and each term the same float expression of the same figures, as the full pass's;
with ``verify`` (the run's ``check_invariants``) every read is checked against a full pass, so a
path that changes a queue without reporting it fails the run at once.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from operator import add


class QueueGauges:
    """The waiting and running gauges of ``replicas`` (a view's), read now.

    ``changed``: the view's ``queue_changed`` set (replica indices whose queues may have changed
    since the last read), or None: every replica is counted at every read. ``verify``: check
    each incremental read against a full one (raises AssertionError naming the replica).
    """

    def __init__(self, replicas, changed: set[int] | None = None, verify: bool = False) -> None:
        self.replicas = replicas
        # Replica.num_waiting, inlined over the four containers it counts, bound once per view
        # (they are never rebound): two property calls a replica, per request with exact state,
        # were half the router's time on 64 replicas. The equality is tested.
        self.parts = [(r.scheduler._waiting, r.scheduler._requeue, r.scheduler._unseen,
                       r.pending) for r in replicas] \
            if all(hasattr(r, "pending") and hasattr(getattr(r, "scheduler", None), "_unseen")
                   for r in replicas) else None
        # Incremental only where the reports name replicas by their position in the view.
        self.changed = changed if changed is not None and self.parts is not None \
            and all(getattr(r, "index", None) == i for i, r in enumerate(replicas)) else None
        self.verify = verify
        n = len(replicas)
        self._waiting = [0] * n
        # Each replica's KV term (1 - kv_use) * weight, for the weight in _kv_weight; the
        # replicas recounted since the terms and groups were brought up to date; the groups:
        # waiting count -> [(KV term, replica)] ascending, and the count each replica is filed
        # under (None: not filed yet).
        self._kv_terms: list[float] = [0.0] * n
        self._kv_weight = None
        self._stale: set[int] = set(range(n))
        self._groups: dict[int, list[tuple[float, int]]] = {}
        self._filed: list[int | None] = [None] * n
        if self.changed is not None:
            self.changed.update(range(n))       # a new view: count them all once

    def waiting(self, copy: bool = True) -> list[int]:
        """Each replica's requests waiting to be scheduled (a new list; with ``copy`` False
        and incremental gauges, the kept one, which the caller must not change or keep)."""
        changed, parts = self.changed, self.parts
        if changed is None:
            if parts is None:
                return [r.num_waiting for r in self.replicas]
            return [len(w) + len(q) + len(u) + len(p) for w, q, u, p in parts]
        waiting = self._waiting
        if changed:
            self._recount()
        if self.verify:
            self._verify_waiting()
        return waiting.copy() if copy else waiting

    def _recount(self) -> None:
        """Recount the replicas reported since the last read, and mark them for the KV terms
        and groups (a replica's KV use changes only in its loop's steps too, which report)."""
        changed, parts, waiting = self.changed, self.parts, self._waiting
        for i in changed:
            w, q, u, p = parts[i]
            waiting[i] = len(w) + len(q) + len(u) + len(p)
        self._stale.update(changed)
        changed.clear()

    def _verify_waiting(self) -> None:
        for i, r in enumerate(self.replicas):
            if self._waiting[i] != r.num_waiting:
                raise AssertionError(f"llm-d's waiting gauge of replica {r.index} is "
                                     f"{self._waiting[i]}, the replica has {r.num_waiting} "
                                     f"waiting")

    def running(self) -> list[int]:
        """Each replica's running requests (a new list)."""
        return [len(r.scheduler.running) for r in self.replicas]

    def _refresh(self, kv: list, wk: float) -> None:
        """Bring the waiting counts, the KV terms and the groups up to date with the replicas'
        queues and ``kv`` (the replicas reported or recounted since, or all of them for a new KV
        weight)."""
        terms, groups, filed, waiting = self._kv_terms, self._groups, self._filed, self._waiting
        stale = self._stale
        if self.changed:
            self._recount()
        if wk != self._kv_weight:
            stale.update(range(len(terms)))
            self._kv_weight = wk
        for i in stale:
            t, v, old = (1.0 - kv[i]) * wk, waiting[i], filed[i]
            if v == old and t == terms[i]:
                continue                # (reported, but its count and KV term are as filed)
            if old is not None:         # take it out of its group
                group = groups[old]
                del group[bisect_left(group, (terms[i], i))]
                if not group:
                    del groups[old]
            terms[i], filed[i] = t, v
            group = groups.get(v)
            if group is None:
                groups[v] = [(t, i)]
            else:
                insort(group, (t, i))
        stale.clear()

    def fused_terms(self, waiting: list, kv: list, wq: float, wk: float) -> list[float]:
        """The queue scorer's and the KV-utilisation scorer's terms, weighted ``wq`` and ``wk``
        and summed, per endpoint (a new list): ``(max - w) / (max - min) * wq + (1 - kv) * wk``
        (``1.0 * wq`` for the queue term when every queue is as long), the same float
        operations as the two scorers' passes. ``waiting`` is the last :meth:`waiting` read,
        ``kv`` the view's KV use."""
        if self.changed is None:
            return _terms(waiting, kv, wq, wk)
        self._refresh(kv, wk)
        fused = list(map(add, map(self._queue_terms(wq).__getitem__, waiting), self._kv_terms))
        if self.verify:
            self._check(fused, _terms(waiting, kv, wq, wk))
        return fused

    def best(self, kv: list, wq: float, wk: float) -> list[int]:
        """The replicas whose fused terms (see :meth:`fused_terms`) are the greatest, in index
        order, from the groups: O(groups + ties), after the changes since the last call."""
        self._refresh(kv, wk)
        groups = self._groups
        low, high = min(groups), max(groups)
        span = high - low
        # Each group's best: its one queue term (as _queue_terms) plus its greatest KV term;
        # the groups whose best is the best of all, then the endpoints as good in each.
        best = None
        for v, group in groups.items():
            q = (high - v) / span * wq if span else 1.0 * wq
            top = q + group[-1][0]
            if best is None or top > best:
                best, tops = top, [(q, group)]
            elif top == best:
                tops.append((q, group))
        tied = []
        for q, group in tops:
            j = len(group) - 1
            while j >= 0 and q + group[j][0] == best:
                tied.append(group[j][1])
                j -= 1
        if len(tied) > 1:
            tied.sort()
        if self.verify:
            self._verify_waiting()
            whole = _terms(self._waiting, kv, wq, wk)
            top = max(whole)
            full = [i for i, t in enumerate(whole) if t == top]
            if tied != full:
                raise AssertionError(f"llm-d's best endpoints from the groups are {tied}, a full "
                                     f"pass gives {full}")
        return tied

    def _queue_terms(self, wq: float) -> dict[int, float]:
        """The queue scorer's weighted term of each waiting count present (a handful: queues
        are short), the same float expression as its pass."""
        groups = self._groups
        low, high = min(groups), max(groups)
        if high == low:
            return {low: 1.0 * wq}
        span = high - low
        return {v: (high - v) / span * wq for v in groups}

    def _check(self, fused: list, whole: list) -> None:
        for i, (have, full) in enumerate(zip(fused, whole)):
            if have != full:
                raise AssertionError(
                    f"llm-d's incrementally kept queue and KV terms of replica "
                    f"{self.replicas[i].index} are {have!r}, a full pass gives {full!r}")


def _terms(waiting: list, kv: list, wq: float, wk: float) -> list[float]:
    """Every endpoint's fused terms, in one pass (see :meth:`QueueGauges.fused_terms`)."""
    low, high = min(waiting), max(waiting)
    if high == low:
        return [1.0 * wq + (1.0 - k) * wk for k in kv]
    span = high - low
    return [(high - v) / span * wq + (1.0 - k) * wk for v, k in zip(waiting, kv)]
