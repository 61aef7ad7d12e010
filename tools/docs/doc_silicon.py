"""The generated blocks of docs/validation_silicon.md (see tools.docs.check_docs): coverage and
errors of ``experiments.validate_silicon`` on the vLLM rows of the silicon set, with the
catalog's default kernels and with each GPU's AIConfigurator tables."""

from __future__ import annotations

import pandas as pd

from tools.docs.doc_format import claim


def _pct(x: float) -> str:
    return "-" if pd.isna(x) else f"{x:.0f}"


def _headline(table: pd.DataFrame) -> dict:
    return table.attrs["summary"]


# The errors table is of the vllm_v1 profile (neutral silicon terms): nothing fitted on these
# rows. The default profile adds the terms fitted on them (block silicon-terms: in sample and
# leaving each group out); on AIConfigurator's tables it leaves them out, so "aic" is both.
NEUTRAL = ("--terms", "neutral")


def silicon_coverage(runs) -> str:
    """How many vLLM rows are expressible, and why not for the rest."""
    table = runs.get("validate_silicon", *NEUTRAL)
    if table.empty:
        return "(the silicon rows are not beside this checkout: nothing to show)\n"
    cov = table.attrs["coverage"]
    mine = table[table.backend == "vllm"]
    lines = [f"{int(mine.expressible.sum())} of {len(mine)} vLLM rows (of {len(table)} rows in "
             f"`hopper.csv`) are simulated; the others:", "",
             "| reason | rows |", "|---|---|"]
    for r in cov.itertuples():
        if r.reason != "expressible":
            lines.append(f"| {r.reason} | {r.rows} |")
    return "\n".join(lines) + "\n"


def silicon_errors(runs) -> str:
    """Median absolute TTFT/TPOT error per (GPU, model, precision, layout), both kernel
    choices, the vllm_v1 profile (nothing fitted on these rows)."""
    default = runs.get("validate_silicon", *NEUTRAL)
    if default.empty:
        return "(the silicon rows are not beside this checkout: nothing to show)\n"
    aic = runs.get("validate_silicon", "--kernels", "aiconfigurator")
    a, b = _headline(default), _headline(aic)
    claim(a["expressible"] == b["expressible"], "both profiles simulate the same rows")
    g = default.attrs["groups"].merge(aic.attrs["groups"], on=["gpu", "model", "precision",
                                                                "layout", "rows"],
                                      suffixes=("", "_aic"))
    lines = ["| | rows | median abs. TTFT error % | median abs. TPOT error % | worst group TTFT "
             "/ TPOT % |", "|---|---|---|---|---|"]
    for name, s in (("default kernels", a), ("AIConfigurator kernels", b)):
        lines.append(f"| {name} | {s['expressible']} | {_pct(s['ttft_error'])} | "
                     f"{_pct(s['tpot_error'])} | {_pct(s['worst_ttft_group'])} / "
                     f"{_pct(s['worst_tpot_group'])} |")
    lines += ["", "Per (GPU, model, precision, layout), median absolute error % (signed median "
              "in brackets: below 0, simulated too fast), default kernels | AIConfigurator "
              "kernels:", "",
              "| GPU | model | precision | layout | rows | TTFT | TPOT | TTFT (aic) | "
              "TPOT (aic) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in g.itertuples():
        lines.append(f"| {r.gpu} | {r.model} | {r.precision} | {r.layout} | {r.rows} | "
                     f"{_pct(r.ttft_error)} ({_pct(r.ttft_bias)}) | "
                     f"{_pct(r.tpot_error)} ({_pct(r.tpot_bias)}) | "
                     f"{_pct(r.ttft_error_aic)} ({_pct(r.ttft_bias_aic)}) | "
                     f"{_pct(r.tpot_error_aic)} ({_pct(r.tpot_bias_aic)}) |")
    return "\n".join(lines) + "\n"


def _client_kind(row) -> str:
    if "assumed" in row.client:
        return "AIConfigurator's own runs (client and flags not published: assumed)"
    if row.recipe.startswith("InferenceX"):
        return "InferenceX's client and launch script"
    return "InferenceX's client, engine defaults (no script published)"


def silicon_clients(runs) -> str:
    """The default profile's errors split by what is known of how a row was served."""
    table = runs.get("validate_silicon")
    if table.empty:
        return "(the silicon rows are not beside this checkout: nothing to show)\n"
    mine = table[(table.backend == "vllm") & table.expressible].copy()
    mine["kind"] = [_client_kind(r) for r in mine.itertuples()]
    lines = ["| rows served with | rows | median abs. TTFT error % | median abs. TPOT error % |",
             "|---|---|---|---|"]
    parts = list(mine.groupby("kind", sort=True)) + [("every vLLM row", mine)]
    for kind, part in parts:
        lines.append(f"| {kind} | {len(part)} | {100 * part.ttft_error.abs().median():.1f} | "
                     f"{100 * part.tpot_error.abs().median():.1f} |")
    return "\n".join(lines) + "\n"


def silicon_prefill(runs) -> str:
    """One prefill at C = 4 as served against the kernel sums (experiments.silicon_prefill)."""
    g = runs.get("silicon_prefill")
    if g.empty:
        return "(the silicon rows are not beside this checkout: nothing to show)\n"
    lines = ["| GPU | model | layout | prompt | TTFT measured / simulated (ms) | prefill step "
             "simulated / implied (ms) | implied / simulated | GEMMs (of which routed experts) "
             "/ attention / all-reduce, simulated (ms) |", "|---|---|---|---|---|---|---|---|"]
    for r in g.itertuples():
        lines.append(f"| {r.gpu} | {r.model} | {r.layout} | {r.isl:,} | {r.ttft_ms:.0f} / "
                     f"{r.sim_ttft_ms:.0f} | {r.step_ms:.0f} / {r.implied_step_ms:.0f} | "
                     f"{r.ratio:.2f} | {r.linear_ms:.1f} ({r.experts_ms:.1f}) / "
                     f"{r.attention_ms:.1f} / {r.comm_ms:.1f} |")
    ratio = g.groupby("model").ratio.median()
    lines += ["", "Median implied / simulated per model: " + ", ".join(
        f"{m} {v:.2f}" for m, v in ratio.sort_values().items()) + "."]
    return "\n".join(lines) + "\n"


def silicon_device(runs) -> str:
    """The H200 device measurements (benchmarks/device/h200_prefill_sustained.py's recorded
    output)."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "device" / \
        "h200_prefill_sustained_results.json"
    rows = json.loads(path.read_text())["rows"]
    gemm = [r for r in rows if r["experiment"] == "gemm"]
    attn = [r for r in rows if r["experiment"] == "prefill_attention"]
    eager = [r for r in rows if r["experiment"] == "eager_vs_graph"]
    lines = ["| GEMMs of a Llama-3.1-70B layer (TP 1) | tokens | one by one (TFLOP/s) | a whole "
             "80-layer prefill back to back (TFLOP/s) | back to back / one by one | SM clock "
             "(MHz) | power (W) |", "|---|---|---|---|---|---|---|"]
    for r in gemm:
        t = r["telemetry"] or {}
        lines.append(f"| {r['dtype']} | {r['tokens']:,} | {r['isolated_tflops']:.0f} | "
                     f"{r['sustained_tflops']:.0f} | {r['sustained_over_isolated']:.2f} | "
                     f"{t.get('sm_clock_mhz_median', float('nan')):.0f} | "
                     f"{t.get('power_w_median', float('nan')):.0f} |")
    lines += ["", "Prefill attention (64 query / 8 KV heads of 128, causal, bf16) per layer: "
              + ", ".join(f"{r['ms_per_layer']:.3f} ms at {r['tokens']:,} tokens "
                          f"({r['tflops']:.0f} TFLOP/s)" for r in attn) + ".", "",
              "| decoder stack, 32 layers | tokens | eager, wall (ms) | CUDA graph (ms) | eager "
              "extra per layer (us) |", "|---|---|---|---|---|"]
    for r in eager:
        shard = "Llama-3-8B layer" if r["tp_shard"] == 1 else f"its TP {r['tp_shard']} shard"
        lines.append(f"| {shard} | {r['tokens']:,} | {r['eager_wall_ms']:.1f} | "
                     f"{r['graph_ms']:.1f} | {r['eager_extra_per_layer_us']:.0f} |")
    return "\n".join(lines) + "\n"


def silicon_terms(runs) -> str:
    """The fitted silicon terms and their in-sample and leave-one-group-out figures, as the
    shipped file records them (experiments.fit_silicon_terms --update)."""
    from simsched.cost import vllm_silicon

    rec = vllm_silicon.shipped()
    if "errors" not in rec:
        return "(no fit recorded: run `python -m experiments.fit_silicon_terms --update`)\n"
    t = rec["terms"]
    lines = ["| term | value | unit | leave-one-group-out range |", "|---|---|---|---|"]
    folds = pd.DataFrame(rec["folds"])
    for name in vllm_silicon.TERMS:
        unit, k = vllm_silicon.UNITS[name]
        lines.append(f"| `{name}` | {t[name] * k:.3g} | {unit} | {folds[name].min() * k:.3g}"
                     f"-{folds[name].max() * k:.3g} |")
    lines += ["", f"Fitted on {rec['fitted_on']}. Median absolute error % (worst (GPU, model) "
              "group):", "",
              "| terms | rows | TTFT | TPOT | worst group TTFT / TPOT |", "|---|---|---|---|---|"]
    # The record's "shipped" figures are the neutral pass: the vllm_v1 profile.
    names = {"shipped": "`vllm_v1` (no silicon terms)",
             "insample": "fitted, in-sample", "logo": "fitted, leave-one-group-out"}
    for key, label in names.items():
        e = rec["errors"][key]
        lines.append(f"| {label} | {e['rows']} | {_pct(e['ttft_error'])} | "
                     f"{_pct(e['tpot_error'])} | {_pct(e['worst_ttft_group'])} / "
                     f"{_pct(e['worst_tpot_group'])} |")
    lines += ["", "Per (GPU, model) group, median absolute error % (signed median in brackets), "
              "`vllm_v1` | leave-one-group-out (the default, `vllm_silicon`):", "",
              "| GPU | model | rows | TTFT | TPOT | TTFT (LOGO) | TPOT (LOGO) |",
              "|---|---|---|---|---|---|---|"]
    for r in rec.get("groups", []):
        lines.append(f"| {r['gpu']} | {r['model']} | {r['rows']} | "
                     f"{_pct(r['shipped_ttft'])} ({_pct(r['shipped_ttft_bias'])}) | "
                     f"{_pct(r['shipped_tpot'])} ({_pct(r['shipped_tpot_bias'])}) | "
                     f"{_pct(r['logo_ttft'])} ({_pct(r['logo_ttft_bias'])}) | "
                     f"{_pct(r['logo_tpot'])} ({_pct(r['logo_tpot_bias'])}) |")
    return "\n".join(lines) + "\n"


# The dense models of the vLLM rows, whose decode step is GEMMs, attention and all-reduces.
DENSE = ("llama-3.1-70b-fp8", "qwen3-32b")
MEASURED_AR = ("--all-reduce", "measured")
VLLM_AR = ("--profiles", "vllm_silicon,vllm_silicon_measured_ar")


def silicon_all_reduce(runs) -> str:
    """The custom all-reduce from AIConfigurator's measured tables (hardware.all_reduce) against
    the fitted latency term: per call, on the silicon rows and on the vLLM 0.15 runs."""
    import numpy as np

    from simsched import SimConfig
    from simsched.cost import factory, vllm_v1

    fitted = runs.get("validate_silicon")
    if fitted.empty:
        return "(the silicon rows are not beside this checkout: nothing to show)\n"
    measured = runs.get("validate_silicon", *MEASURED_AR)
    lines = ["One all-reduce of 16 tokens' activations of Llama-3.1-70B (256 KiB), us per call:",
             "", "| GPU | TP | fitted term | measured |", "|---|---|---|---|"]
    for gpu in ("h100-sxm", "h200"):
        for tp in (2, 4, 8):
            per_call = []
            for choice in ("fitted", "measured"):
                cfg = SimConfig().replace(model="llama-3.1-70b-fp8", gpu=gpu,
                                          tensor_parallel_size=tp, all_reduce=choice)
                cm = factory.make_cost_model(cfg.hardware)
                per_call.append(cm._comm[16] / vllm_v1.num_collectives(cm.kernels) * 1e6)
            lines.append(f"| {gpu} | {tp} | {per_call[0]:.1f} | {per_call[1]:.1f} |")
    a, b = _headline(fitted), _headline(measured)
    claim(a["expressible"] == b["expressible"], "both choices simulate the same rows")
    vllm = runs.get("validate_vllm", *VLLM_AR)
    multi = vllm[vllm.tp > 1]
    lines += ["", "| custom all-reduce | silicon rows | TTFT | TPOT | vLLM 0.15 runs at TP >= 2 "
              "| their E2E: median / worst |", "|---|---|---|---|---|---|"]
    for name, s, profile in (("fitted term (default)", a, "vllm_silicon"),
                             ("measured (`all_reduce=\"measured\"`)", b,
                              "vllm_silicon_measured_ar")):
        e2e = multi[multi.profile == profile].e2e_mean_error.abs()
        lines.append(f"| {name} | {s['expressible']} | {_pct(s['ttft_error'])} | "
                     f"{s['tpot_error']:.1f} | {len(e2e)} | {e2e.median():.1f} / "
                     f"{e2e.max():.1f} |")
    lines += ["", "Dense models' TPOT, signed median error % by TP (below 0: simulated too "
              "fast), fitted / measured:", "", "| GPU | model | " + " | ".join(
                  f"TP {tp}" for tp in (1, 2, 4, 8)) + " |", "|---|---|---|---|---|---|"]
    for (gpu, model), part in fitted[fitted.model.isin(DENSE) & fitted.expressible
                                     & fitted.layout.str.fullmatch(r"tp\d")].groupby(
                                         ["gpu", "model"]):
        cells = []
        for tp in (1, 2, 4, 8):
            f = part[part.layout == f"tp{tp}"]
            m = measured[measured.id.isin(f.id)]
            cells.append("-" if f.empty else f"{np.median(f.tpot_error) * 100:+.0f} / "
                                             f"{np.median(m.tpot_error) * 100:+.0f}")
        lines.append(f"| {gpu} | {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def silicon_host_time(runs) -> str:
    """The rows of vLLM up to 0.12 simulated without async scheduling, with the host-time terms
    fitted on them (experiments.fit_host_time), under both all-reduce choices."""
    from simsched.cost import host_time

    fitted = runs.get("fit_host_time")
    if fitted.empty:
        return "(the silicon rows are not beside this checkout: nothing to show)\n"
    measured = runs.get("fit_host_time", *MEASURED_AR)
    lines = ["| all-reduce | run | sync rows | TTFT | TPOT | every vLLM row: TTFT | TPOT |",
             "|---|---|---|---|---|---|---|"]
    for name, table in (("fitted term", fitted), ("measured", measured)):
        for r in table.itertuples():
            lines.append(f"| {name} | {r.run} | {r.rows} | {r.ttft_error:.1f} | "
                         f"{r.tpot_error:.1f} | {r.all_ttft_error:.1f} | {r.all_tpot_error:.1f} |")
    lines += ["", "| all-reduce | term | fitted on every sync row | leave-one-group-out range |",
              "|---|---|---|---|"]
    for name, table in (("fitted term", fitted), ("measured", measured)):
        folds = table.attrs["folds"]
        for term in host_time.TERMS:
            unit, k = host_time.UNITS[term]
            lines.append(f"| {name} | `{term}` | {table.attrs['terms'][term] * k:.3g} {unit} | "
                         f"{folds[term].min() * k:.3g}-{folds[term].max() * k:.3g} |")
    g = measured.attrs["groups"]
    runs_shown = ("async on (simsched's recipe)", "async off, leave-one-group-out")
    lines += ["", "Per (GPU, model) group with measured all-reduces, signed median error % "
              "(TTFT / TPOT), async scheduling on | off with the terms left out of the fit:",
              "", "| GPU | model | rows | async on | async off (leave-one-group-out) |",
              "|---|---|---|---|---|"]
    on = g[g.run == runs_shown[0]].set_index(["gpu", "model"])
    off = g[g.run == runs_shown[1]].set_index(["gpu", "model"])
    for key, r in on.iterrows():
        o = off.loc[key]
        lines.append(f"| {key[0]} | {key[1]} | {r.rows} | {r.ttft_bias:+.0f} / "
                     f"{r.tpot_bias:+.0f} | {o.ttft_bias:+.0f} / {o.tpot_bias:+.0f} |")
    return "\n".join(lines) + "\n"
