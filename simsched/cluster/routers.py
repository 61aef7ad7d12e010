"""Routers: which replica serves an arriving request. Adding one touches only this file.

A router is a plain object made by ``ROUTERS[name](num_replicas, rng, **options)`` with one
method, ``choose(view, req) -> replica index``. ``view`` is read-only replica state, exact
(:class:`~simsched.cluster.state.ReplicaLoad`) or a periodic snapshot
(:class:`~simsched.cluster.state.Snapshot`): per-replica lists ``outstanding`` (requests routed
and not done), ``tokens`` (their outstanding prompt + output tokens), ``kv_use`` (share of KV
blocks in use), ``total_outstanding``, ``least(metric)`` and ``replicas`` (for cached-prefix
queries). ``rng`` is a numpy Generator derived from the run's seed. A router's ``needs`` names
the figures it asks ``least`` for, which the exact view then keeps ordered.

Cost per request: O(1) for ``round_robin``, ``random``, ``power_of_two`` and
``session_affinity`` (after a session's first turn), O(1) for ``jsq``, ``least_tokens`` and
``least_kv`` (the exact view keeps their minima in an O(log replicas) tree; a snapshot computes
each minimum once per refresh); ``prefix_affinity`` scores only the replicas caching blocks of
the prompt's first segment (a :class:`~simsched.cluster.state.PrefixHolders` index fed by the
caches' events), O(prompt segments x such replicas); ``weighted`` scores every replica, O(replicas
x prompt segments), as llm-d's scheduler scores every pod; ``lora_affinity`` looks only at the
replicas holding the request's adapter (an index kept from the adapter caches' events).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

import simsched.config.cluster as _cluster_config
from simsched.cluster.state import METRICS


def _cached_tokens(replica, req) -> int:
    """Prompt tokens of ``req`` that ``replica``'s KV cache already holds (0 without a prefix cache).

    Asks ``replica.kv.num_cached_prefix_tokens(req)``, the side-effect-free query admission uses
    (O(prompt segments)); a request without content identity reports 0. The router reads the
    replicas' caches directly (as a KV-event-driven index does), even when load comes from a
    stale snapshot.
    """
    if getattr(req, "content", None) is None:
        return 0
    return int(replica.kv.num_cached_prefix_tokens(req))


class _Uniforms:
    """Uniform [0, 1) draws from ``rng`` in blocks (one numpy call per 1,024 draws)."""

    __slots__ = ("rng", "buf", "pos")
    BLOCK = 1024

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.buf: list[float] = []
        self.pos = 0

    def index(self, n: int) -> int:
        """A uniformly random integer in [0, n)."""
        if self.pos >= len(self.buf):
            self.buf = self.rng.random(self.BLOCK).tolist()
            self.pos = 0
        u = self.buf[self.pos]
        self.pos += 1
        return min(int(u * n), n - 1)


class Router:
    """Base class: remembers the replica count and the rng.

    ``needs`` names the load figures the router asks ``least`` for; ``reads_kv`` says whether it
    reads ``kv_use`` at all (only then do replicas report their KV use every iteration);
    ``uses_prefix_index``, whether the view should keep ``prefix_holders`` (which replicas cache
    a prompt's first blocks).
    """

    needs: tuple = ()
    reads_kv: bool = False
    uses_prefix_index: bool = False

    def __init__(self, num_replicas: int, rng: np.random.Generator) -> None:
        self.num_replicas = num_replicas
        self.rng = rng

    def choose(self, view, req) -> int:  # pragma: no cover - abstract
        """The index of the replica that serves ``req``."""
        raise NotImplementedError


ROUTERS: dict[str, Callable[..., Router]] = {}


def register(name: str):
    """Class decorator adding a router to :data:`ROUTERS` under ``name``."""
    def add(cls):
        ROUTERS[name] = cls
        cls.name = name
        return cls
    return add


@register("round_robin")
class RoundRobin(Router):
    """Replicas in turn: 0, 1, ..., n-1, 0, ..."""

    def __init__(self, num_replicas, rng) -> None:
        super().__init__(num_replicas, rng)
        self.next = 0

    def choose(self, view, req) -> int:
        i = self.next
        self.next = i + 1 if i + 1 < self.num_replicas else 0
        return i


@register("random")
class Random(Router):
    """A uniformly random replica."""

    def __init__(self, num_replicas, rng) -> None:
        super().__init__(num_replicas, rng)
        self.draws = _Uniforms(rng)

    def choose(self, view, req) -> int:
        return self.draws.index(self.num_replicas)


@register("jsq")
class JoinShortestQueue(Router):
    """The replica with the fewest outstanding requests (join the shortest queue)."""

    needs = ("outstanding",)

    def choose(self, view, req) -> int:
        return view.least("outstanding")


@register("least_tokens")
class LeastTokens(Router):
    """The replica with the fewest outstanding prompt + output tokens.

    ``output_tokens`` is the output length counted per request: None counts its true length (an
    oracle; the simulator knows it), an integer a fixed estimate.
    """

    needs = ("tokens",)

    def __init__(self, num_replicas, rng, output_tokens: int | None = None) -> None:
        super().__init__(num_replicas, rng)
        if output_tokens is not None and (isinstance(output_tokens, bool)
                                          or not isinstance(output_tokens, int)
                                          or output_tokens < 0):
            raise ValueError(f"output_tokens must be an integer >= 0 or None, "
                             f"got {output_tokens!r}")
        self.output_tokens = output_tokens

    def choose(self, view, req) -> int:
        return view.least("tokens")


@register("least_kv")
class LeastKV(Router):
    """The replica with the lowest share of KV blocks in use."""

    needs = ("kv_use",)
    reads_kv = True

    def choose(self, view, req) -> int:
        return view.least("kv_use")


@register("power_of_two")
class PowerOfTwo(Router):
    """Of two distinct random replicas, the less loaded (by ``metric``; the first on ties)."""

    def __init__(self, num_replicas, rng, metric: str = "outstanding") -> None:
        super().__init__(num_replicas, rng)
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {list(METRICS)}, got {metric!r}")
        self.metric = metric
        self.reads_kv = metric == "kv_use"
        self.draws = _Uniforms(rng)

    def choose(self, view, req) -> int:
        n = self.num_replicas
        if n == 1:
            return 0
        a = self.draws.index(n)
        b = self.draws.index(n - 1)
        b += b >= a                     # distinct from a, uniform over the others
        load = getattr(view, self.metric)
        return b if load[b] < load[a] else a


def _check_ratio(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    # Finite: an infinite ratio times a mean load of 0 is NaN, and no replica is under NaN.
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 1 <= value < math.inf:
        raise ValueError(f"{name} must be a finite number >= 1"
                         f"{' or None (no cap)' if allow_none else ''}, got {value!r}")


def _check_slack(value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value < math.inf:
        raise ValueError(f"load_slack must be a finite number >= 0, got {value!r}")


def _under_cap(view, i: int, ratio: float | None, slack: float) -> bool:
    """Whether replica ``i``'s outstanding requests are within ``ratio`` x mean + ``slack``."""
    if ratio is None:
        return True
    mean = view.total_outstanding / view.num_replicas
    return view.outstanding[i] <= ratio * mean + slack


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


@register("weighted")
class Weighted(Router):
    """The best weighted sum of normalised scores, as llm-d's scheduler scores pods.

    Each score is in [0, 1], higher is better: ``prefix`` = cached prompt tokens / prompt tokens;
    ``queue`` = (most outstanding - outstanding) / (most - fewest) over the replicas (1 when all
    are equal); ``kv`` = 1 - KV use; ``lora`` = 1 where the request's LoRA adapter is on the
    replica's GPU (0 for base-model requests everywhere). ``weights`` maps score names to
    weights (default 1 each); the lowest index wins ties.
    """

    SCORERS = ("prefix", "queue", "kv", "lora")
    reads_kv = True

    def __init__(self, num_replicas, rng, weights: Mapping[str, float] | None = None) -> None:
        super().__init__(num_replicas, rng)
        weights = {"prefix": 1.0, "queue": 1.0, "kv": 1.0, "lora": 1.0} if weights is None \
            else weights
        if not isinstance(weights, Mapping):
            raise ValueError(f"weights must be a mapping of scorer to weight, got {weights!r}")
        for name, w in weights.items():
            if name not in self.SCORERS:
                raise ValueError(f"unknown scorer {name!r} in weights; known: "
                                 f"{list(self.SCORERS)}")
            # An infinite weight makes inf x 0 = NaN scores (every request to replica 0).
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < math.inf:
                raise ValueError(f"weights[{name!r}] must be a finite number >= 0, got {w!r}")
        if not any(weights.values()):
            raise ValueError(f"weights {dict(weights)!r} must give some scorer a weight > 0 "
                             "(with none every score is 0: every request to replica 0)")
        self.w_prefix = float(weights.get("prefix", 0.0))
        self.w_queue = float(weights.get("queue", 0.0))
        self.w_kv = float(weights.get("kv", 0.0))
        self.w_lora = float(weights.get("lora", 0.0))

    def choose(self, view, req) -> int:
        queue = view.outstanding
        low, high = min(queue), max(queue)
        span = high - low
        kv = view.kv_use
        prefix = self.w_prefix and getattr(req, "content", None) is not None
        prompt = max(1, req.num_prompt_tokens)
        adapter = getattr(req, "adapter", -1)
        # Base-model requests score 0 everywhere: no lookups, the same choice as without LoRA.
        loaded = _adapter_holders(view) if self.w_lora and adapter >= 0 else None
        best, best_score = 0, -1.0
        for i in range(self.num_replicas):
            score = self.w_kv * (1.0 - kv[i])
            if span:
                score += self.w_queue * (high - queue[i]) / span
            else:
                score += self.w_queue
            if prefix:
                score += self.w_prefix * _cached_tokens(view.replicas[i], req) / prompt
            if loaded is not None and adapter in loaded[i]:
                score += self.w_lora
            if score > best_score:
                best, best_score = i, score
        return best


def make_router(name: str, options: Mapping[str, Any], num_replicas: int,
                rng: np.random.Generator) -> Router:
    """Build router ``name`` with ``options``; a bad name or option raises ValueError."""
    if name not in ROUTERS:
        raise ValueError(f"cluster.router must be one of {sorted(ROUTERS)}, got {name!r}")
    try:
        return ROUTERS[name](num_replicas, rng, **dict(options))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cluster.router_options {dict(options)!r} are invalid for router "
                         f"{name!r}: {exc}") from None


def check_router(name: str, options: Mapping[str, Any]) -> None:
    """Raise ValueError if ``name`` is not a router or ``options`` do not suit it."""
    make_router(name, options, 2, np.random.default_rng(0))


# Config validates router names and options through this hook (it cannot import this layer).
_cluster_config._router_check = check_router
