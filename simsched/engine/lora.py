"""Multi-LoRA serving on one replica: adapter residency, the adapter-slot constraint, load and
step costs.

A request names a LoRA adapter by an integer id (``Request.adapter``; -1 is the base model).
Per replica (:class:`~simsched.config.lora.LoRAConfig`):

- :class:`AdapterCache`: ``max_loras`` GPU slots and ``max_cpu_loras`` adapters in host memory,
  each least-recently-used; every adapter starts on disk. Activating an adapter that is not on
  the GPU loads it, from host memory, or from disk through host memory, evicting the least
  recently used adapter that the step does not batch.
- :class:`LoRASlots`: the admission constraint, vLLM's rule that a step batches at most
  ``max_loras`` distinct adapters: a waiting request is admitted if it uses the base model, an
  adapter a running request uses, or one more adapter fits; otherwise it is skipped (vLLM's
  scheduler skips it and goes on down the queue) and keeps its place. Running requests
  (decoders and partial prefills alike) hold their adapter's slot.
- :class:`LoRACost`: the replica's cost model plus, per step, the loads of the step's adapters
  that are not on the GPU (vLLM's worker loads adapters before the forward pass, so the whole
  step waits) and the adapters' compute (see ``LoRAConfig``).

:func:`attach_lora` builds the three for a replica whose config has ``scheduler.lora``; without
it nothing here runs. The KV cache loses the adapters' GPU slots (:func:`lora_kv_blocks`).
"""

from __future__ import annotations

from collections import OrderedDict

from simsched.cost import hardware
from simsched.engine.scheduler.constraints import AdmissionConstraint

GPU, CPU, DISK = "gpu", "cpu", "disk"


def adapter_bytes(hw, lora, rank: int) -> float:
    """Bytes of one rank-``rank`` adapter's weights per GPU (its A and B matrices on each
    targeted projection of every layer, sharded over ``tensor_parallel_size`` GPUs)."""
    spec = hardware.model_spec(hw)
    h, kv = spec.hidden_size, spec.num_kv_heads * spec.head_dim
    widths = 2 * (h + h) + 2 * (h + kv)            # q, o: h -> h; k, v: h -> kv
    if lora.target_modules == "all":
        widths += 3 * (h + spec.intermediate_size)  # gate, up: h -> I; down: I -> h
    return spec.num_layers * rank * widths * spec.bytes_per_param / hw.tensor_parallel_size


def lora_kv_blocks(hw, lora, block_size: int) -> int:
    """KV blocks the adapters' GPU slots take: ``max_loras`` slots of the largest rank."""
    slots = lora.max_loras * adapter_bytes(hw, lora, lora.max_rank)
    per_block = hardware.kv_bytes_per_token(hw) * block_size
    return int(-(-slots // per_block))


def lora_blocks_left(rcfg, num_blocks: int) -> int:
    """The KV blocks of a replica config with ``scheduler.lora`` once the adapters' GPU slots
    are taken from its ``num_blocks``; ValueError if none are left."""
    lora, hw = rcfg.scheduler.lora, rcfg.hardware
    taken = lora_kv_blocks(hw, lora, rcfg.cache.block_size)
    if taken >= num_blocks:
        raise ValueError(f"scheduler.lora: {lora.max_loras} adapter slots of rank {lora.max_rank} "
                         f"take {taken} KV blocks, the cache has {num_blocks}; lower max_loras or "
                         "the ranks")
    return num_blocks - taken


class AdapterCache:
    """Which adapters are on the GPU and in host memory, least recently used first.

    ``gpu`` and ``cpu`` are ordered dicts (keys only) from least to most recently used; the GPU's
    adapters are also in host memory (vLLM keeps its CPU copy). :meth:`activate` makes an adapter
    resident on the GPU and says where it came from. Counters: ``num_loads`` per source,
    ``load_time`` in seconds.
    """

    __slots__ = ("max_loras", "max_cpu_loras", "gpu", "cpu", "num_loads", "load_time",
                 "listener")

    def __init__(self, max_loras: int, max_cpu_loras: int) -> None:
        if max_cpu_loras < max_loras:
            raise ValueError(f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras "
                             f"({max_loras})")
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self.gpu: OrderedDict = OrderedDict()
        self.cpu: OrderedDict = OrderedDict()
        self.num_loads = {CPU: 0, DISK: 0}
        self.load_time = 0.0
        self.listener = None        # called (adapter, on_gpu) when GPU residency changes

    def activate(self, adapter: int, pinned=()) -> str:
        """Make ``adapter`` resident on the GPU (most recently used): returns ``"gpu"`` if it
        was, else ``"cpu"`` or ``"disk"``, where it was loaded from. ``pinned`` adapters (those
        the step batches) are never evicted; more than ``max_loras`` of them is an error."""
        gpu, cpu = self.gpu, self.cpu
        if adapter in gpu:
            gpu.move_to_end(adapter)
            cpu.move_to_end(adapter)
            return GPU
        if len(gpu) >= self.max_loras:
            victim = next((a for a in gpu if a not in pinned), None)
            if victim is None:
                raise RuntimeError(f"adapter {adapter}: all {self.max_loras} GPU slots hold "
                                   "adapters of this step")
            del gpu[victim]
            if self.listener is not None:
                self.listener(victim, False)
        if adapter in cpu:
            source = CPU
            cpu.move_to_end(adapter)
        else:
            source = DISK
            if len(cpu) >= self.max_cpu_loras:
                # The least recently used one not on the GPU (max_cpu_loras >= max_loras and the
                # new adapter is not on the GPU yet, so there is one).
                victim = next(a for a in cpu if a not in gpu)
                del cpu[victim]
            cpu[adapter] = None
        gpu[adapter] = None
        self.num_loads[source] += 1
        if self.listener is not None:
            self.listener(adapter, True)
        return source


class LoRAState:
    """One replica's adapters: the cache, the config's sizes and times, and the adapters the
    running requests use (recomputed when the running set changes)."""

    __slots__ = ("sched", "cfg", "cache", "sizes", "h2d_rate", "disk_rate", "hbm_rate",
                 "active", "_version", "max_rank", "waited")

    def __init__(self, sched, lora, hw) -> None:
        self.sched = sched
        self.cfg = lora
        self.cache = AdapterCache(lora.max_loras, lora.num_cpu_slots)
        # Bytes per adapter, one entry per distinct rank (adapter a: ranks[a % len(ranks)]).
        self.sizes = [adapter_bytes(hw, lora, r) for r in lora.ranks]
        self.h2d_rate = lora.host_to_gpu_gbps * 1e9
        self.disk_rate = lora.disk_gbps * 1e9
        self.hbm_rate = hardware.GPUS[hw.gpu].mem_bandwidth
        self.active: frozenset = frozenset()
        self._version = -1
        self.max_rank = 0
        # Request id -> seconds of adapter loads in the steps that ran its prefill (its TTFT's
        # loading part); only requests that met a load are listed.
        self.waited: dict[int, float] = {}

    def size_of(self, adapter: int) -> float:
        """Bytes of ``adapter``'s weights per GPU."""
        sizes = self.sizes
        return sizes[adapter % len(sizes)]

    def load_time_of(self, adapter: int, source: str) -> float:
        """Seconds to bring ``adapter`` to the GPU from ``source`` (``"cpu"`` or ``"disk"``)."""
        size, lora = self.size_of(adapter), self.cfg
        t = size / self.h2d_rate + lora.load_latency
        if source == DISK:
            t += size / self.disk_rate + lora.disk_latency
        return t

    def running_adapters(self) -> frozenset:
        """The distinct adapters (ids >= 0) of the running requests."""
        sched = self.sched
        if sched.running_version != self._version:
            self._version = sched.running_version
            self.active = frozenset(r.adapter for r in sched.running.values()
                                    if r.adapter >= 0)
        return self.active

    def step_time(self, num_tokens: int) -> float:
        """Seconds the step's adapters add: loads of those not on the GPU, then their compute."""
        active = self.running_adapters()
        if not active:
            return 0.0
        cache, lora = self.cache, self.cfg
        t = lora.step_overhead_time
        max_rank = 0
        loaded = 0.0
        for adapter in sorted(active):     # a fixed order: LRU ties never depend on hashing
            source = cache.activate(adapter, active)
            if source != GPU:
                loaded += self.load_time_of(adapter, source)
            t += self.size_of(adapter) / self.hbm_rate
            rank = lora.rank_of(adapter)
            if rank > max_rank:
                max_rank = rank
        self.max_rank = max_rank
        if loaded:
            cache.load_time += loaded
            # The load delays every prefill of the step (rare steps: a loop over the plan).
            waited = self.waited
            for req, _ in self.sched.planned.values():
                if req.first_token_at != req.first_token_at:     # NaN: before its first token
                    waited[req.id] = waited.get(req.id, 0.0) + loaded
        return t + loaded + lora.time_per_token_rank * num_tokens * max_rank


class LoRASlots(AdmissionConstraint):
    """At most ``max_loras`` distinct adapters among the running requests (vLLM's rule: a step
    batches at most ``max_loras`` adapters). A refused request is skipped, as vLLM's scheduler
    skips it: requests behind it (base-model ones, or of adapters already batched) may be
    admitted in its place, and it keeps its place in the queue. A refusal holds until the
    running set changes."""

    __slots__ = ("state", "max_loras")
    name = "max_loras"
    skips = True        # vLLM skips the request and schedules those behind it

    def __init__(self, state: LoRAState) -> None:
        self.state = state
        self.max_loras = state.cfg.max_loras

    def admits(self, sched, req, need: int) -> bool:
        adapter = req.adapter
        if adapter < 0:
            return True
        active = self.state.running_adapters()
        return adapter in active or len(active) < self.max_loras

    def stamp(self, sched):
        return sched.running_version

    def still_blocked(self, sched, stamp) -> bool:
        return sched.running_version == stamp


class LoRACost:
    """A cost model plus the adapters' loads and compute in each step (:meth:`LoRAState.step_time`).

    Everything else (``breakdown``'s parts, ``output_delay``, ...) is the wrapped model's;
    ``breakdown`` adds a ``lora`` part only when given the step's state."""

    def __init__(self, base, state: LoRAState) -> None:
        self.base = base
        self.state = state

    def iteration_time(self, batch) -> float:
        """The wrapped model's time plus the step's adapter loads and compute."""
        return self.base.iteration_time(batch) + self.state.step_time(batch.num_tokens)

    def __getattr__(self, name):
        return getattr(self.base, name)

    def __repr__(self) -> str:
        return f"LoRACost({self.base!r})"


def attach_lora(replica) -> LoRAState:
    """Give ``replica`` (built from a config with ``scheduler.lora``) its adapters: the slot
    constraint on its scheduler and the adapters' costs around its cost model."""
    config = replica.config
    state = LoRAState(replica.scheduler, config.scheduler.lora, config.hardware)
    replica.scheduler.add_constraint(LoRASlots(state))
    replica.cost_model = LoRACost(replica.cost_model, state)
    return state


def check_adapters(config, frame) -> bool:
    """Whether a request table's ``adapter`` column names adapters (ids >= 0) for ``config`` to
    serve; ValueError if it does and no replica has ``scheduler.lora`` (they would be ignored)."""
    adapters = frame["adapter"]
    if not (adapters.notna() & (adapters.astype(float) >= 0)).any():
        return False
    if not any(c.scheduler.lora is not None for c in config.replica_configs()):
        raise ValueError("requests name LoRA adapters (the adapter column) but scheduler.lora "
                         "is None: set scheduler.lora (a LoRAConfig) to serve them")
    return True


def lora_info(replicas) -> dict:
    """A run's adapter loads over its replicas: counts from host memory and from disk, seconds;
    and ``lora_waited``, request id -> seconds its prefill waited for adapter loads."""
    caches = [r.lora.cache for r in replicas if r.lora is not None]
    return {"lora_waited": {k: v for r in replicas if r.lora is not None
                            for k, v in r.lora.waited.items()},"lora_num_loads_cpu": sum(c.num_loads[CPU] for c in caches),
            "lora_num_loads_disk": sum(c.num_loads[DISK] for c in caches),
            "lora_load_time": sum(c.load_time for c in caches)}
