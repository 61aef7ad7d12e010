"""Which serving engine's scheduler a replica runs (``scheduler.engine``) and its own options.

Three engines, each scheduling as the real one does (the schedulers:
:mod:`simsched.engine.engines`):

* ``vllm`` (default): vLLM V1's scheduler (:mod:`simsched.engine.scheduler.core`); results are
  exactly those before ``engine`` existed.
* ``sglang``: SGLang 0.5.9's ``Scheduler.get_next_batch_to_run`` with its ``PrefillAdder``,
  ``SchedulePolicy``, token-granular ``RadixCache`` and decode retraction.
* ``trtllm``: TensorRT-LLM 1.x's PyTorch-executor batch scheduler: a capacity scheduler
  (``GUARANTEED_NO_EVICT`` or ``MAX_UTILIZATION``) then a micro-batch scheduler
  (``max_batch_size``, ``max_num_tokens``, chunked context), with block reuse.

The shared fields keep their meaning and map onto each engine's flags: ``max_num_batched_tokens``
is SGLang's ``--chunked-prefill-size`` (with ``enable_chunked_prefill``; off is ``-1``) and
TensorRT-LLM's ``max_num_tokens``; ``max_num_seqs`` is SGLang's ``--max-running-requests`` cap
and TensorRT-LLM's ``max_batch_size``; ``cache.block_size`` is SGLang's ``--page-size`` and
TensorRT-LLM's ``tokens_per_block``; ``cache.enable_prefix_caching`` is SGLang's radix cache
(``--disable-radix-cache`` when off) and TensorRT-LLM's ``enable_block_reuse``.
``scheduler.engine_options`` holds what has no shared field (:data:`ENGINE_OPTIONS`: name ->
default, per engine). :meth:`simsched.config.SimConfig.preset` ``("sglang")`` and
``("trtllm")`` set every field to that engine's defaults (:mod:`simsched.config.presets`).
"""

from __future__ import annotations

from typing import Any, Mapping

ENGINES = ("vllm", "sglang", "trtllm")

SGLANG_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof")
TRTLLM_CAPACITY_POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION")

# Option -> default. SGLang 0.5.9: server_args.py (ServerArgs) and environ.py (the SGLANG_*
# environment defaults). TensorRT-LLM 1.x: tensorrt_llm/llmapi/llm_args.py (SchedulerConfig).
ENGINE_OPTIONS: dict[str, dict[str, Any]] = {
    "vllm": {},
    "sglang": {
        "schedule_policy": "fcfs",              # ServerArgs.schedule_policy
        "max_prefill_tokens": 16384,            # ServerArgs.max_prefill_tokens
        "schedule_conservativeness": 1.0,       # ServerArgs.schedule_conservativeness
        "init_new_token_ratio": 0.7,            # SGLANG_INIT_NEW_TOKEN_RATIO
        "min_new_token_ratio_factor": 0.14,     # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
        "new_token_ratio_decay_steps": 600,     # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
        "retract_decode_steps": 20,             # SGLANG_RETRACT_DECODE_STEPS
        "clip_max_new_tokens": 4096,            # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
        "in_batch_prefix_threshold": 32,        # IN_BATCH_PREFIX_CACHING_{CHECK,DEPRIORITIZE}_THRESHOLD
        "lpm_max_queue": 128,                   # SchedulePolicy._determine_active_policy
        "enable_mixed_chunk": False,            # ServerArgs.enable_mixed_chunk
    },
    "trtllm": {
        "capacity_scheduler_policy": "GUARANTEED_NO_EVICT",   # SchedulerConfig default
        # attention_dp_config (AttentionDpConfig): with attention DP, hold context requests
        # back until every rank has one (simsched.engine.engines.trtllm_adp).
        "attention_dp_enable_balance": False,   # AttentionDpConfig.enable_balance
        "attention_dp_timeout_iters": 50,       # AttentionDpConfig.timeout_iters
        "attention_dp_batching_wait_iters": 10,  # AttentionDpConfig.batching_wait_iters
    },
}

_INTS = {"max_prefill_tokens": 1, "new_token_ratio_decay_steps": 1, "retract_decode_steps": 0,
         "clip_max_new_tokens": 1, "in_batch_prefix_threshold": -1, "lpm_max_queue": 0,
         "attention_dp_timeout_iters": 0, "attention_dp_batching_wait_iters": 0}
_FLOATS = {"schedule_conservativeness": (0.0, 100.0), "init_new_token_ratio": (0.0, 1.0),
           "min_new_token_ratio_factor": (0.0, 1.0)}
_BOOLS = ("enable_mixed_chunk", "attention_dp_enable_balance")
_CHOICES = {"schedule_policy": SGLANG_POLICIES,
            "capacity_scheduler_policy": TRTLLM_CAPACITY_POLICIES}


def engine_options(engine: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``engine``'s options: its defaults updated by ``options`` (each checked; a bad name or
    value raises ValueError naming ``scheduler.engine_options``)."""
    where = "scheduler.engine_options"
    if engine not in ENGINE_OPTIONS:
        raise ValueError(f"scheduler.engine must be one of {list(ENGINES)}, got {engine!r}")
    if not isinstance(options, Mapping):
        raise ValueError(f"{where} must be a mapping, got {options!r}")
    known = ENGINE_OPTIONS[engine]
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown} for engine {engine!r}; "
                         f"known: {sorted(known)}")
    out = dict(known)
    for name, value in options.items():
        if name in _INTS:
            if isinstance(value, bool) or not isinstance(value, int) or value < _INTS[name]:
                raise ValueError(f"{where}.{name} must be an integer >= {_INTS[name]}, "
                                 f"got {value!r}")
        elif name in _FLOATS:
            low, high = _FLOATS[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not low <= value <= high:
                raise ValueError(f"{where}.{name} must be a number in [{low}, {high}], "
                                 f"got {value!r}")
            value = float(value)
        elif name in _BOOLS and not isinstance(value, bool):
            raise ValueError(f"{where}.{name} must be true or false, got {value!r}")
        elif name in _CHOICES and value not in _CHOICES[name]:
            raise ValueError(f"{where}.{name} must be one of {list(_CHOICES[name])}, "
                             f"got {value!r}")
        out[name] = value
    return out


def check_engine(sched) -> None:
    """The scheduler fields engine ``sched.engine`` cannot honour raise ValueError (a feature
    modelled for vLLM only, asked of another engine)."""
    engine = sched.engine
    if engine == "vllm":
        if sched.engine_options:
            raise ValueError("scheduler.engine_options are for engine 'sglang' or 'trtllm' "
                             f"(engine 'vllm' has none), got {dict(sched.engine_options)!r}")
        return
    unsupported = []
    if sched.style != "stall_free":
        unsupported.append(f"style={sched.style!r}")
    if sched.policy != "fcfs":
        unsupported.append(f"policy={sched.policy!r} (SGLang orders its queue by "
                           "engine_options.schedule_policy; TensorRT-LLM by arrival)")
    if sched.preemption_mode != "recompute":
        unsupported.append(f"preemption_mode={sched.preemption_mode!r}")
    if sched.preemption:
        unsupported.append("preemption=True")
    if sched.plan_ahead:
        unsupported.append("plan_ahead (vLLM's AsyncScheduler decisions; async_scheduling=True "
                           "models this engine's overlap scheduler)")
    if sched.lora is not None:
        unsupported.append("lora")
    if sched.speculative is not None:
        unsupported.append("speculative")
    if sched.max_num_prefills is not None:
        unsupported.append("max_num_prefills")
    if unsupported:
        raise ValueError(f"scheduler.engine={engine!r} does not model "
                         f"{', '.join(unsupported)}: these are vLLM's (engine='vllm')")
