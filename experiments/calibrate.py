"""Refit every measured GPU's kernel terms from the bundled profiles; print error tables, save plots.

    python -m experiments.calibrate [--quick] [--gpu all|a100-80gb|h200] [--out out/calibrate/]
                                    [--img DIR]
    python -m experiments.calibrate --update     # maintainers: refit and write the shipped fits

The coefficients the simulator uses are these fits on the bundled data, shipped as package data
(``simsched/cost/data/fits/*.json``, :mod:`simsched.cost.fits`); runs never fit. After changing
bundled data or fit code, ``--update`` refits every registered fit (kernel profiles first, then the
fits that replay through them) and rewrites those files; ``tests/test_fits.py`` fails until then. A100-80GB: Vidur's kernel profiles (linear ops seen and leave-one-model-out,
attention, all-reduce, CPU). H200: this project's operator profiles, before (the A100
extrapolation simsched used) and after (the H200 fits), leave-one-model-out per family, and whole
decode steps against the simulator's GPU time. ``--img`` also copies the plots there; ``--quick``
skips the plots.
``python -m experiments.calibrate_a100`` is the A100 part alone (its old name).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.cost import calibration as cal
from simsched.cost import calibration_h200 as h200
from simsched.cost import report
from simsched.cost.base import Batch
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost import fits, serving  # noqa: F401  (serving registers its fit)
from simsched.cost.profiles import PROFILES
from simsched.cost.hardware import GPUS, MODELS, REFERENCE_GPU, describe
from experiments._common import parser as make_parser
from experiments._common import try_plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def a100_plot(out: Path) -> Path:
    """Linear ops per profiled model (measured vs leave-one-model-out roofline) and attention."""
    plt = _pyplot()
    gpu = GPUS[REFERENCE_GPU]
    fig, axes = plt.subplots(2, 3, figsize=(15, 9))
    for ax, model in zip(axes.flat, cal.PROFILED_MODELS):
        loo = cal.fit_linear(exclude=model)
        for tp in sorted(cal.load("compute").query("model == @model").tp.unique()):
            n, meas, _ = cal.measured_linear(model, tp)
            keep = n <= 4096
            n, meas = n[keep], meas[keep]
            layers = MODELS[model].num_layers
            line, = ax.plot(n, meas * layers * 1e3, lw=2, alpha=0.5, label=f"measured tp{tp}")
            ax.plot(n, cal.predict_linear(loo, MODELS[model], int(tp), gpu, n) * layers * 1e3,
                    "--", color=line.get_color(), label=f"roofline LOO tp{tp}")
        ax.set(title=f"{model}: linear ops, all layers", xlabel="tokens", ylabel="ms",
               xscale="log", yscale="log")
        ax.legend(fontsize=7)
    ax = axes.flat[-1]
    coef = cal.fit_all()
    pre = cal.load("attention_prefill")
    ax.scatter(pre.time_ms, cal.predict_prefill_attention(coef["prefill_attention"], pre.chunk,
                                                          pre.kv) * 1e3, s=2, label="prefill attn")
    dec = cal.load("attention_decode")
    ax.scatter(dec.time_ms, cal.predict_decode_attention(
        coef["decode_attention"], dec.batch, dec.batch * dec.kv * cal.ATTN_REF_KV_BYTES) * 1e3,
        s=2, label="decode attn")
    lim = [1e-2, 3]
    ax.plot(lim, lim, "k:")
    ax.set(title="attention per layer (70B shape, tp2)", xlabel="measured ms",
           ylabel="predicted ms", xscale="log", yscale="log")
    ax.legend()
    fig.tight_layout()
    path = out / "measured_vs_predicted.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def a100(out: Path, plot: bool = True) -> list[Path]:
    """Print the A100 tables (as ``calibrate_a100`` always did); write CSVs and the plot."""
    lin = report.linear_errors()
    print("A100-80GB linear ops (all layers), MAPE % over 1..4096 tokens")
    print("  seen = the simulator's linear term (measured table, interpolated, monotone);")
    print("  interp_holdout = interpolation judged on every other point after dropping it;")
    print("  roofline_seen = roofline fitted on all models; loo = roofline fitted without it")
    cols = ["seen", "interp_holdout", "roofline_seen", "loo"]
    print(lin.round(2).to_string(index=False))
    print("\nPer model (mean over TP):")
    print(lin.groupby("model")[cols].mean().round(2).to_string())
    print("\nPer TP (mean over models):")
    print(lin.groupby("tp")[cols].mean().round(2).to_string())
    print(f"\nOverall: seen {lin.seen.mean():.2f} %, roofline seen {lin.roofline_seen.mean():.2f} %,"
          f" leave-one-model-out {lin.loo.mean():.2f} % (worst {lin.loo.max():.2f} %)")
    comp = cal.component_errors()
    print("\nOther A100 components, MAPE % on their own measurements:")
    print(comp.round(2).to_string(index=False))
    lin.to_csv(out / "linear_errors.csv", index=False)
    comp.to_csv(out / "component_errors.csv", index=False)
    return try_plots(lambda: [a100_plot(out)]) if plot else []


def h200_steps() -> pd.DataFrame:
    """Whole decode steps of a Llama-3-8B shape on the H200 (context 1,024) against the model's
    GPU time (``engine_overhead="none"``), before (A100 extrapolation, and with the 2023 CPU
    overhead, ``measured_2023``, the default then) and after."""
    spec = MODELS["llama-3-8b"]
    legacy = report._legacy_gpu("h200")
    models = {
        "before": CalibratedCostModel(spec, legacy, 1, "llama-3-8b",
                                      engine_overhead="measured_2023"),
        "before_gpu_only": CalibratedCostModel(spec, legacy, 1, "llama-3-8b",
                                               engine_overhead="none"),
        "after_gpu_only": CalibratedCostModel(spec, GPUS["h200"], 1, "llama-3-8b",
                                              engine_overhead="none"),
        "after_overlapped": CalibratedCostModel(spec, GPUS["h200"], 1, "llama-3-8b",
                                                engine_overhead="overlapped")}
    rows = []
    for r in h200.load("iteration").itertuples():
        b = Batch([], [], r.batch, r.batch * r.context)
        row = {"batch": r.batch, "measured_gpu_ms": r.graph_gpu_ms,
               "measured_roundtrip_ms": r.graph_roundtrip_ms}
        row.update({f"{k}_ms": m.iteration_time(b) * 1e3 for k, m in models.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def h200_plot(errs_points: dict, out: Path) -> Path:
    """Parity per operator family: the A100 extrapolation (before) and the H200 fit (after)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 5))
    for ax, family in zip(axes, h200.FAMILIES):
        meas, before, after = (np.concatenate(errs_points[family][k]) * 1e3
                               for k in ("meas", "before", "after"))
        ax.scatter(meas, before, s=8, color="0.6", label="before (A100 extrapolation)")
        ax.scatter(meas, after, s=8, color="tab:red", label="after (H200 fit)")
        lo, hi = min(meas.min(), after.min()) * 0.7, max(meas.max(), before.max()) * 1.4
        ax.plot([lo, hi], [lo, hi], "k:")
        ax.set(xscale="log", yscale="log", xlabel="measured ms per layer",
               ylabel="predicted ms per layer", title=f"H200 {family}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "h200_parity.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _h200_points() -> dict:
    """Measured, before and after predictions per family, for the parity plot."""
    gpu = GPUS["h200"]
    full = h200.fit_all()
    pts = {f: {"meas": [], "before": [], "after": []} for f in h200.FAMILIES}
    for model in h200.H200_MODELS:
        spec = MODELS[model]
        for tp in sorted(h200.compute_frame().query("model == @model").tp.unique()):
            tp = int(tp)
            n, meas = h200.measured_linear(model, tp)
            no_rope = cal.elementwise_bytes(spec, tp, n) - cal.elementwise_bytes(spec, tp, n, False)
            a100_lin = cal.fit_all()["linear"]
            pts["linear"]["meas"].append(meas)
            pts["linear"]["before"].append(
                cal.predict_linear(a100_lin, spec, tp, gpu, n) - no_rope * a100_lin["elt_per_byte"]
                * GPUS[REFERENCE_GPU].mem_bandwidth / gpu.mem_bandwidth)
            pts["linear"]["after"].append(h200.predict_linear(full["linear"], spec, tp, gpu, n,
                                                              rope=False))
            hq, hkv = h200.heads(model, tp)
            pre = h200.load("attn_prefill").query("model == @model and tp == @tp")
            pts["prefill attention"]["meas"].append(pre.prefill_attention_ms.to_numpy() * 1e-3)
            pts["prefill attention"]["before"].append(
                report._a100_extrapolated_attention(spec, tp, gpu, n=pre.num_tokens))
            pts["prefill attention"]["after"].append(
                h200.predict_prefill_attention(full["prefill_attention"], pre.num_tokens, hq))
            dec = h200.load("attn_decode").query("model == @model and tp == @tp")
            if len(dec):
                pts["decode attention"]["meas"].append(dec.decode_attention_ms.to_numpy() * 1e-3)
                pts["decode attention"]["before"].append(report._a100_extrapolated_attention(
                    spec, tp, gpu, batch=dec.batch, context=dec.context))
                pts["decode attention"]["after"].append(h200.predict_decode_attention(
                    full["decode_attention"], h200.decode_bytes(dec.batch, dec.context, hkv)))
    return pts


def h200_section(out: Path, plot: bool = True, tables: dict | None = None) -> list[Path]:
    """Print the H200 tables; write CSVs and the parity plot (the tables also into ``tables``)."""
    errs = report.h200_errors()
    print("\nH200 operator fits, MAPE % per (model, TP) on the bundled profile "
          "(before = simsched's A100 extrapolation; fit = H200 fit on all four models; "
          "loo = fit without the model; table = the measured table simsched uses for a "
          "profiled linear op, judged on held-out midpoints):")
    print(errs.round(2).to_string(index=False))
    summary = report.family_summary(errs)
    print("\nH200 per family (point-weighted MAPE %; loo_worst_model = the worst held-out "
          "model's MAPE):")
    print(summary.round(2).to_string())
    coef = h200.fit_all()
    lin, pre, dec = coef["linear"], coef["prefill_attention"], coef["decode_attention"]
    print(f"\nH200 fitted terms: GEMM efficiency {min(lin['eff']):.2f}-{max(lin['eff']):.2f} of "
          f"989 TFLOP/s / 4.8 TB/s roofline + {lin['gemm_const'] * 1e6:.2f} us per GEMM; "
          f"element-wise {lin['elt_const'] * 1e6:.1f} us + {1 / lin['elt_per_byte'] / 1e12:.2f} "
          f"TB/s; prefill attention {pre['c0'] * 1e6:.2f} us + {pre['c_tok'] * 1e9:.2f} ns/token "
          f"+ {pre['c_tok_head'] * 1e12:.1f} ps/token/head + causal FLOPs at "
          f"{1 / pre['s_flop'] / 1e12:.0f} TFLOP/s; decode attention {dec['a0'] * 1e6:.2f} us + "
          f"KV bytes at {1 / dec['s_hbm'] / 1e12:.2f} TB/s (first {dec['l2_bytes'] / 1e6:.0f} MB "
          f"at {1 / max(dec['s_l2'], 1e-30) / 1e12:.0f} TB/s in the profile: L2 reuse between "
          f"back-to-back replays, not used in serving)")
    steps = h200_steps()
    print("\nH200 whole decode steps, Llama-3-8B shape, context 1,024 (ms; measured with CUDA "
          "graphs, h200/iteration.csv):")
    print(steps.round(2).to_string(index=False))
    err = (steps.after_gpu_only_ms / steps.measured_gpu_ms - 1) * 100
    print(f"after_gpu_only vs measured GPU time: {err.min():+.1f} to {err.max():+.1f} % (the "
          f"step runs kernels the operator profile lacks: fp32 RMSNorm as several kernels, the "
          f"KV write, the argmax)")
    errs.to_csv(out / "h200_errors.csv", index=False)
    summary.to_csv(out / "h200_summary.csv")
    steps.to_csv(out / "h200_steps.csv", index=False)
    if tables is not None:
        tables.update(h200_errors=errs, h200_summary=summary, h200_coefficients=coef,
                      h200_steps=steps)
    return try_plots(lambda: [h200_plot(_h200_points(), out)]) if plot else []


def update() -> list[Path]:
    """Refit every registered fit and write its shipped file, kernel profiles first (the
    ``eager_2023`` fit replays runs through their tables). Returns the files written."""
    written = []
    order = sorted(fits.registered().values(), key=lambda f: f.name not in PROFILES)
    for fit in order:
        written.append(fit.write())
        fits.coefficients.cache_clear()   # later fits read what was just written
        print(f"wrote {written[-1]} (source hash {fit.source_hash()})")
    return written


def main(argv=None) -> dict:
    """Fit, print every measured GPU's tables, write plots, CSVs and coefficients.json; return
    the H200 tables (``h200_errors``, ``h200_summary``, ``h200_coefficients``, ``h200_steps``)."""
    parser = make_parser("calibrate", __doc__, "tables only, no plots")
    parser.add_argument("--gpu", default="all", choices=["all", REFERENCE_GPU, "h200"])
    parser.add_argument("--img", default=None, help="also copy the plots here (docs/img)")
    parser.add_argument("--update", action="store_true",
                        help="refit every shipped fit and rewrite simsched/cost/data/fits/ "
                             "(maintainers, after changing bundled data or fit code)")
    args = parser.parse_args(argv)
    if args.update:
        update()
        return {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("GPU catalog: what is measured and what is extrapolated")
    print(describe() + "\n")
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        plots, tables = [], {}
        if args.gpu in ("all", REFERENCE_GPU):
            plots += a100(out, plot=not args.quick)
        if args.gpu in ("all", "h200"):
            plots += h200_section(out, plot=not args.quick, tables=tables)
    (out / "coefficients.json").write_text(json.dumps(
        {name: p.coefficients() for name, p in PROFILES.items() if p.fit is not None}, indent=1))
    if args.img:
        Path(args.img).mkdir(parents=True, exist_ok=True)
        for p in plots:
            shutil.copy(p, Path(args.img) / p.name)
    print(f"\nwrote {''.join(p.name + ', ' for p in plots)}coefficients.json and error tables "
          f"to {out}")
    return tables


if __name__ == "__main__":
    main()
