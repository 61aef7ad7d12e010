"""Fit the GPU power model (simsched/cost/power.py) on measured serving power, and report its
leave-one-configuration-out error on joules per output token.

Data: the average and peak power columns of ``../shared/data/real-serving/splitwise-perf-model.csv``
(DGX-A100, Llama-2-70B at TP 2/4/8 and BLOOM-176B at TP 8, static batches; power normalised to
TDP). Each configuration (model, TP, prompt, batch, output; five repeats averaged) gives its
prefill's and its decode's compute and memory utilisation (roofline: FLOPs and bytes over the
measured times and the datasheet peaks) and its measured average power; the model's average over
the run is linear in the three fractions, so they are fitted by least squares. A configuration
whose average power is below half its (model, TP) group's median is a recording failure (three
8,192-token prompts that read 0.17-0.18 x TDP where their neighbours read 0.39-0.68) and is left
out, as the script prints. J per output token = average power x TDP x GPUs x E2E time / tokens,
so its error is the average power's.

    python -m experiments.calibrate_power            # fit, print leave-one-out figures
    python -m experiments.calibrate_power --update   # and write simsched/cost/data/power_fit.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from simsched.cost import hardware, shapes
from simsched.cost.power import FIT_PATH

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "real-serving" \
    / "splitwise-perf-model.csv"
MODELS = {"llama2-70b": "llama-2-70b", "bloom-176b": "bloom-176b"}
GPUS = {"a100-80gb": "a100-80gb"}
KEYS = ["model", "hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size"]


def active_params(spec) -> float:
    """Parameters one token is multiplied through: dense weights, the routed experts it is sent
    to, and the LM head (half the embedding pair, as a token's lookup costs no FLOPs)."""
    c = shapes.param_counts(spec)
    share = spec.experts_per_token / spec.num_experts if spec.num_experts else 0.0
    return c["dense"] + c["experts"] * share + c["embedding"] / 2


def configurations(path: Path = DATA) -> pd.DataFrame:
    """One row per measured configuration with power: its features and measured power."""
    d = pd.read_csv(path)
    g = d.groupby(KEYS).mean(numeric_only=True).reset_index()
    g = g[(g["average_power"] > 0) & g["hardware"].isin(list(GPUS))].copy()
    median = g.groupby(["model", "hardware", "tensor_parallel"])["average_power"].transform("median")
    g["recording_failure"] = g["average_power"] < 0.5 * median
    rows = []
    for r in g.itertuples(index=False):
        spec, gpu = hardware.MODELS[MODELS[r.model]], hardware.GPUS[GPUS[r.hardware]]
        tp = int(r.tensor_parallel)
        n, wb = active_params(spec), shapes.weight_bytes(spec, tp)
        kv = shapes.kv_bytes_per_token(spec, tp)
        b, p, t = r.batch_size, r.prompt_size, r.token_size
        prefill_time, step_time = r.prompt_time / 1e3, r.token_time / 1e3
        decode_time = (t - 1) * step_time
        e2e = prefill_time + decode_time
        util = {"c_prefill": 2 * n * b * p / tp / (prefill_time * gpu.peak_flops),
                "m_prefill": (wb + kv * b * p) / (prefill_time * gpu.mem_bandwidth),
                "c_decode": 2 * n * b / tp / (step_time * gpu.peak_flops),
                "m_decode": (wb + kv * b * (p + t / 2)) / (step_time * gpu.mem_bandwidth)}
        wp, wd = prefill_time / e2e, decode_time / e2e
        rows.append({**{k: getattr(r, k) for k in KEYS}, **util,
                     "compute": wp * util["c_prefill"] + wd * util["c_decode"],
                     "memory": wp * util["m_prefill"] + wd * util["m_decode"],
                     "e2e_time": e2e, "average_power": r.average_power,
                     "recording_failure": bool(r.recording_failure)})
    return pd.DataFrame(rows)


def fit(frame: pd.DataFrame) -> np.ndarray:
    """(active_floor, compute_weight, memory_weight) by least squares."""
    x = np.column_stack([np.ones(len(frame)), frame["compute"], frame["memory"]])
    coef, *_ = np.linalg.lstsq(x, frame["average_power"].to_numpy(), rcond=None)
    return coef


def predict(coef: np.ndarray, frame: pd.DataFrame) -> np.ndarray:
    return np.minimum(1.0, coef[0] + coef[1] * frame["compute"] + coef[2] * frame["memory"])


def leave_one_out(frame: pd.DataFrame) -> pd.DataFrame:
    """Each configuration predicted from a fit on the others: relative error of J per token."""
    out = []
    for k in range(len(frame)):
        rest = frame.drop(frame.index[k])
        pred = float(predict(fit(rest), frame.iloc[[k]]).iloc[0])
        true = float(frame["average_power"].iloc[k])
        out.append({**{key: frame[key].iloc[k] for key in KEYS},
                    "measured": true, "predicted": pred, "error": abs(pred - true) / true})
    return pd.DataFrame(out)


def data_hash(path: Path = DATA) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def result(path: Path = DATA) -> dict:
    """The fit as shipped: coefficients, data hash, leave-one-out summary."""
    frame = configurations(path)
    used = frame[~frame["recording_failure"]].reset_index(drop=True)
    coef = fit(used)
    loo = leave_one_out(used)
    groups = {}
    for (model, tp), g in used.groupby(["model", "tensor_parallel"]):
        rest = used[~((used["model"] == model) & (used["tensor_parallel"] == tp))]
        err = np.abs(predict(fit(rest), g) - g["average_power"]) / g["average_power"]
        groups[f"{model} tp{tp}"] = round(float(np.median(err)), 4)
    return {"coefficients": {"active_floor": float(coef[0]), "compute_weight": float(coef[1]),
                             "memory_weight": float(coef[2])},
            "source": "splitwise-perf-model.csv (DGX-A100; SplitwiseSim, MIT)",
            "data_sha256_16": data_hash(path), "num_configurations": int(len(used)),
            "num_left_out_as_recording_failures": int(frame["recording_failure"].sum()),
            "loo_joules_per_token_error_median": round(float(loo["error"].median()), 4),
            "loo_joules_per_token_error_max": round(float(loo["error"].max()), 4),
            "leave_group_out_error_median": groups}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="write the shipped fit")
    parser.add_argument("--quick", action="store_true",
                        help="accepted for uniformity (the fit takes well under a second)")
    parser.add_argument("--out", default="out/calibrate_power",
                        help="directory for power_fit.json and loo.csv (default out/calibrate_power)")
    parser.add_argument("--quiet", action="store_true", help="accepted for uniformity")
    args = parser.parse_args(argv)
    if not DATA.is_file():
        raise SystemExit(f"calibrate_power: {DATA} not found (the shared data folder)")
    res = result()
    print(json.dumps(res, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "power_fit.json").write_text(json.dumps(res, indent=1) + "\n")
    frame = configurations()
    leave_one_out(frame[~frame["recording_failure"]].reset_index(drop=True)).to_csv(
        out / "loo.csv", index=False)
    print(f"wrote {out}/: power_fit.json, loo.csv")
    if args.update:
        FIT_PATH.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {FIT_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
