"""Multi-LoRA serving: adapter slots, residency, load times and the adapters' step cost.

:class:`LoRAConfig` is ``scheduler.lora`` (None: no adapters, the default). Requests name their
adapter by an integer id (``Request.adapter``, -1 for the base model), drawn by the workload
(``workload.num_adapters``, ``workload.adapter_zipf``) or read from a table's ``adapter``
column. What each field does is modelled in :mod:`simsched.engine.lora`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simsched.config.checks import as_part, check_choice, check_float, check_int, plain

# Which projections of each layer carry LoRA weights: the attention ones (q, k, v, o: what PEFT
# and most published adapters target) or also the MLP's (gate, up, down).
TARGET_MODULES = ("attention", "all")


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters served on top of the base model, per replica (vLLM's LoRA engine args).

    ``max_loras``: adapters resident on the GPU at once, and (vLLM's rule) the most distinct
    adapters one step may batch; ``max_cpu_loras``: adapters kept in host memory (None: as many
    as ``max_loras``; at least ``max_loras``). Residency is least-recently-used on both levels.
    ``ranks``: adapter ``a`` has rank ``ranks[a % len(ranks)]``; its size follows from the
    model's shapes, the rank and ``target_modules``. The GPU keeps ``max_loras`` slots of the
    largest rank (vLLM preallocates them), taken from the KV cache.

    Loading an adapter that is not on the GPU: from host memory ``size / host_to_gpu_gbps +
    load_latency``; from disk (not in host memory either) ``size / disk_gbps + disk_latency``
    first. Loads run inside the step that first batches the adapter, as vLLM's worker loads
    adapters before the forward pass: the whole step waits.

    Step cost while any adapter is batched (added to the cost model's time): ``step_overhead_time``
    (the extra shrink/expand kernel launches; an assumption, not a measurement) plus, per
    distinct adapter in the step, its weights read once from HBM (size / the GPU's memory
    bandwidth), plus ``time_per_token_rank`` x tokens in the step x the largest rank in the step
    (vLLM's kernels pad every adapter to the largest rank).
    """

    max_loras: int = 1
    max_cpu_loras: int | None = None
    ranks: tuple = (16,)
    target_modules: str = "attention"
    host_to_gpu_gbps: float = 25.0
    load_latency: float = 1e-3
    disk_gbps: float = 2.0
    disk_latency: float = 10e-3
    step_overhead_time: float = 3e-4
    time_per_token_rank: float = 0.0

    def __post_init__(self) -> None:
        plain(self)
        o = "scheduler.lora"
        check_int(o, "max_loras", self.max_loras, 1)
        if self.max_cpu_loras is not None:
            check_int(o, "max_cpu_loras", self.max_cpu_loras, self.max_loras)
        ranks = self.ranks
        if isinstance(ranks, int) and not isinstance(ranks, bool):
            ranks = (ranks,)
        if not isinstance(ranks, (tuple, list)) or not ranks:
            raise ValueError(f"{o}.ranks must be a non-empty tuple of ranks, got {self.ranks!r}")
        for r in ranks:
            check_int(o, "ranks[]", r, 1, 1024)
        object.__setattr__(self, "ranks", tuple(int(r) for r in ranks))
        check_choice(o, "target_modules", self.target_modules, TARGET_MODULES)
        for name in ("host_to_gpu_gbps", "disk_gbps"):
            check_float(o, name, getattr(self, name), 0.0, low_open=True, finite=True)
        for name in ("load_latency", "disk_latency", "step_overhead_time",
                     "time_per_token_rank"):
            check_float(o, name, getattr(self, name), 0.0, finite=True)

    @property
    def num_cpu_slots(self) -> int:
        """Adapters host memory keeps (``max_cpu_loras``, or ``max_loras`` when None)."""
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras

    @property
    def max_rank(self) -> int:
        """The largest adapter rank (the size of a GPU slot)."""
        return max(self.ranks)

    def rank_of(self, adapter: int) -> int:
        """Adapter ``adapter``'s rank."""
        return self.ranks[adapter % len(self.ranks)]


def as_lora_config(value: Any) -> LoRAConfig | None:
    """``value`` (None, a LoRAConfig, or a mapping of its fields: JSON and ``--set``) as a
    LoRAConfig or None; anything else raises ValueError naming ``scheduler.lora``."""
    return as_part(value, LoRAConfig, "scheduler.lora")
