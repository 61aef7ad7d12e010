"""Frozen, validated configuration for one simulation run.

A run is described by a :class:`SimConfig` made of five parts: the scheduler, the KV cache, the
hardware (model, GPU, tensor parallelism, cost model), the workload and the cluster (how many
replicas, per-replica overrides, the router and admission control). Every field is checked in
``__post_init__`` and a bad value raises ``ValueError`` naming the field and the allowed range.

Sweeps vary configs with :meth:`SimConfig.replace`, which accepts flat field names (``rate=4.0``,
``policy="spf"``) and routes each to the sub-config that owns it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from simsched.workloads.workload import WorkloadConfig

SCHEDULER_STYLES = ("stall_free", "prefill_first", "static")
PREEMPTION_MODES = ("recompute", "swap")
COST_MODELS = ("calibrated", "linear", "unit")


def _plain(obj) -> None:
    """Turn numpy scalars in ``obj``'s fields into Python ones (sweeps often pass np.int64)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, np.generic):
            object.__setattr__(obj, f.name, value.item())


def _check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


def _check_int(owner: str, name: str, value: Any, low: int, high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{owner}.{name} must be an integer in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{owner}.{name} must be in [{low}, {high}], got {value!r}")


def _check_float(owner: str, name: str, value: Any, low: float, high: float = math.inf,
                 low_open: bool = False, finite: bool = False) -> None:
    bracket = "(" if low_open else "["
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{owner}.{name} must be a number in {bracket}{low}, {high}], "
                         f"got {value!r}")
    bad = value <= low if low_open else value < low
    if bad or value > high:
        raise ValueError(f"{owner}.{name} must be in {bracket}{low}, {high}], got {value!r}")
    if finite and math.isinf(value):
        raise ValueError(f"{owner}.{name} must be finite, got {value!r}")


def _check_choice(owner: str, name: str, value: Any, choices) -> None:
    try:
        known = value in choices
    except TypeError:  # unhashable, e.g. a list
        known = False
    if not known:
        raise ValueError(f"{owner}.{name} must be one of {sorted(choices)}, got {value!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    """How each iteration's batch is formed: style, queue policy, budgets and preemption.

    ``preemption`` enables the admission trigger (preempt running requests that the queue policy
    ranks below the best waiting request when it cannot get KV blocks). Running requests that run
    out of KV blocks are always preempted, as in vLLM; otherwise the engine could deadlock.

    ``admit_after_preemption`` says whether an iteration that preempted a running request for
    lack of KV blocks may still admit waiting (or swap in swapped) requests into the blocks just
    freed. ``False`` (default) is vLLM V1's rule: no admission in a step that preempted, so a
    later arrival cannot take a victim's place. ``True`` is vLLM V0's chunked-prefill scheduler.
    Preemptions made by the admission trigger (``preemption=True``) admit the request they were
    made for either way.
    """

    style: str = "stall_free"
    policy: str = "fcfs"
    victim_policy: str = "fewest_generated"
    preemption: bool = False
    preemption_mode: str = "recompute"
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_num_prefills: int | None = None
    enable_chunked_prefill: bool = True
    max_num_preemptions: int = 8
    admit_after_preemption: bool = False
    policy_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from simsched.policies import QUEUE_POLICIES, VICTIM_POLICIES, make_queue

        _plain(self)
        o = "scheduler"
        _check_choice(o, "style", self.style, SCHEDULER_STYLES)
        _check_choice(o, "policy", self.policy, QUEUE_POLICIES)
        _check_choice(o, "victim_policy", self.victim_policy, VICTIM_POLICIES)
        _check_bool(o, "preemption", self.preemption)
        _check_choice(o, "preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        _check_int(o, "max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _check_int(o, "max_num_seqs", self.max_num_seqs, 1)
        # As vLLM enforces: every running sequence must be able to decode in one iteration.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"{o}.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"{o}.max_num_seqs ({self.max_num_seqs})")
        if self.max_num_prefills is not None:
            _check_int(o, "max_num_prefills", self.max_num_prefills, 1)
        _check_bool(o, "enable_chunked_prefill", self.enable_chunked_prefill)
        _check_int(o, "max_num_preemptions", self.max_num_preemptions, 0)
        _check_bool(o, "admit_after_preemption", self.admit_after_preemption)
        if not isinstance(self.policy_options, Mapping):
            raise ValueError(f"{o}.policy_options must be a mapping, got {self.policy_options!r}")
        try:  # the policy's factory checks its options: fail here, not at the first run
            make_queue(self.policy, self.policy_options)
        except (TypeError, KeyError, ValueError) as exc:
            raise ValueError(f"{o}.policy_options {dict(self.policy_options)!r} are invalid for "
                             f"policy {self.policy!r}: {exc}") from None


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: block size, number of GPU blocks, admission watermark, swap, prefix cache.

    ``num_blocks=None`` derives the block count from the hardware (GPU memory, weights, KV bytes per
    token) as vLLM does; an integer sets it directly. ``enable_prefix_caching`` shares full blocks
    of equal content between requests and keeps released ones cached until their memory is needed
    (vLLM's automatic prefix caching; see :mod:`simsched.engine.prefix_cache`). Off by default:
    results are then exactly those of a cache without sharing.
    """

    block_size: int = 16
    num_blocks: int | None = None
    watermark: float = 0.01
    swap_space_gib: float = 4.0
    swap_bandwidth_gbps: float = 25.0
    enable_prefix_caching: bool = False

    def __post_init__(self) -> None:
        _plain(self)
        o = "cache"
        _check_int(o, "block_size", self.block_size, 1, 4096)
        if self.num_blocks is not None:
            _check_int(o, "num_blocks", self.num_blocks, 1)
        _check_float(o, "watermark", self.watermark, 0.0, 0.5)
        _check_float(o, "swap_space_gib", self.swap_space_gib, 0.0)
        _check_float(o, "swap_bandwidth_gbps", self.swap_bandwidth_gbps, 0.0, low_open=True)
        _check_bool(o, "enable_prefix_caching", self.enable_prefix_caching)


@dataclass(frozen=True)
class HardwareConfig:
    """Which model runs on which GPU, at which tensor-parallel degree, under which cost model.

    ``model`` names a catalog model, or, with ``model_spec`` set, a custom one: ``model_spec``
    (a :class:`~simsched.cost.hardware.ModelSpec`, a mapping of its fields or of a Hugging Face
    ``config.json``, or the path of that file) then defines the model's shape. A config carrying
    its model's shape runs on any executor (spawned worker processes, Ray) with no
    ``register_model`` call there.

    ``engine_overhead`` (calibrated cost model) is what an iteration costs beyond its GPU kernels:
    ``measured_2023`` (default), ``eager_2023``, ``overlapped`` or ``none``.
    """

    model: str = "llama-2-7b"
    gpu: str = "a100-80gb"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    cost_model: str = "calibrated"
    max_model_len: int | None = None
    model_spec: Any = None
    # What an iteration costs beyond GPU kernels (calibrated model only); choices and why
    # measured_2023 is the default: simsched.cost.overhead and docs/cost_model.md.
    engine_overhead: str = "measured_2023"

    def __post_init__(self) -> None:
        from simsched.cost import hardware

        _plain(self)
        o = "hardware"
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"{o}.model must be a non-empty string, got {self.model!r}")
        if self.model_spec is not None:
            object.__setattr__(self, "model_spec", hardware.as_model_spec(self.model_spec))
        _check_int(o, "tensor_parallel_size", self.tensor_parallel_size, 1, 64)
        _check_float(o, "gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0,
                     low_open=True)
        _check_choice(o, "cost_model", self.cost_model, COST_MODELS)
        from simsched.cost.overhead import ENGINE_OVERHEADS

        _check_choice(o, "engine_overhead", self.engine_overhead, ENGINE_OVERHEADS)
        if self.max_model_len is not None:
            _check_int(o, "max_model_len", self.max_model_len, 1)
        hardware.validate(self)
        hardware.max_model_len(self)  # at most the model's context length


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
    router sees is: 0 gives it the exact state, ``t > 0`` a snapshot taken every ``t`` seconds.
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

    def __post_init__(self) -> None:
        _plain(self)
        o = "cluster"
        _check_int(o, "num_replicas", self.num_replicas, 1, 100_000)
        self._check_disagg(o)
        replicas = self.replicas
        if isinstance(replicas, Mapping) or isinstance(replicas, (str, bytes)) \
                or not isinstance(replicas, (tuple, list)):
            raise ValueError(f"{o}.replicas must be a tuple of mappings of per-replica settings, "
                             f"got {replicas!r}")
        known = _replica_fields() | {"count"}
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
            _check_int(where, "count", count, 1, 100_000)
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
        _check_float(o, "refresh_interval", self.refresh_interval, 0.0, finite=True)
        if self.max_num_queued_per_replica is not None:
            _check_int(o, "max_num_queued_per_replica", self.max_num_queued_per_replica, 1)
        if self.rate_limit is not None:
            _check_float(o, "rate_limit", self.rate_limit, 0.0, low_open=True, finite=True)
        if self.burst is not None:
            if self.rate_limit is None:
                raise ValueError(f"{o}.burst needs {o}.rate_limit")
            _check_float(o, "burst", self.burst, 1.0)

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
        _check_int(o, "num_prefill_replicas", self.num_prefill_replicas, 0)
        _check_int(o, "num_decode_replicas", self.num_decode_replicas, 0)
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
            _check_float(o, "link_bandwidth_gbps", self.link_bandwidth_gbps, 0.0, low_open=True,
                         finite=True)
        if self.link_latency is not None:
            _check_float(o, "link_latency", self.link_latency, 0.0, finite=True)
        _check_int(o, "disagg_min_prompt_tokens", self.disagg_min_prompt_tokens, 0)

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


def _replica_fields() -> set[str]:
    return {f.name for cls in (SchedulerConfig, CacheConfig, HardwareConfig)
            for f in dataclasses.fields(cls)}


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
    seed: int = 0
    max_sim_time: float = math.inf
    check_invariants: bool = False

    def __post_init__(self) -> None:
        _plain(self)
        for name, cls in (("scheduler", SchedulerConfig), ("cache", CacheConfig),
                          ("hardware", HardwareConfig), ("workload", WorkloadConfig),
                          ("cluster", ClusterConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"{name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        _check_int("config", "seed", self.seed, 0, 2**63 - 1)
        _check_float("config", "max_sim_time", self.max_sim_time, 0.0, low_open=True)
        _check_bool("config", "check_invariants", self.check_invariants)
        if self.cache.num_blocks is None:
            from simsched.cost import hardware

            # Fail at configuration time, not at the first run, if the weights leave no KV room.
            hardware.kv_capacity_blocks(self.hardware, self.cache.block_size)
        if self.cluster.replicas:
            self.replica_configs()      # every override is valid against these base settings

    _PARTS = ("scheduler", "cache", "hardware", "workload", "cluster")

    def replica_configs(self) -> list["SimConfig"]:
        """One config per replica: this one with the replica's scheduler, cache and hardware.

        The replica configs keep the workload and seed; their cluster part is a single replica.
        An override naming a bad value raises ValueError naming ``cluster.replicas[i]``.
        """
        if not self.cluster.replicas:
            return [self] * self.cluster.num_replicas
        single = ClusterConfig()
        out, built = [], {}
        for i, changes in enumerate(self.cluster.overrides()):
            key = tuple(sorted(changes.items(), key=lambda kv: kv[0]))
            try:
                cfg = built.get(key)
            except TypeError:           # an unhashable value (a dict of policy options)
                cfg, key = None, None
            if cfg is None:
                parts: dict[str, dict[str, Any]] = {p: {} for p in REPLICA_SECTIONS}
                for name, value in changes.items():
                    if "." in name:
                        section, name = name.split(".", 1)
                    else:
                        section = next(p for p in REPLICA_SECTIONS if name in
                                       {f.name for f in dataclasses.fields(getattr(self, p))})
                    parts[section][name] = value
                try:
                    cfg = dataclasses.replace(
                        self, cluster=single,
                        **{p: dataclasses.replace(getattr(self, p), **c)
                           for p, c in parts.items() if c})
                except ValueError as exc:
                    raise ValueError(f"cluster.replicas[{self._entry_of(i)}]: {exc}") from None
                if key is not None:
                    built[key] = cfg
            out.append(cfg)
        return out

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
    for cls in (SchedulerConfig, CacheConfig, HardwareConfig, WorkloadConfig, ClusterConfig):
        names |= {f.name for f in dataclasses.fields(cls)}
    return names
