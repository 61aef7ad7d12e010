"""Engine profiles of SGLang and TensorRT-LLM: what each adds around the GPU kernels per step.

Both engines, like vLLM V1, replay CUDA graphs for decode-sized steps and hide the scheduler's
CPU work behind the GPU (SGLang's overlap scheduler, ``event_loop_overlap``, on by default since
0.4; TensorRT-LLM's PyTorch executor overlap scheduler, on by default in 1.x), use a custom
all-reduce for small messages on NVLink, and stream tokens through a separate output path
(SGLang: the detokenizer process over ZeroMQ; TensorRT-LLM: the LLM API's post-processing
workers). So each profile takes the ``vllm_v1`` form (:mod:`simsched.cost.vllm_v1`):

    max(G + L x kernel_per_layer + s x V x sampler_per_logit, cpu(s)) + step_gap

and a client-side ``output_delay``, without vLLM's async plan-ahead (each engine's scheduler
makes its own decisions: :mod:`simsched.engine.engines`).

What is measured and what is assumed: the GPU kernel times are simsched's calibrated kernels
by default, the same for every engine; with ``hardware.kernel_profile="aiconfigurator"`` each
engine reads its own measured kernels where AIConfigurator has them (SGLang 0.5.9's and
TensorRT-LLM 1.2.0rc5's GEMM, attention, all-reduce and fused-MoE tables on the H100 and H200:
profiles ``aic-sglang-<gpu>``, ``aic-trtllm-<gpu>``; vLLM's tables elsewhere), the all-reduce
then being the engine's measured one. ``step_gap`` is measured (the H200 whole-step profile, as
for ``vllm_v1``). The per-layer, sampler, all-reduce and output terms are vLLM 0.15's fitted ones
(data/fits/engine-vllm-v1.json), **assumed** to carry over. ``experiments.engine_silicon``
checks what fitting one of them per engine on the SGLang and TensorRT-LLM silicon rows would
give, leaving one (GPU, model) group out: no such term reaches the error targets there, so none
is shipped (docs/engines.md). :data:`OVERRIDES` is where a fit per engine goes.

:data:`CARRIED` (named in :mod:`simsched.cost.profile_names`): ``sglang_silicon``, the
``sglang`` preset's profile, is SGLang's profile with vLLM's prefill, all-reduce and fused-MoE
terms fitted on vLLM's silicon rows (:mod:`simsched.cost.vllm_silicon`) carried over unchanged,
as vLLM's default ``vllm_silicon`` carries them; on AIConfigurator's tables it leaves them out,
as ``vllm_silicon`` does (:func:`simsched.cost.calibrated.profile_terms`). SGLang's fused MoE is
the same Triton kernel family as vLLM's, which is what the expert terms correct; fitted on
vLLM's rows only, so SGLang's rows judge it held out (``python -m experiments.terms_transfer``).
TensorRT-LLM runs its own MoE kernels, and there the carried terms make TTFT worse, so it has no
such profile.
"""

from __future__ import annotations

from simsched.cost.profile_names import CARRIED, engine_of  # noqa: F401  (re-exported)

# Engine -> term -> value (seconds) replacing the vllm_v1 term; empty: all assumed equal.
OVERRIDES: dict[str, dict[str, float]] = {"sglang": {}, "trtllm": {}}

DESCRIPTIONS = {
    "sglang": "SGLang 0.5.9 (overlap scheduler, CUDA graphs, custom all-reduce, detokenizer "
              "output path); vllm_v1's host and output terms, assumed",
    "trtllm": "TensorRT-LLM 1.x PyTorch executor (overlap scheduler, CUDA graphs, custom "
              "all-reduce); vllm_v1's host and output terms, assumed",
    "sglang_silicon": "SGLang 0.5.9 with vLLM's fitted silicon terms (prefill, all-reduce, "
                      "fused MoE: the same Triton kernels) carried over; the sglang preset's",
}


def terms(engine: str) -> dict:
    """The terms of ``engine``'s profile (as :func:`simsched.cost.vllm_v1.terms` gives)."""
    from simsched.cost import vllm_v1

    out = dict(vllm_v1.terms())
    out.update(OVERRIDES[engine])
    return out


def with_silicon_terms(engine: str) -> dict:
    """``engine``'s terms with vLLM's fitted silicon terms
    (:func:`simsched.cost.vllm_silicon.fitted`) on top."""
    from simsched.cost import vllm_silicon

    return {**terms(engine), **vllm_silicon.fitted()}


def carried_terms(profile: str) -> dict:
    """The terms of a profile of :data:`CARRIED`: its engine's, with vLLM's silicon terms."""
    return with_silicon_terms(CARRIED[profile])
