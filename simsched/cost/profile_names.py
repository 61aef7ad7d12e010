"""Names of the engine profiles that build on another engine's (no imports: the GPU
catalog, :mod:`simsched.cost.hardware`, reads them below the cost models that use them).

:data:`CARRIED`: ``<engine>_silicon`` is ``<engine>``'s profile with vLLM's fitted silicon terms
carried over (:mod:`simsched.cost.engine_profiles`; ``sglang_silicon`` is the ``sglang``
preset's); it reads ``<engine>``'s AIConfigurator tables, and on them leaves the terms out.
"""

from __future__ import annotations

# Profile -> the engine profile it carries vLLM's fitted silicon terms to.
CARRIED: dict[str, str] = {f"{engine}_silicon": engine for engine in ("sglang",)}


def engine_of(profile: str) -> str:
    """The engine profile ``profile`` builds on (itself unless it is one of :data:`CARRIED`):
    whose AIConfigurator tables it reads."""
    return CARRIED.get(profile, profile)
