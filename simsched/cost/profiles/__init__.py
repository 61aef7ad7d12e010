"""Calibration profiles: each measured GPU whose kernel times the cost model is fitted on.

A profile is one module: its :class:`~simsched.cost.fits.ShippedFit` (fit function, data and code
it depends on; coefficients shipped as JSON) and :meth:`CalibrationProfile.build`, which fills a
:class:`~simsched.cost.kernels.KernelTables` for any model, GPU and TP degree from those
coefficients. ``GPUSpec.kernels`` names the profile a GPU uses: its own when measured, the nearest
measured one otherwise (scaled by datasheet peaks). Adding a measured GPU is one new module here,
one line in :data:`PROFILES`, its data under ``cost/data/`` and ``python -m experiments.calibrate
--update``.

Built in: ``a100-80gb`` (Vidur's A100 kernel profiles; also the source of the all-reduce and CPU
fits every GPU uses), ``h200`` (this project's H200 operator profiles; the H100 uses it) and
``aic-<gpu>`` for each GPU with AIConfigurator's measured vLLM kernel tables
(:mod:`simsched.cost.profiles.aiconfigurator`).
"""

from __future__ import annotations

import numpy as np

from simsched.cost import fits


class CalibrationProfile:
    """A measured GPU: its shipped kernel fit and how kernel tables are built from it.

    Subclasses set ``name`` (the anchor name ``GPUSpec.kernels`` refers to), ``description`` and
    ``fit`` and implement :meth:`build`. ``fit`` is None for a profile that reads measured tables
    (interpolating them) and fits nothing.
    """

    name: str = ""
    description: str = ""
    fit: fits.ShippedFit | None = None

    def coefficients(self) -> dict:
        """The shipped coefficients (read once per process)."""
        return fits.coefficients(self.fit.name)

    def build(self, tables, coef: dict, n: np.ndarray) -> None:
        """Set ``tables``' linear, embedding, LM-head and attention arrays (all layers, seconds)
        for token/sequence counts ``n``, from this profile's coefficients ``coef``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<calibration profile {self.name}: {self.description}>"


def _builtin() -> dict[str, CalibrationProfile]:
    from simsched.cost.profiles import a100, aiconfigurator, h200   # one line per measured GPU

    return {p.name: p for p in (a100.PROFILE, h200.PROFILE, *aiconfigurator.profiles())}


PROFILES: dict[str, CalibrationProfile] = _builtin()


def get_profile(name: str) -> CalibrationProfile:
    """The profile named ``name`` (a clear error naming the known ones otherwise)."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"gpu.kernels must name a calibration profile, one of "
                         f"{sorted(PROFILES)}, got {name!r}") from None
