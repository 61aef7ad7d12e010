"""Deployment planning: the cheapest cluster that meets a latency target for a workload and rate.

For each candidate deployment (GPU type x tensor parallelism x router x scheduler settings, with a
range of replica counts) and each arrival rate, :func:`plan` finds the fewest replicas at which the
target holds (an :class:`~simsched.analysis.capacity.SLOTarget`, judged on the mean over seeds, as
the capacity search judges a rate), then prices it: GPU-hours per million requests
(replicas x GPUs per replica x 10^6 / rate / 3600) times the GPU's hourly price. The search per
candidate walks the rates in increasing order and starts each from the previous rate's answer, so
more load never gets fewer replicas; within a rate it doubles the count until the target holds and
then bisects (assuming, as queueing does, that more replicas never hurt). Every probe is one
simulation, run on the chosen executor (local processes, serial or Ray); each round runs one probe
per candidate still searching.

A deployment must serve the whole workload: a probe that rejects any request fails, whatever its
latencies. A request the candidate can never serve (longer than its model's context or KV cache)
makes the candidate infeasible at every replica count, so its search stops at once with status
``rejects``; requests shed by admission control only fail the probe (more replicas shed fewer).
The table reports ``num_rejected`` and one warning names the candidates that reject requests.

With ``ensemble=N`` (each candidate's config with ``hardware.profile``, a calibrated profile of
its GPU) every probe runs N coefficient sets drawn from the profile, each with its own seed, in
place of seeds; the target is judged on the mean over the draws, and the table carries each
latency metric ``m`` as ``m`` (that mean), ``m_lo`` and ``m_hi`` (its prediction interval at
``confidence``, :mod:`simsched.analysis.ensemble`), drawn as error bars by :meth:`PlanResult.plot`.

Prices are configurable; :data:`GPU_PRICES` holds defaults in US dollars per GPU-hour, an
assumption modelled on 2024 on-demand list prices of GPU clouds (e.g. Lambda: A100-40GB $1.29,
A100-80GB SXM $1.79, H100 SXM $2.99). The H200 and L40S entries are estimates. Pass your own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import pandas as pd

from simsched.analysis.capacity import SLOTarget, run_probes
from simsched.analysis.executors import Job
from simsched.analysis.ensemble import draw_columns, interval_columns
from simsched.analysis.plan_search import (ReplicaSearch, candidate_draws, probe_holds,
                                           warn_rejections)
from simsched.analysis.slo import SLO
from simsched.config import SimConfig, field_names
from simsched.workloads.workload import WorkloadConfig

GPU_PRICES: dict[str, float] = {      # US$ per GPU-hour (assumed; see the module docstring)
    "a100-40gb": 1.29, "a100-80gb": 1.79, "h100-sxm": 2.99, "h200": 3.79, "l40s": 1.19,
}
# With a plain SLO as the target, this share of requests must meet it (DistServe's choice).
DEFAULT_ATTAINMENT = 0.9
MAX_ROUNDS = 200


@dataclass(frozen=True)
class Candidate:
    """A deployment family: GPU, tensor parallelism, router and settings; replicas searched.

    ``settings`` holds other config changes every replica gets (``max_num_seqs``,
    ``max_num_batched_tokens``, ``policy``, ``model``, ...). ``min_replicas`` and
    ``max_replicas`` bound the search. ``label`` names the candidate in tables (default: built
    from the fields).
    """

    gpu: str = "a100-80gb"
    tensor_parallel_size: int = 1
    router: str = "jsq"
    min_replicas: int = 1
    max_replicas: int = 16
    settings: Mapping[str, Any] = field(default_factory=dict)
    label: str | None = None

    def __post_init__(self) -> None:
        for name in ("min_replicas", "max_replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"candidate.{name} must be an integer >= 1, got {value!r}")
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"candidate.max_replicas ({self.max_replicas}) must be >= "
                             f"min_replicas ({self.min_replicas})")
        if not isinstance(self.settings, Mapping):
            raise ValueError(f"candidate.settings must be a mapping, got {self.settings!r}")
        for key in self.settings:
            if key.split(".", 1)[-1] not in field_names():
                raise ValueError(f"candidate.settings has unknown config field {key!r}")
            if key.split(".", 1)[-1] in ("num_replicas", "rate", "seed"):
                raise ValueError(f"candidate.settings may not set {key!r}: the planner does")
        if self.label is None:
            extra = "".join(f" {k}={v}" for k, v in self.settings.items())
            object.__setattr__(self, "label", f"{self.gpu} tp{self.tensor_parallel_size} "
                                              f"{self.router}{extra}")

    @property
    def changes(self) -> dict[str, Any]:
        """The config changes this candidate makes (replica count and rate aside)."""
        return {"gpu": self.gpu, "tensor_parallel_size": self.tensor_parallel_size,
                "router": self.router, **self.settings}

    def config(self, base: SimConfig, num_replicas: int, rate: float, seed: int) -> SimConfig:
        """The config of this candidate with ``num_replicas`` replicas at ``rate``."""
        return base.replace(**self.changes, num_replicas=num_replicas, rate=rate, seed=seed)


class PlanResult:
    """The outcome of :func:`plan`: ``table`` (one row per candidate and rate, cheapest first
    within a rate, ``pareto`` marking the cost/p99-TTFT front) and ``runs`` (every probe)."""

    def __init__(self, table: pd.DataFrame, runs: pd.DataFrame,
                 configs: dict[tuple[str, float], SimConfig]) -> None:
        self.table = table
        self.runs = runs
        self._configs = configs

    def best(self, rate: float | None = None) -> pd.Series:
        """The cheapest feasible deployment at ``rate`` (the only rate if there is one)."""
        rows = self.table[self.table["status"] == "ok"]
        if rate is None:
            if self.table["rate"].nunique() != 1:
                raise ValueError("several rates were planned: say which with rate=")
        else:
            rows = rows[rows["rate"] == rate]
        if not len(rows):
            raise ValueError(f"no candidate meets the target at rate {rate}")
        return rows.sort_values(["cost_per_million", "num_gpus"]).iloc[0]

    def config(self, label: str, rate: float, seed: int = 0) -> SimConfig:
        """The chosen config of candidate ``label`` at ``rate`` (to re-run or inspect)."""
        try:
            return self._configs[(label, rate)].replace(seed=seed)
        except KeyError:
            raise ValueError(f"no feasible deployment for {label!r} at rate {rate}") from None

    def plot(self, path=None, ax=None, dpi: int = 90):
        """Cost per million requests against p99 TTFT, one panel per rate, Pareto front drawn.

        One colour per candidate (legend), each point labelled with its replica count; an
        ensemble plan's p99-TTFT prediction intervals are horizontal error bars. Returns
        the matplotlib ``Figure``; draws into ``ax`` (one Axes per rate) if given and saves to
        ``path`` if given.
        """
        from simsched.analysis.plots import _figure, _finish

        ok = self.table[self.table["status"] == "ok"]
        rates = sorted(ok["rate"].unique()) or [math.nan]
        cols = min(len(rates), 2)
        rows_n = math.ceil(len(rates) / cols)
        fig, axes = _figure(ax, len(rates), (5.2 * cols, 3.6 * rows_n), nrows=rows_n, ncols=cols)
        labels = list(dict.fromkeys(self.table["label"]))
        colours = {label: f"C{i % 10}" for i, label in enumerate(labels)}
        markers = {label: "osD^v<>"[i // 10 % 7] for i, label in enumerate(labels)}
        for ax_, rate in zip(axes, rates):
            rows = ok[ok["rate"] == rate]
            for _, row in rows.iterrows():
                ax_.scatter(row["ttft_p99"], row["cost_per_million"], s=28,
                            color=colours[row["label"]], marker=markers[row["label"]],
                            label=row["label"])
                if "ttft_p99_lo" in row:
                    ax_.errorbar(row["ttft_p99"], row["cost_per_million"], fmt="none",
                                 xerr=[[row["ttft_p99"] - row["ttft_p99_lo"]],
                                       [row["ttft_p99_hi"] - row["ttft_p99"]]],
                                 ecolor=colours[row["label"]], alpha=0.6, lw=1, capsize=2)
                ax_.annotate(f"x{int(row['num_replicas'])}",
                             (row["ttft_p99"], row["cost_per_million"]), fontsize=7,
                             xytext=(3, 2), textcoords="offset points")
            front = rows[rows["pareto"]].sort_values("ttft_p99")
            ax_.step(front["ttft_p99"], front["cost_per_million"], where="post", color="black",
                     linewidth=0.8)
            bars = "; bars: prediction intervals" if "ttft_p99_lo" in rows else ""
            ax_.set_title(f"{rate:g} req/s (black: Pareto front; xN: replicas{bars})", fontsize=8)
            ax_.set_xlabel("p99 TTFT (s)")
            ax_.set_ylabel("$ per million requests")
            ax_.grid(alpha=0.3)
        if ax is not None:
            axes[0].legend(fontsize=6)
            return _finish(fig, path, dpi, layout=False)
        for spare in fig.axes[len(rates):]:
            spare.axis("off")
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=colours[label], marker=markers[label], linestyle="",
                          label=label) for label in labels]
        fig.legend(handles=handles, loc="lower center", ncol=min(4, len(labels)), fontsize=7,
                   frameon=False)
        fig.tight_layout(rect=(0, 0.04 * (1 + (len(labels) - 1) // 4), 1, 1))
        return _finish(fig, path, dpi, layout=False)

    def __repr__(self) -> str:
        return f"PlanResult({len(self.table)} rows, {len(self.runs)} runs)"


def _target(slo) -> SLOTarget:
    if isinstance(slo, SLOTarget):
        return slo
    if isinstance(slo, SLO):
        return SLOTarget(slo=slo, min_attainment=DEFAULT_ATTAINMENT)
    if isinstance(slo, Mapping):
        return SLOTarget(limits=slo)
    raise ValueError(f"slo must be an SLOTarget, an SLO or a mapping of metric to limit, "
                     f"got {slo!r}")


def _candidates(candidates) -> list[Candidate]:
    if isinstance(candidates, (Candidate, Mapping)):
        candidates = [candidates]
    out = []
    for i, c in enumerate(candidates):
        if isinstance(c, Mapping):
            c = candidate_from_mapping(c, f"candidates[{i}]")
        elif not isinstance(c, Candidate):
            raise ValueError(f"candidates[{i}] must be a Candidate or a mapping, got {c!r}")
        out.append(c)
    labels = [c.label for c in out]
    if not out or len(set(labels)) != len(labels):
        raise ValueError(f"candidates must be non-empty with distinct labels, got {labels}")
    return out


def candidate_from_mapping(data: Mapping[str, Any], where: str = "candidate") -> Candidate:
    """A :class:`Candidate` from a flat mapping (TOML ``[[candidates]]``): known keys are the
    candidate's fields (``tp`` for ``tensor_parallel_size``), any other key a config setting."""
    data = dict(data)
    if "tp" in data:
        data["tensor_parallel_size"] = data.pop("tp")
    own = {"gpu", "tensor_parallel_size", "router", "min_replicas", "max_replicas", "label"}
    settings = dict(data.pop("settings", {}))
    settings.update({k: data.pop(k) for k in list(data) if k not in own})
    try:
        return Candidate(settings=settings, **data)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def plan(workload: WorkloadConfig | str, slo, candidates: Iterable,
         rates: Iterable[float] | None = None, base_config: SimConfig | None = None,
         prices: Mapping[str, float] | None = None, seeds: Iterable[int] = (0,),
         executor: str = "local", max_workers: int | None = None, progress: bool = False,
         ray_address: str | None = None, ensemble: int | None = None,
         confidence: float = 0.9) -> PlanResult:
    """For each candidate and rate, the fewest replicas meeting ``slo`` and their cost.

    ``workload`` is a :class:`WorkloadConfig` or a preset name (``"azure-conv"``); ``rates``
    (requests/s) default to the workload's own rate. ``slo`` is an :class:`SLOTarget`, a mapping
    of metric limits (``{"ttft_p99": 2.0, "tpot_p99": 0.2}``) or an :class:`SLO` (then at least
    90 % of requests must meet it). ``candidates`` are :class:`Candidate` objects or mappings of
    their fields. ``base_config`` supplies everything else (model, cache, scheduler defaults);
    ``prices`` updates :data:`GPU_PRICES` (US$ per GPU-hour). A run that cannot finish its
    requests (``max_sim_time`` reached) fails the target, as in the capacity search, and so does
    one that rejects any request: a candidate that can never serve some request (longer than its
    model's context or KV cache) gets status ``rejects`` and one warning says which and why; fit
    such requests with the workload's ``long_prompt_policy`` (``clip``, ``drop``) or plan a model
    with a longer context.

    The table has one row per candidate and rate: ``status`` (``ok``, ``infeasible`` up to
    ``max_replicas``, ``rejects``), ``num_replicas``, ``num_gpus``, ``gpu_hours_per_million``,
    ``price_per_gpu_hour``, ``cost_per_million``, latency metrics (means over seeds),
    ``num_rejected`` (mean over seeds at the count chosen, or at the last count probed when none
    meets the target) and ``pareto``. ``ensemble`` (N >= 2, one seed) runs each probe with N
    coefficient sets drawn from the candidate's calibrated profile and adds ``m_lo``/``m_hi``
    prediction intervals and ``num_draws`` (see the module docstring).
    """
    target = _target(slo)
    cands = _candidates(candidates)
    if isinstance(workload, str):
        workload = WorkloadConfig.preset(workload)
    if not isinstance(workload, WorkloadConfig):
        raise ValueError(f"workload must be a WorkloadConfig or a preset name, got {workload!r}")
    base = (base_config or SimConfig()).replace(workload=workload)
    rates = sorted({float(r) for r in (rates if rates is not None else [workload.rate])})
    if not rates or any(not (r > 0 and math.isfinite(r)) for r in rates):
        raise ValueError(f"rates must be finite numbers > 0, got {rates}")
    seeds = tuple(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    table_prices = {**GPU_PRICES, **dict(prices or {})}
    for c in cands:
        price = table_prices.get(c.gpu)
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not price >= 0:
            raise ValueError(f"prices has no valid price for GPU {c.gpu!r} (US$ per GPU-hour), "
                             f"got {price!r}")
        c.config(base, c.min_replicas, rates[0], seeds[0])     # bad settings fail here
    draws = candidate_draws(cands, base, rates[0], seeds, ensemble, confidence)
    if draws is not None:
        seeds = tuple(seed for seed, _ in next(iter(draws.values()))[0])
    searches = [ReplicaSearch(c, rates) for c in cands]
    cache: dict[tuple, dict] = {}
    notes: dict[tuple, str] = {}
    for _ in range(MAX_ROUNDS):
        live = [s for s in searches if s.probe is not None and s.k < len(rates)]
        if not live:
            break
        keys = sorted({(s.candidate.label, s.rate, s.probe, seed) for s in live
                       for seed in seeds} - set(cache), key=str)
        by_label = {c.label: c for c in cands}
        jobs = [Job(by_label[label].config(base, n, rate, seed), target.slo, keep_frames=False,
                    terms=None if draws is None else dict(draws[label][0])[seed])
                for label, rate, n, seed in keys]
        run_probes(keys, jobs, cache, notes=notes, executor=executor, max_workers=max_workers,
                   progress=progress, ray_address=ray_address, desc="plan")
        for s in live:
            rows = pd.DataFrame([cache[(s.candidate.label, s.rate, s.probe, seed)]
                                 for seed in seeds])
            unservable = (rows["num_rejected"] - rows.get("num_shed", 0)) > 0
            s.update(probe_holds(target, rows), rejects=bool(unservable.any()))
    warn_rejections(searches, notes, seeds)
    return _result(searches, cache, target, base, seeds, table_prices, draws, confidence)


def _result(searches, cache, target, base, seeds, prices, draws=None,
            confidence=0.9) -> PlanResult:
    rows, configs = [], {}
    metrics = ("ttft_p50", "ttft_p99", "tpot_p99", "e2el_p99", "request_throughput",
               "slo_attainment", "load_imbalance")
    for s in searches:
        c = s.candidate
        for rate in s.rates:
            n = s.answers.get(rate)
            row: dict[str, Any] = {"rate": rate, "label": c.label, "gpu": c.gpu,
                                   "tensor_parallel_size": c.tensor_parallel_size,
                                   "router": c.router,
                                   "status": s.statuses.get(rate, "infeasible"),
                                   "num_replicas": n if n else math.nan}
            if n:
                runs = pd.DataFrame([cache[(c.label, rate, n, seed)] for seed in seeds])
                gpus = n * c.tensor_parallel_size
                hours = gpus * 1e6 / rate / 3600
                # An ensemble's metrics come with their intervals, each next to its metric.
                values = {m: runs[m].mean() for m in metrics if m in runs} if draws is None \
                    else interval_columns(runs[[m for m in metrics if m in runs]],
                                          draws[c.label][1].discrepancy, confidence)
                row.update(num_gpus=gpus, gpu_hours_per_million=hours,
                           price_per_gpu_hour=prices[c.gpu],
                           cost_per_million=hours * prices[c.gpu], **values)
                configs[(c.label, rate)] = c.config(base, n, rate, seeds[0])
            else:
                ends = ("",) if draws is None else ("", "_lo", "_hi")
                row.update(num_gpus=math.nan, gpu_hours_per_million=math.nan,
                           price_per_gpu_hour=prices[c.gpu], cost_per_million=math.nan,
                           **{m + e: math.nan for m in metrics for e in ends},
                           **({} if draws is None else {"num_draws": 0}))
            probed = n or s.last.get(rate)
            row["num_rejected"] = (
                pd.Series([cache[(c.label, rate, probed, seed)]["num_rejected"]
                           for seed in seeds]).mean() if probed else math.nan)
            rows.append(row)
    table = pd.DataFrame(rows).sort_values(["rate", "cost_per_million", "num_gpus", "label"],
                                           na_position="last", kind="stable")
    table["pareto"] = _pareto(table)
    runs = pd.DataFrame([{"label": label, "rate": rate, "num_replicas": n, "seed": seed,
                          **({} if draws is None else draw_columns(draws[label][0], seed)),
                          "holds": probe_holds(target, pd.DataFrame([row])), **row}
                         for (label, rate, n, seed), row in sorted(cache.items(), key=str)])
    return PlanResult(table.reset_index(drop=True), runs, configs)


def _pareto(table: pd.DataFrame) -> pd.Series:
    """Feasible rows no other row of the same rate beats on both cost and p99 TTFT."""
    front = pd.Series(False, index=table.index)
    ok = table[table["status"] == "ok"]
    for _, rows in ok.groupby("rate"):
        for i, row in rows.iterrows():
            dominated = ((rows["cost_per_million"] <= row["cost_per_million"])
                         & (rows["ttft_p99"] <= row["ttft_p99"])
                         & ((rows["cost_per_million"] < row["cost_per_million"])
                            | (rows["ttft_p99"] < row["ttft_p99"]))).any()
            front[i] = not dominated
    return front


PLAN_SECTIONS = ("plan", "target", "prices", "candidates")


def plan_from_toml(data: Mapping[str, Any], slo: Mapping[str, float]) -> dict[str, Any]:
    """:func:`plan` keyword arguments from a plan file's own sections (see ``simsched plan``).

    ``[plan]`` holds ``rates``, ``seeds`` and optionally ``ensemble`` and ``confidence``; ``[target]`` metric limits and optionally
    ``min_attainment`` (of the ``[slo]`` bounds, given here as ``slo``); ``[prices]`` US$ per
    GPU-hour by GPU; ``[[candidates]]`` one table per candidate.
    """
    section = dict(data.get("plan", {}))
    unknown = set(section) - {"rates", "seeds", "ensemble", "confidence"}
    if unknown:
        raise ValueError(f"[plan] has unknown key(s) {sorted(unknown)}; known: rates, seeds, "
                         "ensemble, confidence")
    limits = dict(data.get("target", {}))
    attainment = limits.pop("min_attainment", None)
    slo_obj = SLO(**slo) if slo else None
    if not limits and attainment is None and slo_obj is not None:
        attainment = DEFAULT_ATTAINMENT
    target = SLOTarget(limits=limits, slo=slo_obj, min_attainment=attainment)
    raw = data.get("candidates")
    if not raw:
        raise ValueError("a plan needs at least one [[candidates]] table")
    return {"slo": target, "rates": section.get("rates"), "seeds": section.get("seeds", (0,)),
            "ensemble": section.get("ensemble"), "confidence": section.get("confidence", 0.9),
            "prices": dict(data.get("prices", {})),
            "candidates": [candidate_from_mapping(c, f"[[candidates]] {i + 1}")
                           for i, c in enumerate(raw)]}
