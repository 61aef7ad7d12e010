"""Frozen, validated configuration for one simulation run.

A run is described by a :class:`SimConfig` made of six parts: the scheduler, the KV cache, the
hardware (model, GPU, tensor parallelism, cost model), the workload, the cluster (how many
replicas, per-replica overrides, the router and admission control) and the benchmark client
(:mod:`simsched.config.client`; by default none: the workload's own arrival times). Every field is checked in
``__post_init__`` and a bad value raises ``ValueError`` naming the field and the allowed range.

Sweeps vary configs with :meth:`SimConfig.replace`, which accepts flat field names (``rate=4.0``,
``policy="spf"``) and routes each to the sub-config that owns it. :meth:`SimConfig.to_json` and
:meth:`SimConfig.from_json` (``to_dict``/``from_dict``) write a config and read it back equal,
including the ``config.json`` a run writes.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from simsched.config import serialize
from simsched.config.checks import check_bool, check_float, check_int, plain
from simsched.config.client import ClientConfig
from simsched.config.faults import FaultsConfig
from simsched.config.lifetimes import is_per_pool
from simsched.config.cluster import LINK_PRESETS, REPLICA_SECTIONS, ROLES, ClusterConfig
from simsched.config.parts import (COST_MODELS, PREEMPTION_MODES, SCHEDULER_STYLES, CacheConfig,
                                   HardwareConfig, SchedulerConfig)
from simsched.workloads.workload import WorkloadConfig

__all__ = ["COST_MODELS", "LINK_PRESETS", "PREEMPTION_MODES", "REPLICA_SECTIONS", "ROLES",
           "SCHEDULER_STYLES", "CacheConfig", "ClientConfig", "ClusterConfig", "HardwareConfig",
           "FaultsConfig", "SchedulerConfig",
           "SimConfig", "WorkloadConfig", "field_names"]


@dataclass(frozen=True)
class SimConfig:
    """Everything one run needs: scheduler, cache, hardware, workload, cluster, seed, run limits.

    ``max_sim_time`` ends an overloaded run (simulated seconds); requests still waiting or running
    then are reported with status ``waiting``/``running``. ``check_invariants`` verifies the
    scheduler's invariants after every iteration (slower; on in the tests).
    """

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # Who sends the requests (simsched.config.client); the default: the workload's own times.
    client: ClientConfig = field(default_factory=ClientConfig)
    # When things go wrong (simsched.config.faults); the default: nothing does.
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    seed: int = 0
    max_sim_time: float = math.inf
    check_invariants: bool = False

    def __post_init__(self) -> None:
        plain(self)
        for name, cls in (("scheduler", SchedulerConfig), ("cache", CacheConfig),
                          ("hardware", HardwareConfig), ("workload", WorkloadConfig),
                          ("cluster", ClusterConfig), ("client", ClientConfig),
                          ("faults", FaultsConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"{name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        check_int("config", "seed", self.seed, 0, 2**63 - 1)
        check_float("config", "max_sim_time", self.max_sim_time, 0.0, low_open=True)
        check_bool("config", "check_invariants", self.check_invariants)
        if self.cache.num_blocks is None:
            from simsched.cost import hardware

            # Fail at configuration time, not at the first run, if the weights leave no KV room.
            hardware.kv_capacity_blocks(self.hardware, self.cache.block_size)
        if (self.scheduler.style == "static" and self.cache.enable_prefix_caching
                and self.cache.prefix_cache_model == "blocks"):
            # The block pool's books do not hold under static batching (which vLLM, whose pool
            # it models, does not have): refused rather than run inconsistent.
            raise ValueError("scheduler.style='static' with cache.enable_prefix_caching needs "
                             "cache.prefix_cache_model='segments' (the default 'blocks', vLLM's "
                             "block pool, is not modelled under static batching)")
        if self.cluster.replicas:
            self.replica_configs()      # every override is valid against these base settings
        pools = self.pool_configs()     # so is every autoscaling pool's (the same check)
        if pools and self.cluster.autoscaling.power_budget_watts is not None:
            self._check_power_budget(pools)
        # Roles given either way (cluster.roles, or num_prefill/num_decode_replicas).
        if self.cluster.disaggregated and any(c.scheduler.lora is not None
                                              for c in self.replica_configs()):
            # A handed-off request would join its decode replica without an adapter slot.
            raise ValueError("scheduler.lora is not supported with disaggregated prefill/decode "
                             "(cluster.roles or cluster.num_prefill_replicas/"
                             "num_decode_replicas)")
        engines = {c.scheduler.engine for c in self.replica_configs()}
        if engines != {"vllm"} and (self.cluster.disaggregated
                                    or self.cache.kv_tiers is not None):
            # Handoffs and tier loads are modelled in vLLM's scheduler only.
            raise ValueError(f"scheduler.engine {sorted(engines - {'vllm'})} does not model "
                             "disaggregated prefill/decode or cache.kv_tiers (engine='vllm' "
                             "does)")
        if self.cluster.kv_remote_tier is not None and self.cache.kv_tiers is None:
            raise ValueError("cluster.kv_remote_tier needs cache.kv_tiers (the replicas' tier "
                             "config; its tier list may be empty)")

        if self.faults.enabled:
            self._check_faults()

    _PARTS = ("scheduler", "cache", "hardware", "workload", "cluster", "client", "faults")

    def _check_faults(self) -> None:
        """What ``faults`` may be combined with (the rest is checked by its own section)."""
        faults, cl = self.faults, self.cluster
        if cl.disaggregated and faults.clients:
            raise ValueError("faults: client timeouts, cancellations and retries are not "
                             "supported with disaggregated prefill/decode (cluster.roles or "
                             "num_prefill/num_decode_replicas) yet; replica failures and "
                             "degraded links (faults.link_events, link_mtbf) are")
        if faults.clients and not self.client.is_open:
            raise ValueError("faults: client timeouts, cancellations and retries are not "
                             "supported with a benchmark client (client.client_type "
                             f"{self.client.client_type!r}) yet; use the open client")
        for at, replica in faults.replica_failures:
            if replica >= cl.num_replicas:
                raise ValueError(f"faults.replica_failures: replica {replica} (at t={at:g} s) "
                                 f"is not one of the {cl.num_replicas} replicas of "
                                 "cluster.num_replicas")
        if faults.replicas and self.cache.kv_tiers is not None:
            raise ValueError("faults: replica failures are not supported with cache.kv_tiers "
                             "yet (a failed replica's tiers would have to be emptied too)")
        if faults.replicas and self.scheduler.lora is not None:
            raise ValueError("faults: replica failures are not supported with scheduler.lora "
                             "yet")
        # Pools: the autoscaling pools, a disaggregated cluster's roles, or the one default.
        pools = {p["name"] for p in cl.autoscaling.pool_specs()} \
            if cl.autoscaling is not None else set(cl.replica_roles()) if cl.disaggregated \
            else {"default"}
        for name in ("mtbf", "restart_time"):
            value = getattr(faults, name)
            if is_per_pool(value):
                unknown = sorted({pool for pool, _ in value} - pools)
                if unknown:
                    raise ValueError(f"faults.{name}: pool(s) {unknown} are not among the "
                                     f"cluster's pools {sorted(pools)}")
        if faults.links:
            self._check_links()

    def _check_links(self) -> None:
        """Degraded links need links: a disaggregated cluster's prefill replicas' (by replica
        index) or the remote KV tier's (``"remote"``)."""
        faults, cl = self.faults, self.cluster
        roles = cl.replica_roles() if cl.disaggregated else []
        prefill = [i for i, role in enumerate(roles) if role == "prefill"]
        for at, _, link, _ in faults.link_events:
            if link == "remote":
                if cl.kv_remote_tier is None:
                    raise ValueError(f"faults.link_events: link 'remote' (at t={at:g} s) needs "
                                     "cluster.kv_remote_tier")
            elif link not in prefill:
                raise ValueError(f"faults.link_events: link {link} (at t={at:g} s) is not a "
                                 f"prefill replica's KV-transfer link (prefill replicas: "
                                 f"{prefill})")
        if faults.link_mtbf is not None and not prefill and cl.kv_remote_tier is None:
            raise ValueError("faults.link_mtbf: there is no link to fail (needs prefill "
                             "replicas of a disaggregated cluster or cluster.kv_remote_tier)")

    def replica_configs(self) -> list["SimConfig"]:
        """One config per replica: this one with the replica's scheduler, cache and hardware.

        The replica configs keep the workload and seed; their cluster part is a single replica.
        An override naming a bad value raises ValueError naming ``cluster.replicas[i]``.
        """
        if not self.cluster.replicas:
            return [self] * self.cluster.num_replicas
        out, built = [], {}
        for i, changes in enumerate(self.cluster.overrides()):
            key = tuple(sorted(changes.items(), key=lambda kv: kv[0]))
            try:
                cfg = built.get(key)
            except TypeError:           # an unhashable value (a dict of policy options)
                cfg, key = None, None
            if cfg is None:
                cfg = self._overridden(changes, f"cluster.replicas[{self._entry_of(i)}]")
                if key is not None:
                    built[key] = cfg
            out.append(cfg)
        return out

    def pool_configs(self) -> list["SimConfig"]:
        """One config per ``cluster.autoscaling`` pool: this one with the pool's replica fields
        (its cluster part a single replica), checked as :meth:`replica_configs` checks a
        fixed replica's override; a bad value raises ValueError naming
        ``cluster.autoscaling.pools[i]``. Empty without autoscaling."""
        auto = self.cluster.autoscaling
        if auto is None:
            return []
        return [self._overridden(pool["overrides"],
                                 f"cluster.autoscaling.pools[{i}] ({pool['name']!r})")
                for i, pool in enumerate(auto.pool_specs())]

    def _check_power_budget(self, pools: list["SimConfig"]) -> None:
        """The starting fleet and every pool's minimum fit ``power_budget_watts``."""
        from simsched.config.autoscaling import initial_pools
        from simsched.cost.power import power_spec

        auto = self.cluster.autoscaling
        where = "cluster.autoscaling.power_budget_watts"
        watts = []
        for i, cfg in enumerate(pools):
            try:
                tdp = power_spec(cfg.hardware.gpu).tdp_watts
            except ValueError as exc:
                raise ValueError(f"{where}: pool {i}: {exc}") from None
            watts.append(tdp * cfg.hardware.tensor_parallel_size)
        specs = auto.pool_specs()
        minimum = sum(p["min_replicas"] * w for p, w in zip(specs, watts))
        start = sum(watts[k] for k in initial_pools(specs, self.cluster.num_replicas))
        need = max(minimum, start)
        if need > auto.power_budget_watts:
            raise ValueError(f"{where} = {auto.power_budget_watts:g} W is below the starting "
                             f"fleet's {need:g} W (cluster.num_replicas and the pools' "
                             "min_replicas at their GPUs' board power)")

    def _overridden(self, changes: Mapping[str, Any], where: str) -> "SimConfig":
        """This config with per-replica ``changes`` (flat or dotted scheduler, cache and
        hardware fields) and a single-replica cluster; each section is rebuilt, so every
        field check runs; a ValueError names ``where``. The one check of a replica's fields:
        fixed replicas' overrides and autoscaling pools both go through it."""
        parts: dict[str, dict[str, Any]] = {p: {} for p in REPLICA_SECTIONS}
        for name, value in changes.items():
            if "." in name:
                section, name = name.split(".", 1)
            else:
                section = next(p for p in REPLICA_SECTIONS if name in
                               {f.name for f in dataclasses.fields(getattr(self, p))})
            parts[section][name] = value
        try:
            # (Faults are the cluster's: a replica's own config has none.)
            return dataclasses.replace(
                self, cluster=ClusterConfig(), faults=FaultsConfig(),
                **{p: dataclasses.replace(getattr(self, p), **c) for p, c in parts.items() if c})
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    def _entry_of(self, replica: int) -> int:
        """Which ``cluster.replicas`` entry replica number ``replica`` comes from."""
        seen = 0
        for i, entry in enumerate(self.cluster.replicas):
            seen += entry.get("count", 1)
            if replica < seen:
                return i
        return len(self.cluster.replicas)

    def replace(self, **changes: Any) -> "SimConfig":
        """Return a copy with fields changed; flat names are routed to the sub-config owning them.

        ``cfg.replace(rate=4, policy="spf", seed=2)`` changes ``workload.rate``,
        ``scheduler.policy`` and ``seed``. Dotted names (``"cache.num_blocks"``) are also accepted
        through ``**{"cache.num_blocks": 512}``.
        """
        top: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {p: {} for p in self._PARTS}
        own = {f.name for f in dataclasses.fields(self)}
        for key, value in changes.items():
            if "." in key:
                part, sub = key.split(".", 1)
                if part not in parts:
                    raise ValueError(f"unknown config section {part!r} in {key!r}")
                parts[part][sub] = value
            elif key in own:
                top[key] = value
            else:
                owners = [p for p in self._PARTS
                          if key in {f.name for f in dataclasses.fields(getattr(self, p))}]
                if not owners:
                    raise ValueError(f"unknown config field {key!r}; known: {sorted(field_names())}")
                parts[owners[0]][key] = value
        for part, sub in parts.items():
            if sub:
                known = {f.name for f in dataclasses.fields(getattr(self, part))}
                bad = set(sub) - known
                if bad:
                    raise ValueError(f"unknown field(s) {sorted(bad)} in config section {part!r}")
                top[part] = dataclasses.replace(top.get(part, getattr(self, part)), **sub)
        return dataclasses.replace(self, **top)

    @classmethod
    def preset(cls, name: str, /, **changes: Any) -> "SimConfig":
        """The default config with engine preset ``name``'s scheduler and cache settings, then
        ``changes`` (flat or dotted names, as :meth:`replace`).

        The defaults already schedule as vLLM V1 does, so ``preset("vllm_v1", **changes)``
        equals ``SimConfig().replace(**changes)``; ``SimConfig.preset("classic", seed=1)`` gives
        the defaults before issue 40 (:mod:`simsched.config.presets`). The limits (budget,
        sequences, blocks) stay the config's.
        """
        from simsched.config.presets import preset_changes

        return cls().replace(**preset_changes(name, changes))

    def to_dict(self) -> dict[str, Any]:
        """This config as JSON data (what a run's ``config.json`` holds, less ``derived``)."""
        return serialize.to_dict(self)

    def to_json(self, indent: int | None = 1) -> str:
        """This config as a JSON document; :meth:`from_json` reads it back equal."""
        return serialize.to_json(self, indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SimConfig":
        """The config of :meth:`to_dict`'s data or of a run's ``config.json`` (its ``derived``
        block skipped); ``SimConfig.from_dict(cfg.to_dict()) == cfg``. Missing sections and
        fields keep their defaults; an unknown one is a ValueError naming it."""
        return serialize.from_dict(cls, data)

    @classmethod
    def from_json(cls, source: str | bytes | os.PathLike) -> "SimConfig":
        """The config of JSON text or of a JSON file (a path: an ``os.PathLike``, or a string
        not starting with ``{``), e.g. the ``config.json`` a run wrote."""
        return serialize.from_json(cls, source)

    def flat(self) -> dict[str, Any]:
        """All fields as one flat mapping (sub-config fields by their own names)."""
        out: dict[str, Any] = {}
        for part in self._PARTS:
            for f in dataclasses.fields(getattr(self, part)):
                out[f.name] = getattr(getattr(self, part), f.name)
        for f in dataclasses.fields(self):
            if f.name not in self._PARTS:
                out[f.name] = getattr(self, f.name)
        return out


def field_names() -> set[str]:
    """Every flat field name :meth:`SimConfig.replace` accepts."""
    names = {f.name for f in dataclasses.fields(SimConfig)} - set(SimConfig._PARTS)
    for cls in (SchedulerConfig, CacheConfig, HardwareConfig, WorkloadConfig, ClusterConfig,
                ClientConfig, FaultsConfig):
        names |= {f.name for f in dataclasses.fields(cls)}
    return names
