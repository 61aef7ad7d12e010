"""The cluster section of a config: replicas, per-replica overrides, routing, admission control,
prefill/decode roles and KV links."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from simsched.config.autoscaling import AutoscalingConfig
from simsched.config.checks import check_float, check_int, from_fields, plain
from simsched.config.kv_tiers import KVTierConfig, as_tier
from simsched.config.parts import replica_fields

# Routers live in the cluster layer, above config; simsched.cluster.routers installs its name and
# option check here when imported (importing any part of simsched does), so a bad router fails
# when the config is built rather than at the first run.
_router_check = None
# The sections a per-replica override may change (the workload and the cluster are shared).
REPLICA_SECTIONS = ("scheduler", "cache", "hardware")


@dataclass(frozen=True)
class ClusterConfig:
    """Replicas behind a router: how many, per-replica overrides, routing and admission control.

    ``num_replicas`` replicas share the run's clock. ``replicas`` optionally overrides the first
    replicas' settings: a tuple of mappings of scheduler, cache or hardware fields (flat names such
    as ``gpu``, ``tensor_parallel_size``, ``max_num_seqs``, ``num_blocks``), each with an optional
    ``count`` (default 1) repeating it; replicas beyond the listed ones use the base settings.
    ``router`` names a router of :mod:`simsched.cluster.routers` (never consulted with one
    replica) and ``router_options`` its options. ``refresh_interval`` is how stale the load the
    router sees is: 0 gives it the exact state, ``t >= 1e-4`` (:data:`MIN_REFRESH_INTERVAL`) a
    snapshot taken every ``t`` seconds. Each snapshot is one event, so a shorter interval would
    only slow the run (iterations last milliseconds: such a snapshot is the exact state), and one
    below the clock's float resolution would stop the clock.
    Admission control sheds (rejects with a ``shed: ...`` reason) a request when the chosen
    replica already has ``max_num_queued_per_replica`` requests waiting, or when the token bucket
    (``rate_limit`` requests/s, ``burst`` requests deep, default ``max(1, rate_limit)``) is empty.

    Disaggregated prefill/decode (:mod:`simsched.cluster.disagg`): ``roles`` gives each replica
    a role, ``mixed`` (prefill and decode, the default), ``prefill`` or ``decode``; or
    ``num_prefill_replicas`` and ``num_decode_replicas`` make the first replicas prefill ones and
    the next decode ones (xPyD). ``router`` picks among prefill and mixed replicas,
    ``decode_router`` (default: ``router``) among decode and mixed ones. The KV moves over the
    prefill replica's links: ``link`` names a preset (``nvlink``, ``ib200``, ``ib400``,
    ``roce200``, ``roce400``, ``pcie``); ``link_bandwidth_gbps`` (GB/s per GPU, 1e9 bytes/s) and
    ``link_latency`` (seconds) override it. Prompts shorter than ``disagg_min_prompt_tokens``
    are prefilled on the decode replica itself.

    ``kv_remote_tier`` (a :class:`~simsched.config.kv_tiers.KVTierConfig` named ``remote``,
    default None) is a KV store shared by all replicas, below their own tiers
    (``cache.kv_tiers``, which must be set): blocks one replica evicts can be loaded by
    another (:mod:`simsched.engine.kv.tiers`).
    ``autoscaling`` (:class:`~simsched.config.autoscaling.AutoscalingConfig`, None: a fixed
    fleet) adds and removes replicas during the run; ``num_replicas`` is then the count at the
    start.
    """

    num_replicas: int = 1
    replicas: tuple = ()
    router: str = "round_robin"
    router_options: Mapping[str, Any] = field(default_factory=dict)
    refresh_interval: float = 0.0
    max_num_queued_per_replica: int | None = None
    rate_limit: float | None = None
    burst: float | None = None
    roles: tuple = ()
    num_prefill_replicas: int = 0
    num_decode_replicas: int = 0
    decode_router: str | None = None
    link: str = "ib200"
    link_bandwidth_gbps: float | None = None
    link_latency: float | None = None
    disagg_min_prompt_tokens: int = 0
    # A remote KV store shared by every replica (simsched.config.kv_tiers); None: none.
    kv_remote_tier: KVTierConfig | Mapping | None = None
    autoscaling: AutoscalingConfig | None = None

    def __post_init__(self) -> None:
        plain(self)
        o = "cluster"
        if self.kv_remote_tier is not None:
            tier = as_tier(self.kv_remote_tier, f"{o}.kv_remote_tier")
            if tier.name != "remote":
                raise ValueError(f"{o}.kv_remote_tier must be named 'remote', got {tier.name!r}")
            object.__setattr__(self, "kv_remote_tier", tier)
        check_int(o, "num_replicas", self.num_replicas, 1, 100_000)
        self._check_disagg(o)
        replicas = self.replicas
        if isinstance(replicas, Mapping) or isinstance(replicas, (str, bytes)) \
                or not isinstance(replicas, (tuple, list)):
            raise ValueError(f"{o}.replicas must be a tuple of mappings of per-replica settings, "
                             f"got {replicas!r}")
        known = replica_fields() | {"count"}
        total = 0
        for i, entry in enumerate(self.replicas):
            where = f"{o}.replicas[{i}]"
            if not isinstance(entry, Mapping):
                raise ValueError(f"{where} must be a mapping of settings, got {entry!r}")
            for key in entry:
                if not isinstance(key, str) or key.split(".", 1)[-1] not in known \
                        or ("." in key and key.split(".", 1)[0] not in REPLICA_SECTIONS):
                    raise ValueError(f"{where} has unknown field {key!r}; a replica may set "
                                     f"scheduler, cache and hardware fields and count")
            count = entry.get("count", 1)
            check_int(where, "count", count, 1, 100_000)
            total += count
        # Copies, so that changing the caller's mappings later cannot change this config.
        object.__setattr__(self, "replicas", tuple(dict(e) for e in replicas))
        if total > self.num_replicas:
            raise ValueError(f"{o}.replicas lists {total} replicas (counts included), more than "
                             f"{o}.num_replicas={self.num_replicas}")
        if not isinstance(self.router, str) or not self.router:
            raise ValueError(f"{o}.router must be a router name, got {self.router!r}")
        if not isinstance(self.router_options, Mapping):
            raise ValueError(f"{o}.router_options must be a mapping, got {self.router_options!r}")
        if _router_check is not None:
            _router_check(self.router, self.router_options)
        check_float(o, "refresh_interval", self.refresh_interval, 0.0, finite=True)
        if 0 < self.refresh_interval < MIN_REFRESH_INTERVAL:
            raise ValueError(
                f"{o}.refresh_interval must be 0 (exact state) or >= {MIN_REFRESH_INTERVAL:g} s, "
                f"got {self.refresh_interval!r}: each refresh is one event, so a shorter interval "
                "only slows the run (a snapshot fresher than an iteration is the exact state), "
                "and one below the clock's float resolution would stop the clock")
        if self.max_num_queued_per_replica is not None:
            check_int(o, "max_num_queued_per_replica", self.max_num_queued_per_replica, 1)
        if self.rate_limit is not None:
            check_float(o, "rate_limit", self.rate_limit, 0.0, low_open=True, finite=True)
        if self.burst is not None:
            if self.rate_limit is None:
                raise ValueError(f"{o}.burst needs {o}.rate_limit")
            check_float(o, "burst", self.burst, 1.0)
        self._check_autoscaling(o)

    def _check_autoscaling(self, o: str) -> None:
        auto = self.autoscaling
        if auto is None:
            return
        if isinstance(auto, Mapping):           # from JSON data
            auto = from_fields(AutoscalingConfig, auto, f"{o}.autoscaling")
            object.__setattr__(self, "autoscaling", auto)
        if not isinstance(auto, AutoscalingConfig):
            raise ValueError(f"{o}.autoscaling must be an AutoscalingConfig, a mapping of its "
                             f"fields or None, got {auto!r}")
        if self.disaggregated:
            raise ValueError(f"{o}.autoscaling does not support disaggregated clusters (roles)")
        if self.replicas:
            raise ValueError(f"{o}.autoscaling builds replicas from its pools: leave "
                             f"{o}.replicas empty and give each pool its replica fields")
        pools = auto.pool_specs()
        low, high = sum(p["min_replicas"] for p in pools), sum(p["max_replicas"] for p in pools)
        if not low <= self.num_replicas <= high:
            raise ValueError(f"{o}.num_replicas={self.num_replicas} (the replicas at the start) "
                             f"must be within the pools' limits [{low}, {high}]")

    def _check_disagg(self, o: str) -> None:
        roles = self.roles
        if isinstance(roles, (str, bytes)) or not isinstance(roles, (tuple, list)):
            raise ValueError(f"{o}.roles must be a tuple of replica roles, got {roles!r}")
        object.__setattr__(self, "roles", tuple(roles))
        for i, role in enumerate(self.roles):
            if role not in ROLES:
                raise ValueError(f"{o}.roles[{i}] must be one of {', '.join(ROLES)}, "
                                 f"got {role!r}")
        if self.roles and len(self.roles) != self.num_replicas:
            raise ValueError(f"{o}.roles lists {len(self.roles)} roles, "
                             f"{o}.num_replicas={self.num_replicas}")
        check_int(o, "num_prefill_replicas", self.num_prefill_replicas, 0)
        check_int(o, "num_decode_replicas", self.num_decode_replicas, 0)
        xy = self.num_prefill_replicas + self.num_decode_replicas
        if xy and self.roles:
            raise ValueError(f"{o}.roles and {o}.num_prefill_replicas/num_decode_replicas "
                             "both set: give one")
        if xy > self.num_replicas:
            raise ValueError(f"{o}.num_prefill_replicas + num_decode_replicas = {xy} exceeds "
                             f"{o}.num_replicas={self.num_replicas}")
        roles = self.replica_roles()
        if any(r != "mixed" for r in roles) and not (
                any(r != "decode" for r in roles) and any(r != "prefill" for r in roles)):
            raise ValueError(f"{o}.roles {tuple(roles)}: a disaggregated cluster needs a "
                             "prefill or mixed replica and a decode or mixed replica")
        if self.decode_router is not None and (not isinstance(self.decode_router, str)
                                               or not self.decode_router):
            raise ValueError(f"{o}.decode_router must be a router name, got "
                             f"{self.decode_router!r}")
        if self.decode_router is not None and _router_check is not None:
            try:
                _router_check(self.decode_router, self.router_options)
            except ValueError as exc:
                raise ValueError(f"{o}.decode_router: {exc}") from None
        if self.link not in LINK_PRESETS:
            raise ValueError(f"{o}.link must be one of {', '.join(LINK_PRESETS)}, "
                             f"got {self.link!r}")
        if self.link_bandwidth_gbps is not None:
            check_float(o, "link_bandwidth_gbps", self.link_bandwidth_gbps, 0.0, low_open=True,
                         finite=True)
        if self.link_latency is not None:
            check_float(o, "link_latency", self.link_latency, 0.0, finite=True)
        check_int(o, "disagg_min_prompt_tokens", self.disagg_min_prompt_tokens, 0)

    def replica_roles(self) -> list[str]:
        """Each replica's role: ``mixed``, ``prefill`` or ``decode``."""
        if self.roles:
            return list(self.roles)
        x, y = self.num_prefill_replicas, self.num_decode_replicas
        return ["prefill"] * x + ["decode"] * y + ["mixed"] * (self.num_replicas - x - y)

    @property
    def disaggregated(self) -> bool:
        """Whether any replica has a prefill or decode role."""
        return bool(self.num_prefill_replicas or self.num_decode_replicas
                    or any(r != "mixed" for r in self.roles))

    def link_spec(self) -> tuple[float, float]:
        """``(bytes per second per GPU, latency in seconds)`` of the KV-transfer links."""
        gbps, latency = LINK_PRESETS[self.link]
        if self.link_bandwidth_gbps is not None:
            gbps = self.link_bandwidth_gbps
        if self.link_latency is not None:
            latency = self.link_latency
        return gbps * 1e9, latency

    def overrides(self) -> list[dict[str, Any]]:
        """One mapping of setting changes per replica (``count`` expanded, empty for the rest)."""
        out: list[dict[str, Any]] = []
        for entry in self.replicas:
            changes = {k: v for k, v in entry.items() if k != "count"}
            out += [changes] * entry.get("count", 1)
        return out + [{}] * (self.num_replicas - len(out))


ROLES = ("mixed", "prefill", "decode")
# The shortest positive refresh_interval, in seconds: 10,000 snapshots per simulated second, ten
# per iteration of a millisecond; gateways scrape engine metrics every 10 ms to seconds.
MIN_REFRESH_INTERVAL = 1e-4
# Link presets: (GB/s per GPU in one direction, latency s). NVLink 3 (A100): 600 GB/s both ways;
# InfiniBand/RoCE NICs at 200 and 400 Gb/s per GPU; PCIe 4.0 x16 ~ 25 GB/s in practice.
LINK_PRESETS = {
    "nvlink": (300.0, 2e-6),
    "ib200": (25.0, 5e-6),
    "ib400": (50.0, 5e-6),
    "roce200": (25.0, 1e-5),
    "roce400": (50.0, 1e-5),
    "pcie": (25.0, 1e-5),
}
