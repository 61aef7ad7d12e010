"""Refit the A100 cost model from the bundled profiles; print error tables and save a plot.

    python -m experiments.calibrate_a100 [--quick] [--out out/calibrate_a100/]

The coefficients the simulator uses are exactly :func:`simsched.cost.calibration.fit_all` on the
bundled data (fitted at first use), i.e. what this script reports.
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments._common import parser as make_parser
from experiments._common import save_plot
from simsched.cost import calibration as cal
from simsched.cost import report
from simsched.cost.hardware import GPUS, MODELS, REFERENCE_GPU


def _plot():
    from matplotlib.figure import Figure

    gpu = GPUS[REFERENCE_GPU]
    fig = Figure(figsize=(15, 9))
    axes = fig.subplots(2, 3)
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
    return fig


def main(argv=None) -> dict:
    """Fit, print the seen and leave-one-model-out error tables, write the plot and JSON.

    Returns the tables: ``linear`` (per model and TP) and ``components``.
    """
    parser = make_parser("calibrate_a100", __doc__,
                         "tables only: skip the measured-vs-predicted plot")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    lin = report.linear_errors()
    print("Linear ops (all layers), MAPE % over 1..4096 tokens, A100-80GB")
    print("  seen = the simulator's linear term (measured table, interpolated, monotone);")
    print("  interp_holdout = interpolation judged on every other point after dropping it;")
    print("  roofline_seen = roofline fitted on all models; loo = roofline fitted without it")
    print(lin.round(2).to_string(index=False))
    print("\nPer model (mean over TP):")
    print(lin.groupby("model")[["seen", "interp_holdout", "roofline_seen", "loo"]].mean().round(2).to_string())
    print("\nPer TP (mean over models):")
    print(lin.groupby("tp")[["seen", "interp_holdout", "roofline_seen", "loo"]].mean().round(2).to_string())
    print(f"\nOverall: seen {lin.seen.mean():.2f} %, roofline seen {lin.roofline_seen.mean():.2f} %,"
          f" leave-one-model-out {lin.loo.mean():.2f} % (worst {lin.loo.max():.2f} %)")
    comp = cal.component_errors()
    print("\nOther components, MAPE % on their own measurements:")
    print(comp.round(2).to_string(index=False))

    (out / "coefficients.json").write_text(json.dumps(cal.fit_all(), indent=1))
    lin.to_csv(out / "linear_errors.csv", index=False)
    comp.to_csv(out / "component_errors.csv", index=False)
    print(f"\nwrote coefficients.json and error tables to {out}/")
    if not args.quick and save_plot(out / "measured_vs_predicted.png", _plot):
        print(f"wrote {out / 'measured_vs_predicted.png'}")
    return {"linear": lin, "components": comp}


if __name__ == "__main__":
    main()
