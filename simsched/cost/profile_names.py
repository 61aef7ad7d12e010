"""Names of the engine profiles that build on another engine's (no imports: the GPU
catalog, :mod:`simsched.cost.hardware`, reads them below the cost models that use them).

:data:`CARRIED`: ``<engine>_silicon`` is ``<engine>``'s profile with vLLM's fitted silicon terms
carried over (:mod:`simsched.cost.engine_profiles`; ``sglang_silicon`` is the ``sglang``
preset's); it reads ``<engine>``'s AIConfigurator tables, and on them leaves the terms out.
"""

from __future__ import annotations

# Profile -> the engine profile it carries vLLM's fitted silicon terms to.
CARRIED: dict[str, str] = {f"{engine}_silicon": engine for engine in ("sglang",)}


# Profiles of vllm_v1's form (simsched.cost.calibrated.VLLM_FORM): their all-reduces below
# 8 MiB are vLLM's custom all-reduce (simsched.cost.vllm_v1.comm_table), the part
# hardware.all_reduce="measured" replaces.
CUSTOM_ALL_REDUCE = frozenset({"vllm_v1", "vllm_silicon", "sglang", "trtllm", *CARRIED})
# hardware.all_reduce: where the custom all-reduce's time comes from.
ALL_REDUCE_CHOICES = {
    "fitted": "latency per call and peer fitted on the vLLM 0.15 runs, plus bytes over NVLink",
    "measured": "AIConfigurator's measured all-reduce per call on this GPU (the faster of "
                "vLLM's custom all-reduce and NCCL), by GPU count and message size",
    "auto": "measured where it can be (a vLLM-form profile on the calibrated model's default "
            "kernels, a GPU with measured all-reduces), else the engine's own: fitted, or the "
            "kernel profile's tables; the sglang and trtllm presets'",
}


def engine_of(profile: str) -> str:
    """The engine profile ``profile`` builds on (itself unless it is one of :data:`CARRIED`):
    whose AIConfigurator tables it reads."""
    return CARRIED.get(profile, profile)
