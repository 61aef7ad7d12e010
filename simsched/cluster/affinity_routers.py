"""Affinity routers: send a request where its prefix, session or LoRA adapter already is.

``prefix_affinity`` (longest cached prompt prefix), ``session_affinity`` (sticky sessions) and
``lora_affinity`` (a replica holding the request's adapter), each under a load cap so one hot
prefix, session or adapter cannot swamp a replica. Registered in
:data:`~simsched.cluster.load_routers.ROUTERS` on import (:mod:`simsched.cluster.routers`
imports this module).
"""

from __future__ import annotations

from typing import Any

from simsched.cluster.load_routers import (Router, _cached_tokens, _check_ratio, _check_slack,
                                           _under_cap, register)


class _Capped(Router):
    """An affinity router's load cap: a replica may be chosen for affinity while its outstanding
    requests are at most ``max_load_ratio`` x the mean plus ``load_slack``."""

    def __init__(self, num_replicas, rng, max_load_ratio: float = 1.5,
                 load_slack: float = 4.0) -> None:
        super().__init__(num_replicas, rng)
        _check_ratio("max_load_ratio", max_load_ratio)
        _check_slack(load_slack)
        self.max_load_ratio = max_load_ratio
        self.load_slack = load_slack


@register("prefix_affinity")
class PrefixAffinity(_Capped):
    """The replica caching the longest prefix of the prompt, unless it is overloaded.

    Only replicas whose outstanding requests are at most ``max_load_ratio`` x the mean plus
    ``load_slack`` may be chosen for affinity, so one hot prefix cannot swamp a replica; among
    them the longest cached prefix wins (lowest index on ties). With no hit under the cap the
    request goes to the replica with the fewest outstanding requests.
    """

    needs = ("outstanding",)
    uses_prefix_index = True

    def choose(self, view, req) -> int:
        if getattr(req, "content", None) is None:
            return view.least("outstanding")
        index = getattr(view, "prefix_holders", None)
        replicas = view.replicas
        # Only replicas caching the prompt's first blocks can hit: the index names them.
        candidates = range(len(replicas)) if index is None else index.candidates(req)
        best, best_tokens = -1, 0
        for i in candidates:
            if not _under_cap(view, i, self.max_load_ratio, self.load_slack):
                continue
            cached = _cached_tokens(replicas[i], req)
            if cached > best_tokens:
                best, best_tokens = i, cached
        return best if best >= 0 else view.least("outstanding")


@register("session_affinity")
class SessionAffinity(Router):
    """Every turn of a session goes to the replica that served its first turn (sticky).

    A session's first turn, and a request without a ``session_id``, goes to the replica with the
    fewest outstanding requests. With ``max_load_ratio`` set, a session whose replica is over
    ``max_load_ratio`` x the mean plus ``load_slack`` moves to the least loaded one.
    """

    needs = ("outstanding",)

    def __init__(self, num_replicas, rng, max_load_ratio: float | None = None,
                 load_slack: float = 4.0) -> None:
        super().__init__(num_replicas, rng)
        _check_ratio("max_load_ratio", max_load_ratio, allow_none=True)
        _check_slack(load_slack)
        self.max_load_ratio = max_load_ratio
        self.load_slack = load_slack
        self.home: dict[Any, int] = {}

    def choose(self, view, req) -> int:
        session = req.session_id
        if session < 0:
            return view.least("outstanding")
        i = self.home.get(session)
        if i is None or not _under_cap(view, i, self.max_load_ratio, self.load_slack):
            i = self.home[session] = view.least("outstanding")
        return i


def _adapter_holders(view) -> list:
    """Per replica, the set of adapters on its GPU (empty without LoRA): the live replicas'
    :class:`~simsched.engine.lora.AdapterCache` key views, read as a gateway reads the adapters
    an engine reports loaded."""
    return [r.lora.cache.gpu.keys() if getattr(r, "lora", None) is not None else ()
            for r in view.replicas]


@register("lora_affinity")
class LoRAAffinity(_Capped):
    """A replica that has the request's LoRA adapter on its GPU, unless it is overloaded.

    Among the replicas holding the adapter (or the one its last request went to, where it will
    be loaded) whose outstanding requests are at most ``max_load_ratio`` x the mean plus
    ``load_slack``, the least loaded wins (lowest index on ties); with none, and for base-model
    requests, the least loaded replica. O(replicas holding the adapter) per request: an index
    from adapter to the replicas holding it, kept from the caches' load and eviction events.
    """

    needs = ("outstanding",)

    def __init__(self, num_replicas, rng, max_load_ratio: float = 1.5,
                 load_slack: float = 4.0) -> None:
        super().__init__(num_replicas, rng, max_load_ratio, load_slack)
        self.holders: dict[int, set] | None = None
        self.home: dict[int, int] = {}      # adapter -> the replica its last request went to

    def _listen(self, view) -> dict:
        holders: dict[int, set] = {}
        for i, r in enumerate(view.replicas):
            if getattr(r, "lora", None) is not None:
                def note(adapter, on_gpu, i=i):
                    if on_gpu:
                        holders.setdefault(adapter, set()).add(i)
                    else:
                        holders[adapter].discard(i)
                r.lora.cache.listener = note
                for adapter in r.lora.cache.gpu:
                    holders.setdefault(adapter, set()).add(i)
        self.holders = holders
        return holders

    def choose(self, view, req) -> int:
        adapter = getattr(req, "adapter", -1)
        if adapter < 0:
            return view.least("outstanding")
        holders = self.holders if self.holders is not None else self._listen(view)
        outstanding = view.outstanding
        best = -1
        home = self.home.get(adapter, -1)
        for i in sorted(holders.get(adapter, ())) + ([home] if home >= 0 else []):
            if (best < 0 or outstanding[i] < outstanding[best]) \
                    and _under_cap(view, i, self.max_load_ratio, self.load_slack):
                best = i
        if best < 0:
            best = view.least("outstanding")
        self.home[adapter] = best
        return best

