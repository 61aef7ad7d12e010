"""Sim-to-real on current deployments: AIConfigurator's silicon rows (H100/H200) reproduced.

    python -m experiments.validate_silicon [--quick] [--engine vllm] [--data CSV] [--rows N]
                                           [--out DIR] [--img DIR]

Every row of ``../shared/data/real-serving/silicon/hopper.csv`` (read its README) served by an
engine simsched models (``--engine``; :data:`ENGINES` maps an engine name to its recipes, so the
SGLang and TensorRT-LLM rows are added by registering theirs) is rebuilt as it was measured.
``--data`` reads any file of the same columns: a row on any GPU with AIConfigurator tables
(:data:`GPUS`: the Blackwell systems too, with their NVFP4 presets and InferenceX's B200/B300
scripts as recipes) is simulated the same way.

* the client: ``vllm bench serve``'s fixed-concurrency loop at the row's concurrency
  (``silicon_concurrency`` where the source gives it, else ``batch_size`` x attention-DP ranks),
  10 x C prompts, InferenceX's client (its random dataset at range ratio 0.8, 2 x C warm-ups:
  ``ClientConfig.preset('inferencex')``); AIConfigurator's own runs (``aic-auto-gap-analysis``
  sources) publish no client settings: its generator's deployment and benchmark are assumed
  for them (:mod:`experiments._silicon_aic`: aiperf with fixed lengths, 20 x C requests, and the
  generator's limits on batch size and batched tokens; ``Engine.aic_recipe='inferencex'`` gives
  InferenceX's client and the engine's defaults instead), and the ``client`` column says so;
* the model and precision: the presets of :mod:`simsched.cost.deployed` (per-part dtypes as the
  checkpoint ships them);
* the layout: ``tp_size`` GPUs of tensor parallelism; expert parallelism where ``moe_ep_size``
  > 1; attention data parallelism (DEP) where ``attention_dp_size`` > 1 (``tp_size`` GPUs, each
  its own attention rank, experts spread over all); MoE ranks beyond the attention TP
  (``moe_tp_size x moe_ep_size > tp_size``) as data-parallel attention ranks; a disaggregated
  row as its prefill and decode workers, each laid out so (:mod:`experiments._silicon_layout`);
* the server: the engine recipe's settings (:func:`vllm_recipe`: InferenceX's launch scripts
  for max sequences, batched tokens, KV dtype, memory utilisation, max model length, prefix
  caching); vLLM's defaults where the row's recipe is not published, named in ``recipe``.

Compared: the measured TTFT and TPOT against the simulated means over the run's measured
requests (client side, as the benchmark measures), :data:`STATISTIC`. The silicon values are
means: AIConfigurator's accuracy tooling builds ``silicon_ttft_ms`` / ``silicon_tpot_ms`` from
InferenceX's ``mean_ttft`` / ``mean_tpot`` (ai-dynamo/aisimulate, ``scripts/e2e_accuracy``),
and only means grow with concurrency as the rows do: every run opens with all C requests
at once, and their queued prefills lift the mean TTFT far above the median (Llama-3.1-70B FP8,
H100 TP4, 8k/1k at C = 64: measured 1,745 ms; simulated mean 1,964 ms, median 529 ms). The
simulated medians are kept in ``sim_ttft_p50_ms`` / ``sim_tpot_p50_ms``. Printed and written
(``rows.csv``: one row per silicon row, expressible or not with the reason; ``groups.csv``:
median absolute error per (GPU, model, precision, layout); ``coverage.csv``; ``silicon.png``).
Signed errors are ``simulated / measured - 1``. The silicon data is needed only here, never by
the package: without it the experiment says so and returns an empty table. ``--quick``: one
row per (GPU, model, layout) group at its lowest concurrency, C <= 64 (about a minute).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable

import pandas as pd

from simsched import SimConfig, simulate
from simsched.config import ClientConfig
from simsched.cost import factory, vllm_silicon
from simsched.cost.hardware import MODELS
from simsched.cost.overhead import DEFAULT_ENGINE_OVERHEAD
from simsched.cost.profile_names import ALL_REDUCE_CHOICES
from experiments._common import print_table, try_plots
from experiments._common import parser as make_parser
from experiments import _silicon_aic as silicon_aic
from experiments import _silicon_layout as deployments
# One worker's layout (re-exported where callers have always found it).
from experiments._silicon_layout import layout
# The vLLM recipes per row (re-exported, as above).
from experiments._silicon_recipes import VLLM_DEFAULT, Recipe, vllm_recipe  # noqa: F401
from experiments._silicon_recipes import vllm_async_default
# The rows' path, catalog maps and loader (re-exported, as above).
from experiments._silicon_rows import DATA, GPUS, MODEL_PRESETS, load, load_or_skip  # noqa: F401
# The report made from validate()'s table, re-exported where callers have always found it.
from experiments._silicon_report import (coverage, error_figures, groups,  # noqa: F401
                                         implied_prefill_peak, plot, scatter_panel, summary)

# The simulated statistic compared with the measured values (the rows hold each run's means:
# the module docstring says how that is known).
STATISTIC = "mean"
QUICK_MAX_CONCURRENCY = 64
KERNELS = ("default", "aiconfigurator")


@dataclasses.dataclass(frozen=True)
class Engine:
    """How simsched reproduces one backend's rows: its recipe per row and engine profile.
    ``engine_terms``: None (the profile's shipped terms), a dict of terms, or a function of the
    row giving them (leave-one-group-out folds: ``experiments.fit_silicon_terms``); the row's
    cost model is then built with them (:func:`simsched.cost.factory.engine_terms_cost_model`)."""

    name: str
    recipe: Callable[[object], Recipe]
    engine_overhead: str = DEFAULT_ENGINE_OVERHEAD
    # The optional hooks below are keyword-only: a positional fourth argument once meant terms.
    _: dataclasses.KW_ONLY
    # The engine's own settings on top of the shared ones, (config, row) -> config (None: vLLM,
    # the defaults), and why one of its rows cannot be simulated, row -> reason ('' or None: it
    # can). experiments._silicon_engines sets both for SGLang and TensorRT-LLM.
    configure: Callable[[SimConfig, object], SimConfig] | None = None
    refuse: Callable[[object], str] | None = None
    engine_terms: dict | Callable[[object], dict] | None = None
    # AIConfigurator's own runs: 'generator' (its generator's deployment and aiperf client,
    # experiments._silicon_aic) or 'inferencex' (InferenceX's client and the engine's defaults);
    # aic_mixed overrides SGLang's --enable-mixed-chunk for them (None: by version).
    aic_recipe: str = "generator"
    aic_mixed: bool | None = None
    # With the generator: aiperf's 100 dataset prompts reused (its default without
    # --num-dataset-entries, hitting the prefix cache) instead of a fresh prompt per request.
    aic_reused: bool = False
    # hardware.all_reduce of every row: "fitted", "measured" (AIConfigurator's tables) or "auto".
    all_reduce: str = "fitted"
    # Whether a vLLM row runs with its version's default async scheduling (off up to 0.12:
    # vllm_async_default) instead of simsched's (on).
    async_by_version: bool = False

    def __post_init__(self) -> None:
        if self.aic_recipe not in silicon_aic.RECIPES:
            raise ValueError(f"Engine.aic_recipe must be one of {list(silicon_aic.RECIPES)}, "
                             f"got {self.aic_recipe!r}")

    def terms_of(self, row) -> dict | None:
        """The engine terms ``row`` is simulated with (None: the shipped profile's)."""
        t = self.engine_terms
        return t(row) if callable(t) else t


ENGINES: dict[str, Engine] = {"vllm": Engine("vllm", vllm_recipe)}


def one_pool_vllm_rows(path, experiment: str) -> pd.DataFrame | None:
    """The vLLM rows of one serving pool (aggregated steps) that simsched expresses, of the
    silicon CSV at ``path`` (None, with a message naming ``experiment``, where it is absent)."""
    raw = load_or_skip(path, experiment)
    if raw is None:
        return None
    raw = raw[raw["mode"] == "agg"]
    return raw[[why_not(r, "vllm") == "" for r in raw.itertuples()]]


def engine_cli(parser, argv, name: str, engines: tuple):
    """Parse ``argv`` with ``--engines`` (a comma-separated subset of ``engines``) and
    ``--data`` added to ``parser``: ``(args, chosen engines, rows)``, rows None (said so) when
    the silicon file is absent, else the ``--out`` folder made. Shared by the per-engine
    experiments (engine_silicon, aic_runs)."""
    parser.add_argument("--engines", default=",".join(engines),
                        help="engines whose rows to simulate (comma-separated)")
    parser.add_argument("--data", default=str(DATA), help="the silicon CSV (hopper.csv)")
    args = parser.parse_args(argv)
    chosen = tuple(e for e in args.engines.split(",") if e)
    bad = [e for e in chosen if e not in engines]
    if bad:
        parser.error(f"--engines: {bad} not among {list(engines)}")
    rows = load_or_skip(args.data, name)
    if rows is not None:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    return args, chosen, rows


def label_of(row) -> str:
    """The row's layout label: one worker's, or the disaggregated workers'."""
    return deployments.label(row) if deployments.is_disagg(row) else layout(row)[0]


def why_not(row, engine: str) -> str:
    """Why ``row`` cannot be simulated ('' when it can)."""
    if row.backend != engine:
        return f"engine {row.backend}: not registered here (ENGINES: {sorted(ENGINES)})"
    if pd.isna(row.gpu):
        return f"GPU {row.system} not in the catalog"
    if not isinstance(row.model, str):
        return f"no preset for {row.model_path} at precision {row.precision}"
    refuse = ENGINES[engine].refuse if engine in ENGINES else None
    if deployments.is_disagg(row):
        return deployments.why_not(row, refuse)
    if pd.isna(row.tp_size) or pd.isna(row.concurrency):
        return "layout or concurrency not recorded"
    return (refuse(row) or "") if refuse is not None else ""


def generator_deploys(row, engine: Engine) -> bool:
    """Whether ``row`` is simulated as AIConfigurator's generator deploys it: one of its own
    aggregated runs, with ``engine.aic_recipe == 'generator'`` (a disaggregated run's workers
    keep InferenceX's client and the defaults)."""
    return bool(row.aic_run) and engine.aic_recipe == "generator" \
        and not deployments.is_disagg(row)


def config_of(row, engine: Engine, num_prompts: int | None = None,
              kernels: str = "default") -> tuple[SimConfig, str]:
    """The row as a simsched config (and the client it was given); ``kernels``: ``default``
    (the catalog's kernel profile of the GPU) or ``aiconfigurator`` (its AIConfigurator
    tables, ``hardware.kernel_profile``). A disaggregated row is a cluster of such workers
    (:func:`experiments._silicon_layout.disagg_config`)."""
    if deployments.is_disagg(row):
        # AIConfigurator's generator recipe is its aggregated workers' (experiments.
        # _silicon_aic): its disaggregated runs keep InferenceX's client and the defaults.
        agg_only = dataclasses.replace(engine, aic_recipe="inferencex")
        return deployments.disagg_config(
            row, lambda worker: config_of(worker, agg_only, num_prompts, kernels))
    recipe = engine.recipe(row)
    label, tp, par = layout(row)
    c = int(row.concurrency)
    spec = MODELS[row.model]
    if recipe.kv_cache_dtype != spec.kv_cache_dtype and recipe.kv_cache_dtype != "auto":
        spec = dataclasses.replace(spec, kv_cache_dtype=recipe.kv_cache_dtype)
    n = num_prompts or 10 * c
    client = ClientConfig.preset("inferencex", max_concurrency=c, random_input_len=int(row.isl),
                                 random_output_len=int(row.osl), num_prompts=n,
                                 num_warmups=min(2 * c, n))
    kind = "inferencex (assumed)" if row.aic_run else "inferencex"
    dp = par.data_parallel_size if par is not None else 1
    custom = spec is not MODELS[row.model]
    cfg = SimConfig().replace(
        model=f"{row.model}+kv-{spec.kv_cache_dtype}" if custom else row.model,
        model_spec=spec if custom else None,
        gpu=row.gpu, tensor_parallel_size=tp, parallel=par,
        gpu_memory_utilization=recipe.gpu_memory_utilization,
        max_model_len=min(recipe.max_model_len or spec.max_context, spec.max_context),
        max_num_seqs=recipe.max_num_seqs * dp,
        max_num_batched_tokens=recipe.max_num_batched_tokens * dp,
        enable_prefix_caching=recipe.enable_prefix_caching,
        engine_overhead=engine.engine_overhead, client=client, seed=0,
        kernel_profile=None if kernels == "default" else kernels, all_reduce=engine.all_reduce)
    if engine.configure is not None:
        cfg = engine.configure(cfg, row)
    if engine.async_by_version and engine.name == "vllm" and not vllm_async_default(row):
        cfg = cfg.replace(async_scheduling=False)
    if generator_deploys(row, engine):
        # AIConfigurator's own runs publish no client or flags: its generator's (module
        # experiments._silicon_aic); num_prompts, where given, still caps the run.
        changes = silicon_aic.changes(cfg, row, engine.name, spec.max_context, engine.aic_mixed,
                                      engine.aic_reused)
        if num_prompts:
            changes["client.num_prompts"] = num_prompts
            changes["client.num_warmups"] = min(2 * c, num_prompts)
        cfg, kind = cfg.replace(**changes), silicon_aic.CLIENT
    return cfg, kind


def simulate_row(row, engine: Engine, num_prompts: int | None = None,
                 kernels: str = "default") -> dict:
    """One row simulated: the simulated p50 TTFT and TPOT (ms), or the reason it failed."""
    out = {"layout": label_of(row), "recipe": silicon_aic.SOURCE
           if generator_deploys(row, engine) else engine.recipe(row).source}
    try:
        cfg, kind = config_of(row, engine, num_prompts, kernels)
        terms = engine.terms_of(row)
        if terms is not None and deployments.is_disagg(row):
            # One cost model would time every pool at the top-level layout (a TP 1 prefill
            # worker at the decode workers' TP 4): a profile by name times each pool.
            raise ValueError("engine terms are not applied to a disaggregated row's workers; "
                             "name an engine profile instead (--terms neutral: vllm_v1)")
        cm = None if terms is None else factory.engine_terms_cost_model(cfg.hardware, terms)
        s = simulate(cfg, cost_model=cm).summary()
    except ValueError as exc:          # e.g. the weights do not fit at this layout
        return {**out, "reason": str(exc).split("\n")[0]}
    return {**out, "client": kind, "sim_ttft_ms": s[f"ttft_{STATISTIC}"] * 1e3,
            "sim_tpot_ms": s[f"tpot_{STATISTIC}"] * 1e3, "sim_ttft_p50_ms": s["ttft_p50"] * 1e3,
            "sim_tpot_p50_ms": s["tpot_p50"] * 1e3, "reason": ""}


def _simulate_group(rows: pd.DataFrame, engine: Engine, kernels: str) -> dict:
    """Rows of one (GPU, model, layout), which share their cost model: id -> result."""
    out = {r.id: simulate_row(r, engine, kernels=kernels) for r in rows.itertuples()}
    factory.clear_caches()
    return out


def validate(rows: pd.DataFrame, engine: str | Engine = "vllm", quick: bool = False,
             limit: int | None = None, kernels: str = "default") -> pd.DataFrame:
    """The tidy table: one row per silicon row with its expressibility and errors. ``engine``:
    a registered name, or an :class:`Engine` (a registered one with other terms or recipes:
    ``dataclasses.replace(ENGINES[name], ...)``), whose name picks the rows."""
    eng = engine if isinstance(engine, Engine) else ENGINES[engine]
    rows = rows.copy()
    rows["reason"] = [why_not(r, eng.name) for r in rows.itertuples()]
    todo = rows[rows.reason == ""]
    if quick:
        todo = todo[todo.concurrency <= QUICK_MAX_CONCURRENCY]
        todo = todo.assign(_l=[label_of(r) for r in todo.itertuples()]).sort_values(
            ["concurrency", "id"]).drop_duplicates(["gpu", "model", "_l"]).drop(columns="_l")
        rows = rows[rows.reason != ""].pipe(lambda r: pd.concat([r, todo]))
    if limit is not None:
        todo = todo.head(limit)
        rows = pd.concat([rows[rows.reason != ""], todo])
    # Rows of one (GPU, model, layout) share their cost model: run them together and drop the
    # cached models between groups (a 128k-context model's tables take ~100 MB each).
    todo = todo.assign(_l=[label_of(r) for r in todo.itertuples()]).sort_values(
        ["gpu", "model", "_l", "concurrency"], kind="stable").drop(columns="_l")
    labels = [label_of(r) for r in todo.itertuples()]
    groups_of = {k: part.drop(columns="_l") for k, part in
                 todo.assign(_l=labels).groupby(["gpu", "model", "_l"], sort=False)}
    sims = {}
    # One (forked) worker process per group: a group's cost models and runs are freed with it
    # (a long run over many 128k-context models otherwise grows by gigabytes).
    ctx = multiprocessing.get_context("fork") if "fork" in \
        multiprocessing.get_all_start_methods() else None
    if ctx is None or len(groups_of) == 1:
        for part in groups_of.values():
            sims.update(_simulate_group(part, eng, kernels))
    else:
        for part in groups_of.values():
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
                sims.update(pool.submit(_simulate_group, part, eng, kernels).result())
    frame = pd.DataFrame.from_dict(sims, orient="index")
    out = rows.drop(columns="reason").merge(frame, left_on="id", right_index=True, how="left")
    out["reason"] = [sims[i]["reason"] if i in sims else r
                     for i, r in zip(rows.id, rows.reason)]
    out["expressible"] = out.reason == ""
    out = out.rename(columns={"silicon_ttft_ms": "ttft_ms", "silicon_tpot_ms": "tpot_ms"})
    for m in ("ttft", "tpot"):
        out[f"{m}_error"] = out[f"sim_{m}_ms"] / out[f"{m}_ms"] - 1.0
    out["implied_prefill_peak"] = [implied_prefill_peak(r) for r in out.itertuples()]
    cols = ["id", "backend", "gpu", "model", "model_path", "precision", "layout", "isl",
            "osl", "concurrency", "recipe", "client", "ttft_ms", "sim_ttft_ms", "ttft_error",
            "tpot_ms", "sim_tpot_ms", "tpot_error", "sim_ttft_p50_ms", "sim_tpot_p50_ms",
            "implied_prefill_peak", "expressible", "reason"]
    return out.reindex(columns=cols).reset_index(drop=True)


def main(argv=None) -> pd.DataFrame:
    """Print the coverage, per-group and headline tables; write them and the plot; return the
    per-row table (``attrs['summary']``, ``attrs['groups']``, ``attrs['coverage']``)."""
    parser = make_parser("validate_silicon", __doc__,
                         f"one row per (GPU, model, layout), C <= {QUICK_MAX_CONCURRENCY}")
    parser.add_argument("--engine", default="vllm", help=f"backend rows to simulate "
                        f"(registered: {sorted(ENGINES)})")
    parser.add_argument("--data", default=str(DATA), help="the silicon CSV (hopper.csv)")
    parser.add_argument("--kernels", default="default", choices=KERNELS,
                        help="kernel profile: the catalog's default for the GPU, or its "
                             "AIConfigurator tables (hardware.kernel_profile)")
    parser.add_argument("--terms", default="shipped",
                        help="engine terms: 'shipped' (the profile's: for vLLM the default "
                             "vllm_silicon, the vllm_v1 terms with the fitted silicon terms, "
                             "simsched.cost.vllm_silicon), 'fitted' (the same), 'neutral' (the "
                             "vllm_v1 terms alone), or NAME=VALUE[,NAME=VALUE...] set on the "
                             "vllm_v1 terms")
    parser.add_argument("--all-reduce", default=None, choices=ALL_REDUCE_CHOICES,
                        help="custom all-reduce time (hardware.all_reduce): the fitted latency "
                             "term, each GPU's measured AIConfigurator tables (default kernels "
                             "only), or measured where it can be; default: the engine preset's "
                             "(vllm: fitted; sglang, trtllm: auto)")
    parser.add_argument("--async-by-version", action="store_true",
                        help="run each vLLM row with its version's default async scheduling "
                             "(off up to 0.12) instead of on")
    parser.add_argument("--rows", type=int, default=None, help="only the first N rows")
    parser.add_argument("--img", default=None, help="also copy the plot here (docs/img)")
    args = parser.parse_args(argv)
    if args.engine not in ENGINES:
        parser.error(f"--engine: {args.engine!r} is not registered; registered: "
                     f"{sorted(ENGINES)}")
    try:
        terms = vllm_silicon.parse(args.terms)
    except ValueError as exc:
        parser.error(f"--terms: {exc}")
    if args.all_reduce == "measured" and args.kernels != "default":
        parser.error("--all-reduce measured: --kernels aiconfigurator times every all-reduce "
                     "from its measured tables already")
    engine = dataclasses.replace(ENGINES[args.engine],
                                 all_reduce=args.all_reduce or ENGINES[args.engine].all_reduce,
                                 async_by_version=args.async_by_version)
    if args.terms == "neutral" and args.engine == "vllm":
        # The vllm_v1 profile by name, which times each worker pool of a disaggregated row
        # too (simulate_row refuses engine terms there).
        engine = dataclasses.replace(engine, engine_overhead="vllm_v1")
    elif terms is not None:
        engine = dataclasses.replace(engine, engine_terms=terms)
    rows = load_or_skip(args.data, "validate_silicon")
    if rows is None:
        return pd.DataFrame()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    table = validate(rows, engine, args.quick, args.rows, args.kernels)
    cov, grp, summ = coverage(table, args.engine), groups(table), summary(
        table[table.backend == args.engine])
    print(f"coverage of the {args.engine} rows ({(table.backend == args.engine).sum()} of "
          f"{len(table)} rows of {Path(args.data).name})")
    print_table(cov)
    print("\nmedian absolute error % per (GPU, model, precision, layout); bias: median signed")
    print_table(grp, digits=3)
    print("\nheadline: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in summ.items())
          + f" ({time.perf_counter() - start:.0f} s)")
    table.to_csv(out / "rows.csv", index=False)
    grp.to_csv(out / "groups.csv", index=False)
    cov.to_csv(out / "coverage.csv", index=False)
    paths = try_plots(lambda: [plot(table, out)])
    if args.img:
        Path(args.img).mkdir(parents=True, exist_ok=True)
        for p in paths:
            shutil.copy(p, Path(args.img) / p.name)
    print(f"wrote rows.csv, groups.csv, coverage.csv{''.join(', ' + p.name for p in paths)} "
          f"to {out}")
    table.attrs.update(summary=summ, groups=grp, coverage=cov)
    return table


# The SGLang and TensorRT-LLM engines (their recipes and settings: experiments._silicon_engines;
# it is handed the classes above, as this module may run as __main__).
from experiments import _silicon_engines as silicon_engines  # noqa: E402

silicon_engines.register(ENGINES, Engine, Recipe, MODEL_PRESETS)


if __name__ == "__main__":
    main()
