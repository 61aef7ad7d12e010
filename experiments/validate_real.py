"""Sim-to-real report: the bundled real-serving runs (DGX-A100, DGX-H100) against simsched.

    python -m experiments.validate_real [--quick] [--out out/validate_real/] [--img docs/img]

Every run (B prompts of P tokens submitted together, decoded together for T tokens; Llama-2-70B at
TP 2/4/8 and BLOOM-176B at TP 8) is replayed two ways:

* through the cost model, iteration by iteration as the 2023 engine schedules it (whole prompts
  first, up to 8,192 tokens per iteration; then every sequence decodes), before this calibration
  (A100-fitted kernels everywhere, ``measured_2023`` overhead) and after (``eager_2023``: the
  fitted whole-iteration terms), and with ``measured_2023`` (the default overhead then) on the new
  kernels;
* end to end through ``simsched.simulate`` (B requests arriving at t = 0, ``prefill_first``
  scheduler without chunking, a token budget of 8,192; prompt time = the last first token, token
  time = the mean decode-only iteration), which also exercises the scheduler.

Prints the fitted terms, MAPE per (model, GPU, TP, phase) before and after, leave-one-TP-out and
the serving-level errors; writes ``runs.csv``, ``groups.csv`` and two plots (log-log parity,
error against batch size) to ``--out`` and, with ``--img``, to that folder too. ``--quick`` runs
the serving-level check on the runs with at most 512 output tokens only.

The end-to-end check of a current engine (real vLLM 0.15 serving runs: arrivals, prompt reuse,
TTFT/ITL/E2E as the client saw them; the ``vllm_v1`` profile) is :mod:`experiments.validate_vllm`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from simsched import SimConfig, simulate
from simsched.cost import hardware, report, serving
from experiments._common import parser as make_parser
from experiments._common import try_plots

PHASES = (("prefill", "prompt"), ("decode", "token"))


@contextlib.contextmanager
def long_context(model: str, tokens: int):
    """Let ``model`` take ``tokens`` of context for the duration (the runs use 8,192-token prompts
    beyond Llama-2's 4,096; timing, not quality, is measured)."""
    spec = hardware.MODELS[model]
    if spec.max_context >= tokens:
        yield
        return
    hardware.MODELS[model] = dataclasses.replace(spec, max_context=tokens)
    try:
        yield
    finally:
        hardware.MODELS[model] = spec


def simulate_run(run) -> tuple[float, float, int]:
    """(prompt time, mean decode iteration, preemptions) of one run simulated end to end."""
    length = int(run.prompt_size + run.token_size)
    with long_context(run.model, length):
        cfg = SimConfig.preset("classic").replace(
            model=run.model, gpu=run.gpu, tensor_parallel_size=int(run.tp),
            engine_overhead="eager_2023", max_model_len=length, style="prefill_first",
            enable_chunked_prefill=False, max_num_batched_tokens=serving.PROMPT_TOKEN_BUDGET,
            max_num_seqs=max(256, int(run.batch_size)))
        reqs = [(0.0, int(run.prompt_size), int(run.token_size))] * int(run.batch_size)
        res = simulate(cfg, requests=reqs)
    it = res.iterations
    decode = it[it.num_prefill_tokens == 0]
    return (float(res.requests.first_token_at.max()), float(decode.duration.mean()),
            int(res.requests.num_preemptions.sum()))


def serving_level(runs: pd.DataFrame) -> pd.DataFrame:
    """Simulate every run end to end; signed errors in percent."""
    rows = []
    for r in runs.itertuples():
        prompt, token, preempted = simulate_run(r)
        rows.append({"model": r.model, "gpu": r.gpu, "tp": r.tp, "prompt_size": r.prompt_size,
                     "batch_size": r.batch_size, "token_size": r.token_size,
                     "sim_prompt_error": (prompt / r.prompt_time - 1) * 100,
                     "sim_token_error": (token / r.token_time - 1) * 100,
                     "num_preemptions": preempted, "anomaly": r.anomaly})
    return pd.DataFrame(rows)


def terms_table() -> pd.DataFrame:
    """The fitted eager_2023 terms per measured system, in readable units."""
    terms = serving.engine_terms()
    rows = {}
    for system, values in terms.items():
        rows[system] = {f"{name} [{serving.TERM_UNITS[name][0]}]":
                        values[name] * serving.TERM_UNITS[name][1] for name in serving.TERMS}
    return pd.DataFrame(rows)


def power_cap_ratio() -> pd.Series:
    """Power-capped / uncapped H100 time per matching run, prompt and token phases."""
    runs = serving.scenarios()
    keys = ["model", "tp", "prompt_size", "batch_size", "token_size"]
    cap = runs[runs.gpu == "h100-sxm-pcap"].set_index(keys)
    plain = runs[runs.gpu == "h100-sxm"].set_index(keys)
    p = cap.prompt_time / plain.prompt_time
    t = cap.token_time / plain.token_time
    return pd.Series({"prompt_min": p.min(), "prompt_max": p.max(), "token_min": t.min(),
                      "token_max": t.max()})


def plots(after: pd.DataFrame, out: Path) -> list[Path]:
    """Parity (log-log) and error-vs-batch plots of the after model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = after[~after.anomaly]
    colors = {"a100-80gb": "tab:blue", "h100-sxm": "tab:orange", "h100-sxm-pcap": "tab:green"}
    markers = {2: "o", 4: "s", 8: "^"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    for ax, (phase, col) in zip(axes, PHASES):
        for (model, gpu, tp), g in ok.groupby(["model", "gpu", "tp"]):
            ax.scatter(g[f"{col}_measured"] * 1e3, g[f"{col}_simulated"] * 1e3, s=18,
                       color=colors[gpu], marker=markers[tp],
                       facecolors="none" if model == "bloom-176b" else colors[gpu],
                       label=f"{model} {gpu} TP{tp}")
        lo = min(ok[f"{col}_measured"].min(), ok[f"{col}_simulated"].min()) * 1e3 * 0.8
        hi = max(ok[f"{col}_measured"].max(), ok[f"{col}_simulated"].max()) * 1e3 * 1.25
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
               xlabel=f"measured {phase} time (ms)", ylabel=f"simulated {phase} time (ms)",
               title=f"{phase}: simulated vs measured (band: +-10 %)")
    axes[0].legend(fontsize=6, ncol=2, loc="upper left")
    fig.tight_layout()
    parity = out / "validate_real_parity.png"
    fig.savefig(parity, dpi=110)
    plt.close(fig)

    batch = ok[(ok.prompt_size == 512) & (ok.token_size == 128)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, (phase, col) in zip(axes, PHASES):
        for (model, gpu, tp), g in batch.groupby(["model", "gpu", "tp"]):
            g = g.sort_values("batch_size")
            ax.plot(g.batch_size, g[f"{col}_error"], marker=markers[tp], color=colors[gpu],
                    ls="--" if model == "bloom-176b" else "-", label=f"{model} {gpu} TP{tp}")
        ax.axhspan(-10, 10, color="0.9")
        ax.axhline(0, color="k", lw=0.8)
        ax.set(xscale="log", xlabel="prompts in the batch (512 tokens each)",
               ylabel="simulated / measured - 1 (%)", title=f"{phase} error against batch size")
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    errs = out / "validate_real_error_vs_batch.png"
    fig.savefig(errs, dpi=110)
    plt.close(fig)
    return [parity, errs]


def main(argv=None) -> pd.DataFrame:
    """Print the sim-to-real tables; write runs.csv, groups.csv and the plots; return the
    per-group MAPE table (the fitted terms and the leave-one-TP-out table in ``attrs``)."""
    parser = make_parser("validate_real", __doc__, "short serving-level check")
    parser.add_argument("--img", default=None, help="also copy the plots here (docs/img)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fmt = {"display.width": 200, "display.max_rows": 400, "display.max_columns": 30,
           "display.float_format": "{:.3g}".format}

    with pd.option_context(*[x for kv in fmt.items() for x in kv]):
        print(f"whole-iteration terms of eager_2023 (fitted per system on its Llama-2-70B runs; "
              f"prompts batched whole up to {serving.PROMPT_TOKEN_BUDGET} tokens per iteration; "
              f"left out: {serving.ANOMALY})")
        print(terms_table().to_string())
        print("\npower-capped / uncapped H100, matching runs:",
              power_cap_ratio().round(4).to_dict())

    before = report.real_serving_errors(legacy=True)
    default = report.real_serving_errors(engine_overhead="measured_2023")
    after = report.real_serving_errors()
    groups = report.group_mape(before).merge(
        report.group_mape(default), on=["model", "gpu", "tp", "runs"],
        suffixes=("_before", "_default")).merge(
        report.group_mape(after).rename(columns={"prefill": "prefill_after",
                                                 "decode": "decode_after"}),
        on=["model", "gpu", "tp", "runs"])
    runs = serving.scenarios()
    if args.quick:
        runs = runs[runs.token_size <= 512]
    sim = serving_level(runs)
    sim_groups = sim[~sim.anomaly].groupby(["model", "gpu", "tp"]).agg(
        prefill_serving=("sim_prompt_error", lambda e: e.abs().mean()),
        decode_serving=("sim_token_error", lambda e: e.abs().mean())).reset_index()
    groups = groups.merge(sim_groups, on=["model", "gpu", "tp"], how="left")
    cols = ["model", "gpu", "tp", "runs", "prefill_before", "prefill_default", "prefill_after",
            "prefill_serving", "decode_before", "decode_default", "decode_after",
            "decode_serving"]
    with pd.option_context("display.width", 200, "display.float_format", "{:.1f}".format):
        print("\nMAPE % per (model, GPU, TP): before = A100-fitted kernels + measured_2023 "
              "(simsched before this calibration); default = new kernels + measured_2023 (the "
              "default overhead then); "
              "after = eager_2023 through the cost model; serving = eager_2023 through "
              "simulate()" + (" (runs with T <= 512 only)" if args.quick else ""))
        print(groups[cols].to_string(index=False))
        print("\nleave-one-TP-out (terms refitted without that TP's runs; MAPE % on them):")
        loto = report.leave_one_tp_out()
        print(loto.to_string(index=False))
        preempted = sim[sim.num_preemptions > 0]
        print(f"\nserving-level runs with preemptions: {len(preempted)} "
              f"({int(preempted.anomaly.sum())} of them among the left-out runs)")
        print("\nlargest after-model errors (%):")
        ok = after[~after.anomaly]
        worst = ok.reindex(ok[["prompt_error", "token_error"]].abs().max(axis=1)
                           .sort_values(ascending=False).index[:8])
        print(worst[["model", "gpu", "tp", "prompt_size", "batch_size", "token_size",
                     "prompt_error", "token_error"]].to_string(index=False))
        anomaly = after[after.anomaly].copy()
        for col in ("prompt_measured", "prompt_simulated", "token_measured", "token_simulated"):
            anomaly[col.replace("ed", "ed_ms")] = anomaly[col] * 1e3
        print("\nleft-out anomalous runs (after model):")
        print(anomaly[["model", "gpu", "tp", "batch_size", "prompt_measured_ms",
                       "prompt_simulated_ms", "token_measured_ms", "token_simulated_ms"]]
              .to_string(index=False))

    merged = after.merge(sim, on=["model", "gpu", "tp", "prompt_size", "batch_size",
                                  "token_size", "anomaly"], how="left")
    merged = merged.merge(before[["model", "gpu", "tp", "prompt_size", "batch_size",
                                  "token_size", "prompt_simulated", "token_simulated"]],
                          on=["model", "gpu", "tp", "prompt_size", "batch_size", "token_size"],
                          suffixes=("", "_before"))
    merged.to_csv(out / "runs.csv", index=False)
    groups.to_csv(out / "groups.csv", index=False)
    paths = try_plots(lambda: plots(after, out))
    if args.img:
        img = Path(args.img)
        img.mkdir(parents=True, exist_ok=True)
        for p in paths:
            shutil.copy(p, img / p.name)
    print(f"\nwrote runs.csv, groups.csv and {', '.join(p.name for p in paths)} to {out}"
          + (f" (plots also in {args.img})" if args.img else ""))
    groups.attrs = {"terms": terms_table(), "leave_one_tp_out": loto}
    if np.isnan(groups.prefill_serving).any():
        print("(serving-level MAPE missing where --quick skipped every run of a group)")
    return groups


if __name__ == "__main__":
    main()
