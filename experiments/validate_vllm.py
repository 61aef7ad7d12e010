"""Sim-to-real, end to end: the real vLLM 0.15 serving runs (H100) reproduced in simsched.

    python -m experiments.validate_vllm [--quick] [--runs N] [--profiles a,b] [--out DIR] [--img DIR]

Every dense run bundled in ``simsched/cost/data/vllm_v1/`` (13 runs: Llama-2-7B/70B, CodeLlama-34B,
Llama-3.1-70B, Mistral-NeMo-12B, Qwen2.5-7B, Yi-34B at TP 1-4) is rebuilt as its load generator
sent it and its server ran it:

* arrivals per stage: N = rate x duration exponential gaps scaled to sum to the stage duration,
  from 1 s after the stage starts; the next stage starts once every request of this one has
  finished (checked after the run; a run whose stages would overlap is re-run with the next stage
  moved past the last finish);
* prompts: 10 groups x 10 prompts (a group's system prompt, then a question), shuffled once; the
  n-th request of a stage sends prompt[n % 100]: simsched prompt identities (``hash_ids`` in blocks
  of the system prompt's length: the group's id, then the prompt's own ids), so vLLM's prefix
  cache is reproduced; lengths re-tokenised as the data README gives for the Llama-2 family;
* outputs of exactly ``output_tokens`` (ignore_eos);
* server: max_num_seqs 128, block size 16, max_model_len 4096, prefix caching, chunked prefill,
  the run's max_num_batched_tokens, no admission watermark (vLLM V1 has none), the KV blocks from
  its start-up log where published (else derived from the GPU memory).

Each run is simulated with every engine profile (``measured_2023``, ``overlapped``,
``eager_2023``, ``none``, ``vllm_v1``) and with ``vllm_v1`` refitted without that run
(``vllm_v1_loo``: leave one run out), alone and with the silicon terms of the default profile
(``vllm_silicon_loo``: :mod:`simsched.cost.vllm_silicon`, fitted on other rows, so held out
here too). Printed and written (``runs.csv``, ``summary.csv``, a plot):
measured vs simulated TTFT and E2E (mean, p90, p99) and ITL, the error per run and the median
absolute error per profile, and TTFT in decode steps. ITL two ways: ``itl`` is the engine's time
per generated token, (E2E - TTFT) / (output - 1), from the measured means too; ``itl_published``
compares with the published ``itl_mean``, which for the Llama-2 family divides by the load
generator's re-count of output tokens (fewer than generated: see the data README). Latencies as
the client sees them (``vllm_v1``: step end + output delay; the other profiles have none).

``--quick`` simulates the first 20 s of each stage of ``--runs`` runs (default 2) with
``measured_2023`` and ``vllm_v1`` only: small enough for a test. ``--client`` replays each run
through simsched's inference-perf client instead (``SimConfig.client`` with
``client_type='staged'``, docs/clients.md: the load generator as a process, each stage started
when the client has seen the previous one finish, its first request one gap after the 1 s lead,
as inference-perf's ``ConstantLoadTimer`` yields it) rather than the arrival table above.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from simsched import SimConfig, simulate
from simsched.config import ClientConfig
from simsched.cost import vllm_silicon, vllm_v1
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.hardware import GPUS, MODELS
from experiments._common import parser as make_parser
from experiments._common import try_plots

PROFILES = ("measured_2023", "overlapped", "eager_2023", "none", "vllm_v1", "vllm_v1_loo",
            "vllm_silicon_loo")
QUICK_PROFILES = ("measured_2023", "vllm_v1")
# Run only when named (--profiles): the default profile with its shipped terms, and with
# hardware.all_reduce="measured" (AIConfigurator's measured all-reduce tables instead of the
# fitted latency term).
OPTIONAL_PROFILES = ("vllm_silicon", "vllm_silicon_measured_ar")
METRICS = ("ttft_mean", "ttft_p90", "ttft_p99", "e2e_mean", "e2e_p90", "e2e_p99", "itl")
NUM_PROMPTS, NUM_GROUPS = 100, 10
STAGE_DELAY = 1.0          # the first arrival of a stage, after the stage starts (s)
QUICK_SECONDS = 20.0
STAGE_GAP = 120.0          # first guess of the idle time between stages (checked, then moved)


def stage_arrivals(rate: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival offsets of one stage from its start: rate x seconds exponential gaps scaled to sum
    to the stage's duration, the first :data:`STAGE_DELAY` after the start."""
    n = max(1, int(round(rate * seconds)))
    gaps = rng.exponential(size=n)
    return STAGE_DELAY + np.concatenate([[0.0], np.cumsum(gaps[:-1])]) * seconds / gaps.sum()


def requests_of(run, starts: list[float], seconds: float | None = None,
                seed: int = 0) -> pd.DataFrame:
    """The run's requests (``arrival_at``, tokens, ``hash_ids``, ``stage``) with stage k starting
    at ``starts[k]``; ``seconds`` caps every stage's duration (``--quick``)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(NUM_PROMPTS)            # the load generator shuffled its prompts once
    system, prompt = int(run.system_prompt_tokens), int(run.prompt_tokens)
    blocks = -(-prompt // system)
    # One id per system-prompt-sized block: the group's system prompt, then the prompt's own.
    ids = [[int(p // (NUM_PROMPTS // NUM_GROUPS))]
           + [NUM_GROUPS + int(p) * blocks + j for j in range(blocks - 1)] for p in order]
    frames = []
    for k, ((rate, length), start) in enumerate(zip(run.stages, starts)):
        length = min(length, seconds) if seconds else length
        at = start + stage_arrivals(rate, length, rng)
        n = np.arange(len(at))
        frames.append(pd.DataFrame({
            "arrival_at": at, "num_prompt_tokens": prompt,
            "num_output_tokens": int(run.output_tokens),
            "hash_ids": [ids[i % NUM_PROMPTS] for i in n], "stage": k}))
    df = pd.concat(frames, ignore_index=True)
    df.attrs["hash_block_size"] = system
    return df


def config_of(run, profile: str, seed: int = 0) -> SimConfig:
    """The run's server settings as a simsched config under engine profile ``profile``."""
    blocks = run.kv_blocks_from_log
    measured_ar = profile.endswith("_measured_ar")
    return SimConfig.preset("classic").replace(
        model=run.model, gpu=run.gpu, tensor_parallel_size=int(run.tp), max_model_len=4096,
        gpu_memory_utilization=float(run.gpu_memory_utilization),
        model_spec=getattr(run, "model_spec", None),
        engine_overhead=profile.removesuffix("_loo").removesuffix("_measured_ar"),
        all_reduce="measured" if measured_ar else "fitted", max_num_seqs=128,
        max_num_batched_tokens=int(run.max_num_batched_tokens), enable_chunked_prefill=True,
        block_size=16, enable_prefix_caching=True, watermark=0.0, seed=seed,
        num_blocks=None if pd.isna(blocks) else int(blocks))


def simulate_run(run, profile: str, seconds: float | None = None, seed: int = 0,
                 terms: dict | None = None) -> pd.DataFrame:
    """The run simulated under ``profile`` (``terms``: ``vllm_v1`` terms to use instead of the
    shipped ones); its finished requests' frame with a ``stage`` column."""
    cfg = config_of(run, profile, seed)
    cost = None
    if terms is not None:
        spec = getattr(run, "model_spec", None) or MODELS[run.model]   # MoE runs carry theirs
        cost = CalibratedCostModel(spec, GPUS[run.gpu], int(run.tp), run.model,
                                   engine_overhead="vllm_v1", engine_terms=terms)
    lengths = [min(s, seconds) if seconds else s for _, s in run.stages]
    # Stages far apart first; if one would not have finished before the next, move the next.
    starts = list(np.concatenate([[0.0], np.cumsum([s + STAGE_GAP for s in lengths[:-1]])]))
    for _ in range(len(starts)):
        # Request ids follow arrival order: sort so that id i is row i (stages may interleave).
        reqs = requests_of(run, starts, seconds, seed).sort_values(
            "arrival_at", kind="stable", ignore_index=True)
        res = simulate(cfg, requests=reqs.drop(columns="stage"), cost_model=cost)
        df = res.requests.assign(stage=reqs.stage.to_numpy()[res.requests.request_id])
        ends = df.groupby("stage").finished_at.max()
        late = [k for k in range(1, len(starts)) if ends[k - 1] >= starts[k]]
        if not late:
            return df
        k = late[0]
        shift = ends[k - 1] + 1.0 - starts[k]
        starts = starts[:k] + [s + shift for s in starts[k:]]
    return df


def prompt_pool(run, seed: int = 0) -> pd.DataFrame:
    """The load generator's 100 prompts in the order it sends them (shuffled once), as a
    request table for a client to cycle (:func:`requests_of`'s prompts, without times)."""
    df = requests_of(run, [0.0] * len(run.stages), None, seed)
    pool = df[df.stage == 0].head(NUM_PROMPTS).drop(columns="stage")
    pool.attrs["hash_block_size"] = df.attrs["hash_block_size"]
    return pool.assign(arrival_at=0.0)


def simulate_client_run(run, profile: str, seconds: float | None = None, seed: int = 0,
                        terms: dict | None = None) -> pd.DataFrame:
    """:func:`simulate_run` with the load generator as simsched's inference-perf client: the
    run's stages (each capped at ``seconds``) over :func:`prompt_pool`, cycled per stage."""
    cfg = config_of(run, profile, seed)
    cost = None
    if terms is not None:
        spec = getattr(run, "model_spec", None) or MODELS[run.model]
        cost = CalibratedCostModel(spec, GPUS[run.gpu], int(run.tp), run.model,
                                   engine_overhead="vllm_v1", engine_terms=terms)
    stages = tuple((rate, min(length, seconds) if seconds else length)
                   for rate, length in run.stages)
    client = ClientConfig(client_type="staged", stages=stages, num_unique_prompts=NUM_PROMPTS)
    return simulate(cfg.replace(client=client), requests=prompt_pool(run, seed),
                    cost_model=cost).requests


def metrics(df: pd.DataFrame, output_tokens: int) -> dict:
    """TTFT/E2E mean, p90, p99 and the engine ITL (seconds) over finished requests."""
    done = df[df.status == "finished"]
    out = {}
    for name, col in (("ttft", "ttft"), ("e2e", "e2el")):
        v = done[col].to_numpy()
        out.update({f"{name}_mean": v.mean(), f"{name}_p90": np.percentile(v, 90),
                    f"{name}_p99": np.percentile(v, 99)})
    out["itl"] = (out["e2e_mean"] - out["ttft_mean"]) / (output_tokens - 1)
    out["num_unfinished"] = int(len(df) - len(done))
    return out


def measured(run) -> dict:
    """The run's published metrics in the same names (``itl``: the engine's time per token)."""
    out = {m: float(getattr(run, m)) for m in METRICS if m != "itl"}
    out["itl"] = float(run.engine_itl)
    out["itl_published"] = float(run.itl_mean)
    return out


def validate(runs: pd.DataFrame, profiles=PROFILES, seconds: float | None = None,
             seed: int = 0, client: bool = False) -> pd.DataFrame:
    """One row per (run, profile): measured and simulated metrics and signed errors (%);
    ``client``: each run replayed by :func:`simulate_client_run`."""
    rows = []
    replay = simulate_client_run if client else simulate_run
    for run in runs.itertuples():
        meas = measured(run)
        for profile in profiles:
            terms = vllm_v1.fit_terms(exclude=run.experiment) if profile.endswith("_loo") \
                else None
            if profile == "vllm_silicon_loo":
                terms = {**terms, **vllm_silicon.fitted()}
            sim = metrics(replay(run, profile, seconds, seed, terms), run.output_tokens)
            row = {"experiment": run.experiment, "model": run.model, "tp": int(run.tp),
                   "profile": profile, "num_unfinished": sim.pop("num_unfinished")}
            for m in METRICS:
                row[f"{m}_measured"], row[f"{m}_simulated"] = meas[m], sim[m]
                row[f"{m}_error"] = (sim[m] / meas[m] - 1) * 100
            row["itl_published_measured"] = meas["itl_published"]
            row["itl_published_error"] = (sim["itl"] / meas["itl_published"] - 1) * 100
            row["ttft_steps_measured"] = meas["ttft_mean"] / meas["itl"]
            row["ttft_steps_simulated"] = sim["ttft_mean"] / sim["itl"]
            rows.append(row)
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Median absolute error (%) per profile and metric, the worst E2E mean, TTFT in steps."""
    cols = [f"{m}_error" for m in METRICS] + ["itl_published_error"]
    g = table.groupby("profile", sort=False)
    out = g[cols].agg(lambda e: e.abs().median())
    out.columns = [c.replace("_error", "") for c in cols]
    out["e2e_mean_worst"] = g.e2e_mean_error.agg(lambda e: e.abs().max())
    out["ttft_steps_min"] = g.ttft_steps_simulated.min()
    out["ttft_steps_max"] = g.ttft_steps_simulated.max()
    return out


def plot(table: pd.DataFrame, out: Path) -> Path:
    """Measured vs simulated TTFT, E2E and ITL means per profile (log-log parity). Axes span
    half to twice the measured range; simulated values beyond are drawn at the edge (triangles)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2))
    order = [p for p in table.profile.unique() if p != "vllm_v1_loo"] + ["vllm_v1_loo"]
    for ax, m in zip(axes, ("ttft_mean", "e2e_mean", "itl")):
        meas = table[f"{m}_measured"] * 1e3
        lo, hi = meas.min() / 2, meas.max() * 2
        for profile in order:
            g = table[table.profile == profile]
            x, y = g[f"{m}_measured"] * 1e3, g[f"{m}_simulated"] * 1e3
            clipped = (y > hi) | (y < lo)
            best = profile == "vllm_v1_loo"
            style = dict(s=70 if best else 18, zorder=3 if best else 2,
                         marker="*" if best else "o", alpha=1.0 if best else 0.6)
            ax.scatter(x[~clipped], y[~clipped], label=profile, **style)
            if clipped.any():
                ax.scatter(x[clipped], y[clipped].clip(lo, hi), marker="^", s=18, alpha=0.6,
                           color=ax.collections[-1].get_facecolor()[0])
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
               xlabel=f"measured {m} (ms)", ylabel=f"simulated {m} (ms)",
               title=f"{m}: vLLM 0.15 runs, H100 (band +-10 %)")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = out / "validate_vllm_parity.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> pd.DataFrame:
    """Print the per-run and per-profile tables; write runs.csv, summary.csv and the plot;
    return the per-run table (the summary in ``attrs['summary']``)."""
    parser = make_parser("validate_vllm", __doc__, "first 20 s of each stage, 2 runs, 2 profiles")
    parser.add_argument("--runs", type=int, default=None, help="only the first N runs")
    parser.add_argument("--profiles", default=None, help="comma-separated profiles")
    parser.add_argument("--img", default=None, help="also copy the plot here (docs/img)")
    parser.add_argument("--client", action="store_true",
                        help="replay the runs through simsched's inference-perf client "
                             "(SimConfig.client, docs/clients.md)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = vllm_v1.load_runs()
    count = args.runs or (2 if args.quick else None)
    if count is not None:
        runs = runs.head(count)
    profiles = tuple(args.profiles.split(",")) if args.profiles else \
        QUICK_PROFILES if args.quick else PROFILES
    bad = set(profiles) - set(PROFILES) - set(OPTIONAL_PROFILES)
    if bad:
        raise ValueError(f"--profiles: unknown {sorted(bad)}; known: "
                         f"{list(PROFILES + OPTIONAL_PROFILES)}")
    terms = vllm_v1.terms()
    print("vllm_v1 terms (shipped): " + ", ".join(
        f"{name} {terms[name] * scale:.3g} {unit}" for name, (unit, scale)
        in vllm_v1.TERM_UNITS.items()))
    table = validate(runs, profiles, QUICK_SECONDS if args.quick else None,
                     client=args.client)
    short = table.assign(run=table.experiment.str.slice(0, 30))
    with pd.option_context("display.width", 250, "display.max_rows", 400,
                           "display.float_format", "{:.1f}".format):
        cols = ["run", "profile"] + [f"{m}_error" for m in METRICS] \
            + ["itl_published_error", "ttft_steps_measured", "ttft_steps_simulated"]
        print("\nsigned error % per run and profile (simulated / measured - 1); ITL: engine "
              "time per generated token; itl_published: against the published itl_mean")
        print(short[cols].to_string(index=False))
        summ = summary(table)
        print("\nmedian absolute error % per profile (e2e_mean_worst: the largest; ttft steps: "
              "simulated TTFT / simulated ITL, min and max over runs)")
        print(summ.to_string())
    table.to_csv(out / "runs.csv", index=False)
    summ.to_csv(out / "summary.csv")
    paths = try_plots(lambda: [plot(table, out)])
    if args.img:
        Path(args.img).mkdir(parents=True, exist_ok=True)
        for p in paths:
            shutil.copy(p, Path(args.img) / p.name)
    print(f"\nwrote runs.csv, summary.csv{''.join(', ' + p.name for p in paths)} to {out}")
    table.attrs["summary"] = summ
    return table


if __name__ == "__main__":
    main()
