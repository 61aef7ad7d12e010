"""The per-replica config sections: scheduler, KV cache and hardware."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from simsched.config.checks import check_bool, check_choice, check_float, check_int, plain
from simsched.config.kv_tiers import KVTiersConfig, as_tiers
from simsched.config.lora import LoRAConfig, as_lora_config
from simsched.config.speculative import check_speculative
from simsched.cost.factory import COST_MODELS

SCHEDULER_STYLES = ("stall_free", "prefill_first", "static")
PREEMPTION_MODES = ("recompute", "swap")
PREFIX_HIT_RULES = ("token", "block")
PREFIX_CACHE_MODELS = ("segments", "blocks")


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

    ``async_scheduling``: vLLM V1's one-step pipeline (it plans step k + 1 while step k runs).
    ``None`` (default) follows the engine profile of the cost model that runs: on for the
    calibrated cost model's ``vllm_v1`` engine overhead (the default), off otherwise (and for a
    cost model given to ``simulate`` without one, e.g. ``UnitCostModel``). With engine
    ``sglang`` or ``trtllm`` it is their overlap scheduler (SGLang's ``event_loop_overlap``,
    TensorRT-LLM's overlap executor loop: step k + 1 is formed before step k's results and new
    requests are taken in), which the replica models by the arrival rule below: ``None`` follows
    the profile (on for ``sglang``, ``sglang_silicon`` and ``trtllm``, as both engines run it by
    default), ``False`` is their ``--disable-overlap-schedule`` / ``disable_overlap_scheduler``.
    ``plan_ahead`` says how that pipeline is modelled. ``None`` (default) plans ahead exactly
    when the replica schedules asynchronously (``async_scheduling``, or the profile): the
    decisions of vLLM V1's ``AsyncScheduler`` (the next batch is planned while the current one
    runs, so a plan does not see the requests that arrived since the previous plan, and a
    request finishing in the running batch keeps its blocks and sequence slot through that plan;
    a plan that schedules nothing is made again at once with both known). Iteration times are
    unchanged: it changes decisions, not timing. ``True`` plans ahead whatever the profile says;
    ``False`` never does: an asynchronous replica then models the pipeline by its arrival rule
    only (an iteration's plan sees only the requests that arrived before the previous iteration
    started; :mod:`simsched.engine.replica`), the default before issue 40 (the ``classic``
    preset). Setting ``plan_ahead=True`` with ``async_scheduling=True`` is refused (one model of
    when an arrival becomes visible, not two); speculative decoding is not modelled with plan
    ahead, so ``None`` resolves to ``False`` there. :func:`simsched.config.pipeline.plan_ahead`
    resolves it.
    ``reserve_full_isl`` (vLLM V1's ``scheduler_reserve_full_isl``, on by default there and here)
    admits a request only when the blocks of its whole prompt are free, though a chunked prefill
    takes only its first chunk's now; ``False`` checks the first chunk's blocks only.
    ``victim_policy`` (default ``"vllm_v1"``: vLLM's own victim, the newest running request, or
    under ``policy="priority"`` the least urgent, latest arrival) picks whom to preempt.
    ``max_num_preemptions`` caps the preemptions of one iteration (default: no cap, as vLLM).
    The defaults are vLLM V1's decisions (docs/vllm_v1.md, "Defaults");
    :meth:`~simsched.config.SimConfig.preset` ``("classic")`` gives the defaults before issue 40.
    ``lora``: LoRA adapters (:class:`~simsched.config.lora.LoRAConfig`; None, the default, serves
    the base model only).
    ``speculative`` (a :class:`~simsched.config.speculative.SpeculativeConfig` or a mapping of
    its fields; None is off) turns on speculative decoding.
    ``engine`` (default ``"vllm"``) picks whose scheduler runs: ``"vllm"``, ``"sglang"`` or
    ``"trtllm"`` (:mod:`simsched.config.engines`: how the shared fields map onto each engine's
    flags); ``engine_options`` holds the engine's own options (SGLang's ``schedule_policy``,
    ``new_token_ratio`` terms..., TensorRT-LLM's ``capacity_scheduler_policy``), each checked.
    ``SimConfig.preset("sglang")`` / ``("trtllm")`` give the engines' own defaults.
    """

    style: str = "stall_free"
    policy: str = "fcfs"
    victim_policy: str = "vllm_v1"
    preemption: bool = False
    preemption_mode: str = "recompute"
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_num_prefills: int | None = None
    enable_chunked_prefill: bool = True
    # vLLM caps nothing: an int no count reaches.
    max_num_preemptions: int = sys.maxsize
    admit_after_preemption: bool = False
    reserve_full_isl: bool = True
    plan_ahead: bool | None = None
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    async_scheduling: bool | None = None
    lora: LoRAConfig | None = None
    speculative: Any = None
    # Whose scheduler runs (simsched.config.engines): vLLM's by default.
    engine: str = "vllm"
    engine_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from simsched.config.engines import ENGINES, check_engine, engine_options
        from simsched.policies import QUEUE_POLICIES, VICTIM_POLICIES, make_queue

        plain(self)
        o = "scheduler"
        check_choice(o, "style", self.style, SCHEDULER_STYLES)
        check_choice(o, "policy", self.policy, QUEUE_POLICIES)
        check_choice(o, "victim_policy", self.victim_policy, VICTIM_POLICIES)
        check_bool(o, "preemption", self.preemption)
        check_choice(o, "preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        check_int(o, "max_num_batched_tokens", self.max_num_batched_tokens, 1)
        check_int(o, "max_num_seqs", self.max_num_seqs, 1)
        # As vLLM enforces: every running sequence must be able to decode in one iteration.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"{o}.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"{o}.max_num_seqs ({self.max_num_seqs})")
        if self.max_num_prefills is not None:
            check_int(o, "max_num_prefills", self.max_num_prefills, 1)
        check_bool(o, "enable_chunked_prefill", self.enable_chunked_prefill)
        check_int(o, "max_num_preemptions", self.max_num_preemptions, 0)
        check_bool(o, "admit_after_preemption", self.admit_after_preemption)
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise ValueError(f"{o}.async_scheduling must be True, False or None (as the engine "
                             f"profile does), got {self.async_scheduling!r}")
        check_bool(o, "reserve_full_isl", self.reserve_full_isl)
        if self.plan_ahead is not None and not isinstance(self.plan_ahead, bool):
            raise ValueError(f"{o}.plan_ahead must be True, False or None (plan ahead when the "
                             f"replica schedules asynchronously), got {self.plan_ahead!r}")
        if self.plan_ahead and self.async_scheduling:
            raise ValueError(f"{o}.plan_ahead and {o}.async_scheduling both model vLLM's async "
                             "pipeline (plan_ahead its exact decisions, async_scheduling only when "
                             "an arrival becomes visible): set one, not both")
        if not isinstance(self.policy_options, Mapping):
            raise ValueError(f"{o}.policy_options must be a mapping, got {self.policy_options!r}")
        try:  # the policy's factory checks its options: fail here, not at the first run
            make_queue(self.policy, self.policy_options)
        except (TypeError, KeyError, ValueError) as exc:
            raise ValueError(f"{o}.policy_options {dict(self.policy_options)!r} are invalid for "
                             f"policy {self.policy!r}: {exc}") from None
        if self.lora is not None:
            object.__setattr__(self, "lora", as_lora_config(self.lora))
            if self.preemption_mode == "swap":
                # A swapped-in request rejoins the batch without asking the adapter slots.
                raise ValueError(f"{o}.lora does not support {o}.preemption_mode='swap' "
                                 "(use 'recompute')")
        if self.speculative is not None:
            object.__setattr__(self, "speculative", check_speculative(self))
        check_choice(o, "engine", self.engine, ENGINES)
        check_engine(self)
        engine_options(self.engine, self.engine_options)    # names and values, or ValueError


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: block size, number of GPU blocks, admission watermark, swap, prefix cache.

    ``num_blocks=None`` derives the block count from the hardware (GPU memory, weights, KV bytes per
    token) as vLLM does; an integer sets it directly. ``enable_prefix_caching`` shares full blocks
    of equal content between requests and keeps released ones cached until their memory is needed
    (vLLM's automatic prefix caching; see :mod:`simsched.engine.kv.prefix_cache`). Off by default:
    results are then exactly those of a cache without sharing.

    ``watermark`` (default 0.0, as vLLM V1, which holds no blocks back at admission) is the share
    of blocks admissions leave free.
    ``prefix_hit_rule`` says how much of a fully cached prompt is served from the cache:
    ``"block"`` (default; vLLM V1's rule) all but the last token rounded down to whole blocks,
    so a block-aligned prompt recomputes its whole last block; ``"token"`` all but its last token.
    ``watermark_counts_null_block`` (default True) rounds the watermark as vLLM does: its pool
    holds one more block than it can give out (the reserved null block), so it holds back
    ``int(watermark * (num_blocks + 1))`` blocks rather than ``int(watermark * num_blocks)``.
    ``prefix_cache_model`` picks the prefix cache's model: ``"blocks"`` (default; vLLM V1's
    block pool block by block: a block a request recomputes is its own copy even when an
    identical one is cached, as in vLLM; see :mod:`simsched.engine.kv.block_pool`) or
    ``"segments"`` (one shared copy of each block, tracked per prompt segment, fast at any
    scale; what KV tiers need). The defaults are vLLM V1's; ``SimConfig.preset("classic")``
    gives those before issue 40 (0.01, ``"token"``, False, ``"segments"``).
    ``kv_tiers`` (a :class:`~simsched.config.kv_tiers.KVTiersConfig`, default None: off) keeps
    blocks evicted from the GPU in CPU memory, on disk or in a remote store and loads them back
    on a hit (:mod:`simsched.engine.kv.tiers`); it needs prefix caching (segments model).
    """

    block_size: int = 16
    num_blocks: int | None = None
    watermark: float = 0.0
    swap_space_gib: float = 4.0
    swap_bandwidth_gbps: float = 25.0
    enable_prefix_caching: bool = False
    prefix_hit_rule: str = "block"
    watermark_counts_null_block: bool = True
    prefix_cache_model: str = "blocks"
    # Tiers below the GPU for evicted prefix blocks (simsched.config.kv_tiers); None: GPU only.
    kv_tiers: KVTiersConfig | Mapping | None = None

    def __post_init__(self) -> None:
        plain(self)
        o = "cache"
        check_int(o, "block_size", self.block_size, 1, 4096)
        if self.num_blocks is not None:
            check_int(o, "num_blocks", self.num_blocks, 1)
        check_float(o, "watermark", self.watermark, 0.0, 0.5)
        check_float(o, "swap_space_gib", self.swap_space_gib, 0.0)
        check_float(o, "swap_bandwidth_gbps", self.swap_bandwidth_gbps, 0.0, low_open=True)
        check_bool(o, "enable_prefix_caching", self.enable_prefix_caching)
        check_choice(o, "prefix_hit_rule", self.prefix_hit_rule, PREFIX_HIT_RULES)
        check_bool(o, "watermark_counts_null_block", self.watermark_counts_null_block)
        check_choice(o, "prefix_cache_model", self.prefix_cache_model, PREFIX_CACHE_MODELS)
        if self.kv_tiers is not None:
            object.__setattr__(self, "kv_tiers", as_tiers(self.kv_tiers))
            if not self.enable_prefix_caching or self.prefix_cache_model != "segments":
                raise ValueError(f"{o}.kv_tiers needs {o}.enable_prefix_caching=True and "
                                 f"{o}.prefix_cache_model='segments' (tiers hold evicted "
                                 "prefix blocks of the segments model)")


@dataclass(frozen=True)
class HardwareConfig:
    """Which model runs on which GPU, at which tensor-parallel degree, under which cost model.

    ``model`` names a catalog model, or, with ``model_spec`` set, a custom one: ``model_spec``
    (a :class:`~simsched.cost.specs.ModelSpec`, a mapping of its fields or of a Hugging Face
    ``config.json``, or the path of that file) then defines the model's shape. A config carrying
    its model's shape runs on any executor (spawned worker processes, Ray) with no
    ``register_model`` call there.

    ``engine_overhead`` (calibrated cost model) is what an iteration costs beyond its GPU kernels:
    ``vllm_silicon`` (default: a current vLLM V1 deployment, also async scheduling and a
    client-side output delay, with prefill, all-reduce and fused-MoE terms fitted on current
    deployments), ``vllm_v1`` (the same without those terms, the default before them),
    ``measured_2023`` (the default before vllm_v1), ``eager_2023``, ``overlapped``, ``none``, or
    another engine's (``sglang``, ``sglang_silicon``, ``trtllm``).

    ``parallel``: pipeline, data-parallel-attention and expert parallelism of the replica (a
    :class:`~simsched.config.parallel.ParallelConfig` or a mapping of its fields; None, the
    default: tensor parallelism only).

    ``kernel_profile``: None (default: the GPU's own kernel source, see
    :func:`simsched.cost.hardware.describe`) or ``"aiconfigurator"`` (that GPU's measured
    AIConfigurator vLLM kernel tables; the B200, B300, GB200, GB300 and RTX Pro 6000 use them
    already).

    ``all_reduce``: ``"fitted"`` (default: vLLM's custom all-reduce timed by a latency per call
    and peer fitted on the vLLM 0.15 runs, plus the bytes over NVLink) or ``"measured"``
    (AIConfigurator's measured all-reduce per call on this GPU, by GPU count and message size,
    for messages below vLLM's 8 MiB custom all-reduce limit; the vLLM-form engine profiles on the
    default kernels; docs/validation_silicon.md has its figures) or ``"auto"`` (measured where
    ``"measured"`` would be accepted, else fitted; the ``sglang`` and ``trtllm`` presets': their
    engines' own custom all-reduce kernels are not the one the fitted term was fitted on).

    ``profile``: None (default: the shipped coefficients) or the path of a calibrated
    deployment profile (a JSON file ``simsched calibrate`` writes, :mod:`simsched.cost.deployment`):
    the shipped model corrected by terms fitted to measured runs of this GPU (docs/calibration.md).
    """

    model: str = "llama-2-7b"
    gpu: str = "a100-80gb"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    cost_model: str = "calibrated"
    max_model_len: int | None = None
    model_spec: Any = None
    # What an iteration costs beyond GPU kernels (calibrated model only); choices and why
    # vllm_silicon is the default: simsched.cost.overhead and docs/cost_model.md.
    engine_overhead: str = "vllm_silicon"
    # Pipeline / data-parallel-attention / expert parallelism: simsched.config.parallel (None:
    # tensor parallelism only).
    parallel: Any = None
    # Where kernel times come from: None, the GPU's catalog default (GPUSpec.kernels), or
    # "aiconfigurator", the GPU's measured AIConfigurator vLLM tables (docs/gpus.md).
    kernel_profile: str | None = None
    # Where the custom all-reduce's time comes from (vLLM-form engine profiles): "fitted" (a
    # latency term fitted on the vLLM 0.15 runs), "measured" (AIConfigurator's tables) or "auto".
    all_reduce: str = "fitted"
    # A calibrated deployment profile's path (simsched calibrate; None: the shipped fits).
    profile: str | None = None

    def __post_init__(self) -> None:
        from simsched.config.parallel import as_parallel, check_layout
        from simsched.cost import hardware

        plain(self)
        o = "hardware"
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"{o}.model must be a non-empty string, got {self.model!r}")
        if self.model_spec is not None:
            object.__setattr__(self, "model_spec", hardware.as_model_spec(self.model_spec))
        check_int(o, "tensor_parallel_size", self.tensor_parallel_size, 1, 64)
        check_float(o, "gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0,
                     low_open=True)
        check_choice(o, "cost_model", self.cost_model, COST_MODELS)
        from simsched.cost.overhead import ENGINE_OVERHEADS

        check_choice(o, "engine_overhead", self.engine_overhead, ENGINE_OVERHEADS)
        if self.max_model_len is not None:
            check_int(o, "max_model_len", self.max_model_len, 1)
        hardware.validate(self)
        hardware.max_model_len(self)  # at most the model's context length
        if isinstance(self.profile, os.PathLike):
            object.__setattr__(self, "profile", os.fspath(self.profile))
        if self.profile is not None:
            if not isinstance(self.profile, str) or not self.profile:
                raise ValueError(f"{o}.profile must be the path of a calibrated profile (a "
                                 f"string) or None, got {self.profile!r}")
            if self.cost_model != "calibrated":
                raise ValueError(f"{o}.profile corrects the calibrated cost model; "
                                 f"{o}.cost_model is {self.cost_model!r}")
            from simsched.cost import deployment

            deployment.check_for(self.profile, self.gpu, self.engine_overhead, f"{o}.profile")
        object.__setattr__(self, "parallel", as_parallel(self.parallel))
        if self.parallel is not None:
            check_layout(self.parallel, hardware.model_spec(self), self.tensor_parallel_size,
                         self.model)


def replica_fields() -> set[str]:
    """The field names a per-replica override may set (scheduler, cache and hardware fields)."""
    return {f.name for cls in (SchedulerConfig, CacheConfig, HardwareConfig)
            for f in dataclasses.fields(cls)}
