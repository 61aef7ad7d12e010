"""Energy and power of a run, from its iterations and the GPU power model (simsched.cost.power).

Computed on demand from the result frames, so a run that does not ask for it costs nothing
more. Each iteration's FLOPs (2 x active parameters x tokens, over TP) and bytes (the GPU's
weights plus the KV cache in use) over its duration give its compute and memory utilisation,
and the power model its draw per GPU; between iterations a replica's GPUs draw idle power.

``power_cap_watts`` clips each GPU's draw at the cap and reports, per iteration, how much
longer the step takes at the capped clock (``cap_slowdown``); its joules are the capped power
over the slowed step. The run's own times stay those it was simulated with: the slowdown is
reported, not fed back into the schedule.
A carbon-intensity series (``(time_s, g CO2 per kWh)`` pairs, step-wise from each time; a
number for a constant) turns joules into grams of CO2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simsched.cost import hardware, shapes
from simsched.cost.power import capped, power_model, power_spec


@dataclass(frozen=True)
class Energy:
    """What :func:`energy` returns: ``iterations`` (per iteration: utilisation, power per GPU,
    joules over the replica's GPUs, cap slowdown), ``replicas`` (per replica: busy and idle
    joules, mean and peak power over its GPUs) and ``summary`` (run totals)."""

    iterations: pd.DataFrame
    replicas: pd.DataFrame
    summary: dict


def _replica_hardware(res, num_replicas: int) -> list:
    config = res.config
    try:
        configs = config.replica_configs()
    except Exception:       # autoscaled fleets: every replica runs the base hardware's model
        configs = []
    if len(configs) >= num_replicas:
        return [c.hardware for c in configs[:num_replicas]]
    return [config.hardware] * num_replicas


def _intensity_at(carbon, times: np.ndarray) -> np.ndarray:
    if isinstance(carbon, (int, float)) and not isinstance(carbon, bool):
        return np.full(len(times), float(carbon))
    pairs = np.asarray(carbon, dtype=float)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or not len(pairs):
        raise ValueError("carbon_intensity must be a number (g CO2/kWh) or (time_s, g/kWh) pairs")
    if (np.diff(pairs[:, 0]) <= 0).any():
        raise ValueError("carbon_intensity times must increase")
    k = np.searchsorted(pairs[:, 0], times, side="right") - 1
    return pairs[np.maximum(k, 0), 1]


def energy(res, power_cap_watts: float | None = None, carbon_intensity=None) -> Energy:
    """Energy and power of ``res`` (a :class:`~simsched.analysis.metrics.Results`)."""
    its = res.iterations
    model = power_model()
    reps = res.replicas
    num_replicas = int(reps["replica"].max()) + 1 if reps is not None and len(reps) else 1
    hws = _replica_hardware(res, num_replicas)
    block_size = res.config.cache.block_size
    end = float(res.sim_time)
    replica_col = its["replica"].to_numpy() if len(its) else np.zeros(0, dtype=int)
    tokens = (its["num_prefill_tokens"].to_numpy(dtype=float)
              + its["num_decode_tokens"].to_numpy(dtype=float))
    duration = its["duration"].to_numpy(dtype=float)
    parts, rows = [], []
    for r in range(num_replicas):
        hw = hws[r]
        spec, gpu = hardware.model_spec(hw), hardware.GPUS[hw.gpu]
        pw, tp = power_spec(hw.gpu), hw.tensor_parallel_size
        if power_cap_watts is not None and not 0 < power_cap_watts:
            raise ValueError(f"power_cap_watts must be positive, got {power_cap_watts}")
        cap = min(1.0, power_cap_watts / pw.tdp_watts) if power_cap_watts else 1.0
        mine = replica_col == r
        t = np.maximum(duration[mine], 1e-12)
        counts = shapes.param_counts(spec)
        share = spec.experts_per_token / spec.num_experts if spec.num_experts else 0.0
        active = counts["dense"] + counts["experts"] * share + counts["embedding"] / 2
        flops = 2.0 * active * tokens[mine] / tp
        moved = shapes.weight_bytes(spec, tp) + its["kv_blocks_used"].to_numpy(dtype=float)[mine] \
            * block_size * hardware.kv_bytes_per_token(hw)
        c, m = flops / (t * gpu.peak_flops), moved / (t * gpu.mem_bandwidth)
        drawn, slowdown = capped(model.fraction(c, m), cap, model.active_floor)
        watts = drawn * pw.tdp_watts
        # A step over the cap runs longer at the lower clock, drawing the capped power.
        joules = watts * duration[mine] * slowdown * tp
        busy = float(duration[mine].sum())
        idle = max(end - busy, 0.0)
        idle_joules = idle * pw.idle_watts * tp
        parts.append(pd.DataFrame({"replica": r, "started_at": its["started_at"].to_numpy()[mine],
                                   "duration": duration[mine], "compute_util": c,
                                   "memory_util": m, "power_watts": watts,
                                   "energy_joules": joules, "cap_slowdown": slowdown}))
        total = float(joules.sum()) + idle_joules
        rows.append({"replica": r, "gpu": hw.gpu, "tensor_parallel_size": tp,
                     "busy_energy_joules": float(joules.sum()), "idle_energy_joules": idle_joules,
                     "energy_joules": total,
                     "power_mean_watts": total / end if end > 0 else math.nan,
                     "power_peak_watts": float(watts.max() * tp) if len(watts) else pw.idle_watts * tp,
                     "num_capped_iterations": int((slowdown > 1).sum())})
    per_it = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    per_rep = pd.DataFrame(rows)
    total = float(per_rep["energy_joules"].sum())
    reqs = res.requests
    finished = reqs["status"].to_numpy() == "finished"
    out_tokens = float(reqs["num_generated_tokens"].sum())
    summary = {"energy_joules": total,
               "busy_energy_joules": float(per_rep["busy_energy_joules"].sum()),
               "idle_energy_joules": float(per_rep["idle_energy_joules"].sum()),
               "joules_per_request": total / int(finished.sum()) if finished.any() else math.nan,
               "joules_per_output_token": total / out_tokens if out_tokens else math.nan,
               "power_mean_watts": total / end if end > 0 else math.nan,
               "power_peak_watts": _fleet_peak(per_it, per_rep),
               "num_capped_iterations": int(per_rep["num_capped_iterations"].sum())}
    if carbon_intensity is not None:
        grams = per_it["energy_joules"].to_numpy() / 3.6e6 * _intensity_at(
            carbon_intensity, per_it["started_at"].to_numpy())
        idle_share = per_rep["idle_energy_joules"].sum() / 3.6e6
        summary["co2_grams"] = float(grams.sum() + idle_share * float(np.mean(
            _intensity_at(carbon_intensity, np.linspace(0, end, 64)))))
    return Energy(per_it, per_rep, summary)


def _fleet_peak(per_it: pd.DataFrame, per_rep: pd.DataFrame) -> float:
    """The highest power the whole fleet draws at once (iterations overlap across replicas;
    each replica draws its idle power when it is not running an iteration)."""
    if not len(per_it):
        return float("nan")
    gpus = dict(zip(per_rep["replica"], per_rep["tensor_parallel_size"]))
    idle = {r: power_spec(g).idle_watts * gpus[r] for r, g in zip(per_rep["replica"], per_rep["gpu"])}
    start = per_it["started_at"].to_numpy()
    stop = start + per_it["duration"].to_numpy()
    extra = per_it["power_watts"].to_numpy() * per_it["replica"].map(gpus).to_numpy() \
        - per_it["replica"].map(idle).to_numpy()
    times = np.concatenate([start, stop])
    delta = np.concatenate([extra, -extra])
    order = np.lexsort((delta, times))      # at a shared instant, ends before starts
    return float(sum(idle.values()) + max(0.0, np.cumsum(delta[order]).max()))
