"""Routers: which replica serves an arriving request; the router interface and factory.

The routers live in three modules: :mod:`~simsched.cluster.load_routers` (the registry, the
base class and the load-only routers), :mod:`~simsched.cluster.affinity_routers` (prefix,
session and LoRA affinity) and this one (``weighted``, :func:`make_router`); every name is
importable from here. Adding a router is one class decorated with ``@register("name")``.

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
from typing import Any, Mapping

import numpy as np

import simsched.config.cluster as _cluster_config
# The registry and every router live in these modules; imported here in registration order
# (ROUTERS keeps it) and re-exported so ``from simsched.cluster.routers import X`` still works.
from simsched.cluster.load_routers import (  # noqa: F401
    METRICS, ROUTERS, JoinShortestQueue, LeastKV, LeastTokens, PowerOfTwo, Random, RoundRobin,
    Router, _cached_tokens, register)
from simsched.cluster.affinity_routers import (  # noqa: F401
    LoRAAffinity, PrefixAffinity, SessionAffinity, _adapter_holders)


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


# llm-d's endpoint picker (simsched/cluster/epp), registered after the built-in routers.
from simsched.cluster.epp import LlmD  # noqa: E402,F401


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
