"""The generated blocks of README.md and docs/: each function returns one block's Markdown text.

Registered in :data:`tools.docs.check_docs.BLOCKS`; ``runs.get(name, *argv)`` runs an
experiment once per check. Numbers are formatted by :func:`~tools.docs.doc_format.num`;
:func:`~tools.docs.doc_format.claim` fails the check when a statement next to them stops
holding. The blocks of docs/experiments.md and docs/policies.md are in
:mod:`tools.docs.doc_studies`.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from tools.docs.doc_format import claim, md_table, num


def _ms(seconds: float) -> str:
    return f"{num(seconds * 1e3)} ms"


# ----------------------------------------------------------------------------- README


def readme_policy_comparison(runs) -> str:
    """docs/experiments.md (findings at a glance): the main job's three policies."""
    t = runs.get("policy_comparison")
    fcfs, spf, pre = (t.loc[p] for p in ("FCFS", "SPF", "SPF + preemption"))
    claim(spf["ttft_mean"] < fcfs["ttft_mean"], "SPF lowers the mean TTFT")
    claim(pre["ttft_p95"] < min(fcfs["ttft_p95"], spf["ttft_p95"]),
          "SPF + preemption has the lowest p95 TTFT")
    claim(pre["num_preemptions"] > fcfs["num_preemptions"], "preemption preempts more")
    claim(pre["itl_p99"] > fcfs["itl_p99"], "preemption worsens the ITL tail")
    return (f"- **Policy comparison** (lesson workload, 30 req/s, 16 sequences, 96 KV blocks, "
            f"Llama-2-7B on an A100-80GB):\n"
            f"  SPF cuts mean TTFT from {num(fcfs['ttft_mean'])} s (FCFS) to "
            f"{num(spf['ttft_mean'])} s; SPF with admission preemption has the lowest p95 TTFT "
            f"({num(pre['ttft_p95'])} s vs {num(fcfs['ttft_p95'])} s FCFS) but "
            f"{pre['num_preemptions'] / fcfs['num_preemptions']:.1f}× the preemptions "
            f"({int(pre['num_preemptions']):,} vs {int(fcfs['num_preemptions']):,}) and a worse "
            f"ITL tail "
            f"(p99 {_ms(pre['itl_p99'])} vs {_ms(fcfs['itl_p99'])}).")


def _load_sweep_facts(runs) -> dict:
    table = runs.get("load_sweep")
    by = table.attrs["by_rate"].set_index(["variant", "rate"])
    sat = table.set_index("policy")["saturation_rate"]
    cap = table.set_index("policy")["capacity"]
    return {"table": table, "by": by, "sat": sat, "cap": cap}


def readme_experiments(runs) -> str:
    """docs/experiments.md (findings at a glance): one bullet each for saturation, token budget
    and starvation."""
    f = _load_sweep_facts(runs)
    sat, cap, by = f["sat"], f["cap"], f["by"]
    lo, hi = sat.min(), sat.max()
    claim(cap.nunique() == 1, "ordering does not move the p99-TTFT capacity")
    beyond = [r for r in by.loc["fcfs"].index if r >= hi]
    claim(all(by.loc[("spf+preempt", r), "ttft_p99"] == by.xs(r, level="rate")["ttft_p99"].max()
              for r in beyond), "SPF with admission preemption is the worst beyond saturation")
    tb = runs.get("token_budget").set_index("max_num_batched_tokens")
    claim(tb.loc[4096, "ttft_p99"] < tb.loc[256, "ttft_p99"]
          and tb.loc[4096, "itl_p99"] > tb.loc[256, "itl_p99"], "the budget trades TTFT for ITL")
    st = runs.get("starvation")
    short, long = st.index[0], st.index[-1]
    claim(st.loc[short, ("p99", "spf")] < st.loc[short, ("p99", "fcfs")]
          and st.loc[long, ("max", "spf")] > st.loc[long, ("max", "fcfs")],
          "SPF helps short prompts and starves long ones")
    band = f"at {num(lo)} req/s" if lo == hi else f"between {num(lo)} and {num(hi)} req/s"
    return (f"- **Saturation** (ShareGPT lengths): every policy saturates {band} on one A100;\n"
            f"  ordering does not move the p99-TTFT capacity ({num(cap.iloc[0])} req/s), SPF "
            f"keeps the median TTFT low past saturation, and SPF with admission preemption is "
            f"the worst beyond it (recompute wastes the scarce KV).\n"
            f"- **Token budget**: 256 → 4096 tokens per iteration cuts TTFT p99 from "
            f"{num(tb.loc[256, 'ttft_p99'])} s to {num(tb.loc[4096, 'ttft_p99'])} s and raises "
            f"ITL p99 from {_ms(tb.loc[256, 'itl_p99'])} to {_ms(tb.loc[4096, 'itl_p99'])} "
            f"(Sarathi-Serve's trade-off).\n"
            f"- **Starvation**: SPF cuts short prompts' TTFT p99 from "
            f"{num(st.loc[short, ('p99', 'fcfs')])} s to {num(st.loc[short, ('p99', 'spf')])} s "
            f"while 2–4k-token prompts wait up to {num(st.loc[long, ('max', 'spf')])} s "
            f"({num(st.loc[long, ('max', 'fcfs')])} s under FCFS).")


def _cost_facts() -> dict:
    from simsched.config import HardwareConfig
    from simsched.cost import hardware
    from simsched.cost.base import Batch
    from simsched.cost.factory import make_cost_model

    model = make_cost_model(HardwareConfig())
    decode = Batch(num_decode_seqs=1, decode_context_sum=1)
    return {"decode": model.iteration_time(decode), "parts": model.breakdown(decode),
            "engine_overhead": model.engine_overhead,
            "prefill": model.iteration_time(Batch([2048], [0])),
            "blocks": hardware.kv_capacity_blocks(HardwareConfig(), 16),
            "blocks_40": hardware.kv_capacity_blocks(HardwareConfig(gpu="a100-40gb"), 16)}


def _fit_facts(runs) -> dict:
    tables = runs.get("calibrate_a100", "--quick")
    lin = tables["linear"]
    worst = lin.loc[lin["loo"].idxmax()]
    return {"lin": lin, "comp": tables["components"], "seen": lin["seen"].mean(),
            "loo": lin["loo"].mean(), "worst": worst}


def readme_cost(runs) -> str:
    """docs/cost_model.md (overview): KV capacity, two iteration times and the fit errors."""
    c, fit = _cost_facts(), _fit_facts(runs)
    return (f"KV capacity follows vLLM (GPU memory × `gpu_memory_utilization` − weights − "
            f"activation reserve):\n{c['blocks']:,} blocks of 16 tokens for Llama-2-7B on an "
            f"A100-80GB. Llama-2-7B on one A100-80GB:\na lone decode takes "
            f"{_ms(c['decode'])}, a 2048-token prefill {_ms(c['prefill'])}.\n\n"
            f"Fit error of the linear ops over 1…4096 tokens and TP 1/2/4/8: "
            f"{fit['seen']:.2f} % MAPE for profiled models;\n{fit['loo']:.1f} % mean "
            f"({fit['worst']['loo']:.1f} % worst) leave-one-model-out for a model known only "
            f"by its shape.")


def _describe_traces() -> dict:
    from simsched.workloads.workload import WorkloadConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: WorkloadConfig.preset(name).describe()
                for name in ("azure-code", "azure-conv")}


def _zoo(runs) -> dict:
    return runs.get("policy_zoo")


def readme_policy_zoo(runs) -> str:
    """docs/policies.md (overview): three results of the policy zoo."""
    z = _zoo(runs)
    pol = z["policies"].set_index(["policy", "mode"])
    ten = z["tenants"].set_index("policy")
    sty = z["styles"].set_index("style")
    non_preemptive = [p for p, m in pol.index if m == "recompute" and p != "mlfq"]
    best = min(non_preemptive, key=lambda p: pol.loc[(p, "recompute"), "ttft_mean"])
    claim(best == "sjf_oracle", "sjf_oracle has the lowest mean TTFT of the non-preemptive "
                                "policies")
    claim(sty.loc["stall_free", "output_throughput"] > sty.loc["static", "output_throughput"],
          "stall-free beats static batching on throughput")
    return (f"on the Azure conversation trace with a tight cache,\n`sjf_oracle` has the lowest "
            f"mean TTFT of the non-preemptive policies "
            f"({num(pol.loc[('sjf_oracle', 'recompute'), 'ttft_mean'])} s vs "
            f"{num(pol.loc[('fcfs', 'recompute'), 'ttft_mean'])} s FCFS),\n`fair` moves a heavy "
            f"tenant's service share from {ten.loc['fcfs', 'share_t0']:.0%} to "
            f"{ten.loc['fair', 'share_t0']:.0%}, and stall-free beats static\nbatching on "
            f"throughput ({num(sty.loc['stall_free', 'output_throughput'])} vs "
            f"{num(sty.loc['static', 'output_throughput'])} tokens/s).")


# ----------------------------------------------------------------------------- docs/workloads.md


def workloads_traces(runs) -> str:
    """docs/workloads.md: both traces described, and how many prompts exceed a 4k context."""
    from simsched.workloads.workload import WorkloadConfig, generate

    d = _describe_traces()
    over = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in d:
            table = generate(WorkloadConfig.preset(name), np.random.default_rng(0))
            over[name] = int((table["num_prompt_tokens"] > 4096).sum())
    text = "\n\n".join(f"{name}\n{desc}" for name, desc in d.items())
    return (f"```\n{text}\n```\n\nBoth traces hold prompts longer than Llama-2's 4,096-token "
            f"context (code: {over['azure-code']:,},\nconversation: {over['azure-conv']:,}).")


# ----------------------------------------------------------------------------- docs/cost_model.md


def cost_iteration(runs) -> str:
    """docs/cost_model.md: two iteration times, the CPU overhead fit and KV capacity."""
    from simsched.cost import calibration as cal

    c = _cost_facts()
    parts = {k: v for k, v in c["parts"].items()}
    cpu = cal.fit_all()["cpu"]
    claim(c["engine_overhead"] == "vllm_silicon", "the default engine overhead is vllm_silicon")
    return (f"Llama-2-7B on one A100-80GB (default engine, `vllm_silicon`): a lone decode takes "
            f"{_ms(c['decode'])} (linear {num(parts['linear'] * 1e3, 2)}, attention "
            f"{num(parts['attention'] * 1e3, 1)}, overhead {num(parts['overhead'] * 1e3, 1)} ms: "
            f"the CUDA-graph step's host gap); a 2048-token prefill {_ms(c['prefill'])}. The "
            f"fitted CPU work per iteration, `{num(cpu['a'] * 1e3, 2)} ms + "
            f"{num(cpu['a_tp'] * 1e3, 2)} ms·[TP>1] + {num(cpu['b'] * 1e3, 2)} ms × sequences`, "
            f"adds to the GPU time with `measured_2023` and is hidden behind it with "
            f"`vllm_silicon` "
            f"unless longer. KV capacity: Llama-2-7B on an "
            f"A100-80GB at 0.9 gives\n{c['blocks']:,} blocks of 16 tokens ({c['blocks_40']:,} on "
            f"an A100-40GB).")


def cost_fit(runs) -> str:
    """docs/cost_model.md: linear-op fit errors per model and TP, and the other components."""
    fit = _fit_facts(runs)
    lin, comp = fit["lin"], fit["comp"]
    tps = sorted(lin["tp"].unique())
    rows = []
    for model, group in lin.groupby("model", sort=False):
        by_tp = group.set_index("tp")
        rows.append([model] + [f"{by_tp.loc[tp, 'seen']:.2f} / {by_tp.loc[tp, 'loo']:.2f}"
                               if tp in by_tp.index else "–" for tp in tps])
    table = pd.DataFrame(rows, columns=["model"] + [f"TP{tp} seen / LOO" for tp in tps])
    worst = fit["worst"]
    parts = comp.groupby("component", sort=False)["mape"].agg(["min", "max"])
    cpu = comp[comp["component"] == "cpu overhead"].sort_values("mape")
    others = "; ".join(
        f"{name} {lo:.1f} %" if abs(hi - lo) < 0.05 else f"{name} {lo:.1f}–{hi:.1f} %"
        for name, (lo, hi) in parts.drop(index="cpu overhead", errors="ignore").iterrows())
    return "\n".join([
        md_table(table),
        "",
        f"Overall: seen {fit['seen']:.2f} %, leave-one-model-out {fit['loo']:.2f} % (worst "
        f"{worst['loo']:.1f} %, {worst['model']} at TP{worst['tp']}). Other parts on\ntheir own "
        f"measurements: {others}; CPU overhead {cpu['mape'].iloc[0]:.1f}–"
        f"{cpu['mape'].iloc[-2]:.1f} % ({cpu['mape'].iloc[-1]:.0f} % for "
        f"{cpu['subset'].iloc[-1]}).",
    ])
