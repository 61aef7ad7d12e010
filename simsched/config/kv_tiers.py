"""Config of the tiered KV cache: the tiers below the GPU that keep evicted prefix blocks.

A :class:`KVTierConfig` is one tier (``cpu`` memory, local ``disk``, a ``remote`` store): its
capacity, the bandwidths and latency of its link to the GPU and its eviction policy.
:class:`KVTiersConfig` (``CacheConfig.kv_tiers``) lists a replica's own tiers, fastest first,
and says whether a load overlaps the forward pass layer by layer. A ``remote`` tier shared by
every replica of a cluster is ``ClusterConfig.kv_remote_tier`` (a :class:`KVTierConfig`).
The engine side is :mod:`simsched.engine.kv.tiers`; docs/kv_tiers.md explains the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from simsched.config.checks import check_bool, check_choice, check_float, plain

TIER_NAMES = ("cpu", "disk", "remote")
EVICTION_POLICIES = ("lru", "fifo")
# Link defaults per tier, (read GB/s, write GB/s, latency s): a PCIe 5 x16 host link as
# measured by copy engines (about 50 GB/s peak, ~25 sustained with pinned pages), an NVMe SSD
# (PCIe 4 x4: ~6 GB/s reads, ~3 GB/s writes, ~100 us), a 100 Gb/s RDMA network (12.5 GB/s,
# ~0.5 ms including the store's lookup).
LINK_DEFAULTS = {"cpu": (25.0, 25.0, 1e-5), "disk": (6.0, 3.0, 1e-4),
                 "remote": (12.5, 12.5, 5e-4)}


@dataclass(frozen=True)
class KVTierConfig:
    """One tier below the GPU: ``name`` (``cpu``, ``disk`` or ``remote``), ``capacity_gib``
    (GiB, 2**30 bytes; ``None`` or inf: unbounded), ``read_gbps`` / ``write_gbps`` (GB/s of its
    link to the GPU, 1e9 bytes/s; None: the tier's default in :data:`LINK_DEFAULTS`),
    ``latency`` (seconds added to each load; None: the default) and ``eviction`` (``lru``: least
    recently stored or hit first; ``fifo``: least recently stored first)."""

    name: str = "cpu"
    capacity_gib: float | None = None
    read_gbps: float | None = None
    write_gbps: float | None = None
    latency: float | None = None
    eviction: str = "lru"

    def __post_init__(self) -> None:
        plain(self)
        o = f"kv tier {self.name!r}"
        check_choice("kv tier", "name", self.name, TIER_NAMES)
        if self.capacity_gib is not None:
            check_float(o, "capacity_gib", self.capacity_gib, 0.0)
        for field_name in ("read_gbps", "write_gbps"):
            value = getattr(self, field_name)
            if value is not None:
                check_float(o, field_name, value, 0.0, low_open=True, finite=True)
        if self.latency is not None:
            check_float(o, "latency", self.latency, 0.0, finite=True)
        check_choice(o, "eviction", self.eviction, EVICTION_POLICIES)

    @property
    def capacity_bytes(self) -> float:
        """Capacity in bytes (inf: unbounded)."""
        return math.inf if self.capacity_gib is None else self.capacity_gib * 2**30

    def link(self) -> tuple[float, float, float]:
        """``(read bytes/s, write bytes/s, latency s)``, defaults filled in."""
        read, write, latency = LINK_DEFAULTS[self.name]
        return ((self.read_gbps if self.read_gbps is not None else read) * 1e9,
                (self.write_gbps if self.write_gbps is not None else write) * 1e9,
                self.latency if self.latency is not None else latency)


def _build(cls, value: Any, where: str):
    """``value`` (a ``cls`` or a mapping of its fields) as a ``cls``; else a ValueError."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**value)
    raise ValueError(f"{where} must be a {cls.__name__} or a mapping of its fields, "
                     f"got {value!r}")


def as_tier(value: Any, where: str) -> KVTierConfig:
    """``value`` (a :class:`KVTierConfig` or a mapping of its fields) as a KVTierConfig."""
    return _build(KVTierConfig, value, where)


@dataclass(frozen=True)
class KVTiersConfig:
    """A replica's tiers below the GPU (``CacheConfig.kv_tiers``), looked up in order (list the
    fastest first), and ``overlap_layers``: whether a load overlaps the step's forward pass layer
    by layer (layer ``i`` computes while layer ``i + 1`` loads) or precedes it.

    ``tiers`` may be empty: then only a cluster's shared ``remote`` tier
    (``ClusterConfig.kv_remote_tier``) holds evicted blocks. Mappings are accepted for the whole
    config and for each tier (JSON and ``--set``)."""

    tiers: tuple = ()
    overlap_layers: bool = False

    def __post_init__(self) -> None:
        tiers = self.tiers
        if isinstance(tiers, (Mapping, str, bytes)) or not isinstance(tiers, (tuple, list)):
            raise ValueError(f"cache.kv_tiers.tiers must be a list of tiers, got {tiers!r}")
        tiers = tuple(as_tier(t, f"cache.kv_tiers.tiers[{i}]") for i, t in enumerate(tiers))
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"cache.kv_tiers.tiers names a tier twice: {names}")
        object.__setattr__(self, "tiers", tiers)
        check_bool("cache.kv_tiers", "overlap_layers", self.overlap_layers)


def as_tiers(value: Any) -> KVTiersConfig | None:
    """``CacheConfig.kv_tiers`` as given (None, a KVTiersConfig or a mapping of its fields)."""
    return None if value is None else _build(KVTiersConfig, value, "cache.kv_tiers")
