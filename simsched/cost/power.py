"""GPU power: what one GPU draws during an iteration, from how hard the iteration works it.

The model is a roofline utilisation model. An iteration of duration ``t`` that does ``F``
FLOPs and moves ``B`` bytes on one GPU uses ``c = F / (t * peak_flops)`` of its compute and
``m = B / (t * mem_bandwidth)`` of its memory bandwidth; it draws

    P = TDP * min(1, active_floor + compute_weight * c + memory_weight * m)

while it runs, and ``idle_watts`` between iterations. ``active_floor``, ``compute_weight`` and
``memory_weight`` are fractions of TDP fitted on the measured average power of real serving runs
on DGX-A100 (``experiments/calibrate_power.py``; the fit, its data hash and its
leave-one-configuration-out errors are shipped in ``data/power_fit.json``). Other GPUs use the
same fractions of their own TDP (derived, not measured: :data:`POWER_SPECS` says so per GPU).

A power cap below TDP clips the draw at the cap; a step that would draw more runs slower: the
GPU lowers its clocks, and dynamic power falls roughly with the cube of the clock, so the
step's duration grows by ``(demand_dynamic / cap_dynamic) ** (1/3)`` (dynamic = above the
active floor). See :func:`capped`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

FIT_PATH = Path(__file__).resolve().parent / "data" / "power_fit.json"


@dataclass(frozen=True)
class PowerSpec:
    """One GPU's board power: ``tdp_watts`` (the board limit), ``idle_watts`` (an idle GPU with
    a model loaded), and where the numbers come from."""

    tdp_watts: float
    idle_watts: float
    source: str = "datasheet TDP; idle as nvidia-smi reports it for a loaded, idle GPU"


# Datasheet board power (SXM / OAM unless named); idle power of a loaded idle GPU as commonly
# reported (about 15 % of TDP on HGX parts). Keys are the GPU catalog's names.
POWER_SPECS: dict[str, PowerSpec] = {
    "a100-40gb": PowerSpec(400.0, 55.0),
    "a100-80gb": PowerSpec(400.0, 60.0),
    "h100-sxm": PowerSpec(700.0, 90.0),
    "h100-sxm-pcap": PowerSpec(700.0, 90.0, "datasheet TDP; the measured runs were power-capped"),
    "h200": PowerSpec(700.0, 90.0),
    "l40s": PowerSpec(350.0, 35.0),
    "b200": PowerSpec(1000.0, 140.0),
    "b300": PowerSpec(1100.0, 150.0),
    "gb200": PowerSpec(1200.0, 160.0),
    "gb300": PowerSpec(1400.0, 180.0),
    "rtx-pro-6000": PowerSpec(600.0, 40.0),
}


@dataclass(frozen=True)
class PowerModel:
    """The fitted fractions of TDP (see the module docstring)."""

    active_floor: float
    compute_weight: float
    memory_weight: float

    def fraction(self, compute_util, memory_util) -> np.ndarray:
        """Demanded power as a fraction of TDP (not yet capped: may exceed 1)."""
        return (self.active_floor + self.compute_weight * np.asarray(compute_util, dtype=float)
                + self.memory_weight * np.asarray(memory_util, dtype=float))


@lru_cache(maxsize=1)
def shipped_fit() -> dict:
    """The shipped fit: coefficients, the data's hash and the fit's leave-one-out errors."""
    return json.loads(FIT_PATH.read_text())


def power_model() -> PowerModel:
    """The shipped :class:`PowerModel`."""
    c = shipped_fit()["coefficients"]
    return PowerModel(c["active_floor"], c["compute_weight"], c["memory_weight"])


def power_spec(gpu: str) -> PowerSpec:
    """The :class:`PowerSpec` of a catalog GPU, or a clear error naming the GPU."""
    try:
        return POWER_SPECS[gpu]
    except KeyError:
        raise ValueError(f"no power figures for GPU {gpu!r}; known: {sorted(POWER_SPECS)}") \
            from None


def capped(demand_fraction, cap_fraction: float, floor: float):
    """(drawn fraction, duration factor) of steps demanding ``demand_fraction`` of TDP under a
    cap of ``cap_fraction`` of TDP: the draw is clipped at the cap, and a step over it is slowed
    by the cube root of its dynamic power over the cap's (see the module docstring)."""
    demand = np.asarray(demand_fraction, dtype=float)
    if not floor < cap_fraction:
        raise ValueError(f"a power cap of {cap_fraction:.3g} x TDP is at or below the active "
                         f"floor ({floor:.3g} x TDP): no iteration could run")
    over = demand > cap_fraction
    factor = np.ones_like(demand)
    factor[over] = ((demand[over] - floor) / (cap_fraction - floor)) ** (1.0 / 3.0)
    return np.minimum(demand, cap_fraction), factor
