"""The router registry, the :class:`Router` base and the load-only routers.

:data:`ROUTERS` maps a name to a router class; :func:`register` adds one. The routers here
choose by load alone (``round_robin``, ``random``, ``jsq``, ``least_tokens``, ``least_kv``,
``power_of_two``); the helpers below them (cached-prefix query, load-cap checks) serve the
affinity routers of :mod:`simsched.cluster.affinity_routers` and ``weighted`` in
:mod:`simsched.cluster.routers`, which documents the router interface and builds routers.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

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

