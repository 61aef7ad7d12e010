"""Engine overhead: what an iteration costs beyond its GPU kernels, as a named choice.

``hardware.engine_overhead`` picks one of :data:`ENGINE_OVERHEADS`. With G the iteration's GPU
kernel time (:mod:`simsched.cost.kernels`) and ``s`` its number of sequences:

* ``measured_2023``: ``G + cpu(s)``, where ``cpu(s) = a + a_tp [TP > 1] + b s`` is the
  CPU work of vLLM (2023) that does not overlap the GPU (schedule, prepare inputs, sampler, output
  processing), fitted on Vidur's CPU-overhead profile; 0.84 ms + 0.042 ms per sequence at TP 1.
* ``eager_2023``: a 2023 engine end to end, as measured on DGX-A100 and DGX-H100 machines
  (the bundled real-serving runs): ``max(G + X, F) + C`` with the fitted whole-iteration terms of
  :mod:`simsched.cost.serving` (collective synchronisation X, host launch floor F, serial CPU C).
* ``overlapped``: a current engine that prepares the next step while the GPU runs the current one:
  ``max(G, cpu(s)) + gap``; ``gap`` is what a CUDA-graph step still costs on the host (replay,
  copy of the sampled ids, synchronise) beyond its GPU time, measured on the H200 (0.1 ms).
* ``none``: ``G``, pure GPU time (an upper bound on speed).
* ``vllm_v1``: a current vLLM V1 deployment (:mod:`simsched.cost.vllm_v1`):
  CUDA-graph steps (``max(G, cpu(s)) + gap`` as ``overlapped``), vLLM's custom all-reduce
  instead of NCCL for messages up to 8 MiB, per-layer kernels and sampling the operator
  profiles miss, and a client-side ``output_delay``; the engine also schedules asynchronously
  (one-step pipeline, ``scheduler.async_scheduling``), and results report client-side token
  times. Fitted on real vLLM 0.15 serving runs (H100, TP 1-4).
* ``vllm_silicon`` (default): ``vllm_v1`` with five prefill, all-reduce and fused-MoE terms
  fitted on AIConfigurator's H100/H200 vLLM rows (:mod:`simsched.cost.vllm_silicon`): a
  fine-grained MoE model's routed experts take longer than the dense GEMM model of them, and the
  all-reduces above vLLM's custom all-reduce limit less than NCCL's tables. Dense models at
  TP 1 time as under ``vllm_v1``, bit for bit.

Why ``vllm_silicon`` is the default: it models the engine people deploy now, validated end to end
against it. The ``vllm_v1`` terms come from 13 real vLLM 0.15 serving runs (H100, TP 1-4, seven
dense models; each left out of the fit in turn, median TTFT, ITL and E2E errors of a few percent:
docs/vllm_v1.md), and the silicon terms, which leave those runs where they were, from the
1k-8k-token prompts, MoE models and TP 1-8 layouts of the silicon rows (each (GPU, model) group
left out in turn: docs/validation_silicon.md). The GPU kernel times are the calibrated model's,
as with every other choice. Choose ``vllm_v1`` to reproduce results from before the silicon terms
were the default, ``measured_2023`` (the default until the vllm_v1 profile existed) for vLLM
2023's CPU steps, ``eager_2023`` to compare with a 2023 eager-mode engine at TP > 1 (validated
against real DGX runs of one), ``overlapped`` for another current engine.
"""

from __future__ import annotations

import functools

import numpy as np

from simsched.cost import calibration_h200 as h200

ENGINE_OVERHEADS: dict[str, str] = {
    "measured_2023": "GPU + CPU steps of vLLM (2023) per iteration (Vidur profile)",
    "eager_2023": "max(GPU + collective sync, host launch floor) + serial CPU, fitted on "
                  "real DGX-A100/DGX-H100 serving runs",
    "overlapped": "max(GPU, CPU steps) + a fixed host gap (CPU work hidden behind the GPU)",
    "none": "GPU time only",
    "vllm_v1": "vLLM V1 with CUDA graphs, custom all-reduce, async scheduling and a client-side "
               "output delay, fitted on real vLLM 0.15 H100 serving runs",
    "vllm_silicon": "vllm_v1 with the prefill, all-reduce and fused-MoE terms fitted on "
                    "AIConfigurator's H100/H200 vLLM rows (simsched.cost.vllm_silicon); default",
    # The other engines' profiles (simsched.cost.engine_profiles).
    "sglang": "SGLang 0.5.9: vllm_v1's form without vLLM's async pipeline (terms assumed)",
    "trtllm": "TensorRT-LLM 1.x: vllm_v1's form without vLLM's async pipeline (terms assumed)",
    "sglang_silicon": "sglang with vllm_silicon's fitted terms carried over (same Triton fused "
                      "MoE; simsched.cost.engine_profiles); the sglang preset's",
}
# Engine profiles whose engine schedules asynchronously unless scheduler.async_scheduling says.
ASYNC_SCHEDULING = frozenset({"vllm_v1", "vllm_silicon"})
# Profiles under which SGLang and TensorRT-LLM run their overlap schedulers (on by default in
# both engines: SGLang's event_loop_overlap, TensorRT-LLM's overlap executor loop).
OVERLAP_SCHEDULING = ASYNC_SCHEDULING | {"sglang", "sglang_silicon", "trtllm"}
DEFAULT_ENGINE_OVERHEAD = "vllm_silicon"


def check(name: str) -> None:
    """Raise ValueError unless ``name`` is a known engine overhead choice."""
    if name not in ENGINE_OVERHEADS:
        raise ValueError(f"hardware.engine_overhead must be one of {sorted(ENGINE_OVERHEADS)}, "
                         f"got {name!r}")


def async_scheduling(config, cost_model) -> bool:
    """Whether a replica of ``config`` (a ``SimConfig``) timed by ``cost_model`` schedules
    asynchronously: ``scheduler.async_scheduling`` if set, else whether ``cost_model`` is a
    calibrated model whose engine overhead is one of :data:`ASYNC_SCHEDULING`.

    The engine profile is the cost model's that runs, not the config's: a cost model given to
    ``simulate`` (e.g. ``UnitCostModel``) replaces the config's, and like its output delay, its
    scheduling follows it (synchronous unless asked). Off under ``scheduler.plan_ahead``, which
    models the same pipeline's decisions exactly (what a plan sees and frees; docs/parity.md):
    one rule for when an arrival becomes visible, not two.
    """
    if config.scheduler.plan_ahead or config.scheduler.engine != "vllm":
        return False            # vLLM's pipeline only (another engine's: overlap_scheduling)
    return _pipelined(config, cost_model, ASYNC_SCHEDULING)


def _pipelined(config, cost_model, profiles: frozenset) -> bool:
    """``scheduler.async_scheduling`` if set, else whether ``cost_model``'s engine overhead is
    one of ``profiles``."""
    flag = config.scheduler.async_scheduling
    if flag is not None:
        return flag
    return getattr(cost_model, "engine_overhead", None) in profiles


def overlap_scheduling(config, cost_model) -> bool:
    """Whether a replica of an SGLang or TensorRT-LLM ``config`` timed by ``cost_model`` runs
    its engine's overlap scheduler: ``scheduler.async_scheduling`` if set, else whether
    ``cost_model``'s engine overhead is one of :data:`OVERLAP_SCHEDULING` (the engines'
    profiles: on, as in both real engines; a cost model without a profile, such as
    ``UnitCostModel``: off unless asked)."""
    return _pipelined(config, cost_model, OVERLAP_SCHEDULING)


@functools.lru_cache(maxsize=None)
def overlapped_gap() -> float:
    """Seconds a CUDA-graph decode step costs on the host beyond its GPU time (median over the
    measured batch sizes of round trip minus GPU time, H200, ``h200/iteration.csv``)."""
    it = h200.load("iteration")
    return float(np.median(it.graph_roundtrip_ms - it.graph_gpu_ms) * 1e-3)
