"""Generated blocks of docs/engines.md: each engine's defaults, SGLang parity, the engine study."""

from __future__ import annotations

import json
from pathlib import Path

from tools.docs.doc_format import Drift

ROOT = Path(__file__).resolve().parents[2]


def engines_defaults(runs) -> str:
    """The table of what each engine preset sets (from simsched.config.presets)."""
    from simsched import SimConfig
    from simsched.config.engines import ENGINE_OPTIONS

    rows = ["| field | vllm (`vllm_v1`) | sglang | trtllm |", "|---|---|---|---|"]
    cfgs = [SimConfig.preset(n) for n in ("vllm_v1", "sglang", "trtllm")]
    fields = [("scheduler", "max_num_batched_tokens"), ("scheduler", "max_num_seqs"),
              ("scheduler", "enable_chunked_prefill"), ("cache", "block_size"),
              ("cache", "enable_prefix_caching"), ("hardware", "engine_overhead"),
              ("hardware", "all_reduce")]
    for part, name in fields:
        values = [getattr(getattr(c, part), name) for c in cfgs]
        rows.append(f"| `{part}.{name}` | " + " | ".join(f"`{v}`" for v in values) + " |")
    for engine in ("sglang", "trtllm"):
        for name, value in ENGINE_OPTIONS[engine].items():
            cells = ["", "", ""]
            cells[1 if engine == "sglang" else 2] = f"`{value}`"
            rows.append(f"| `engine_options.{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def engines_parity(runs) -> str:
    """The parity sentence, from what benchmarks/engines/parity.py recorded."""
    r = json.loads((ROOT / "benchmarks" / "engines" / "sglang_parity.json").read_text())
    fams = ", ".join(f"{f} {v['identical']:,}/{v['cases']:,}" for f, v in r["families"].items())
    return (f"Against SGLang {r['sglang_version']}'s own classes: {r['identical']:,} of "
            f"{r['cases']:,} seeded cases identical batch for batch ({fams}; "
            f"{r['batches']:,} batches, {r['retractions']:,} retractions).\n")


def engines_choice(runs) -> str:
    """The engine study's table and saturation points (experiments.engine_choice)."""
    table = runs.get("engine_choice")
    from experiments.engine_choice import saturation_points

    points = saturation_points(table)
    lines = ["| engine | rate (req/s) | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | "
             "throughput (req/s) | preemptions | state |", "|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {r.engine} | {r.rate:g} | {r.ttft_p50 * 1e3:.1f} | "
                     f"{r.ttft_p99 * 1e3:.1f} | {r.tpot_p50 * 1e3:.2f} | "
                     f"{r.request_throughput:.2f} | {int(r.num_preemptions)} | {r.saturation} |")
    sat = "; ".join(f"{p.engine} stable up to {p.max_stable_rate:g} req/s, saturated from "
                    f"{p.first_saturated_rate:g} (peak {p.peak_request_throughput:.2f} req/s)"
                    for p in points.itertuples())
    if points.peak_request_throughput.min() <= 0:
        raise Drift("engine_choice: an engine served nothing")
    return "\n".join(lines) + f"\n\nWhere each saturates: {sat}.\n"


def _pct(x: float) -> str:
    return "-" if x != x else f"{x:.0f}"


def engines_silicon(runs) -> str:
    """Coverage and errors of experiments.engine_silicon on the SGLang / TensorRT-LLM rows, with
    the check of single named per-engine terms (leaving one (GPU, model) group out)."""
    from tools.docs.doc_format import claim

    table = runs.get("engine_silicon")
    if table.empty:
        return "(the silicon rows are not beside this checkout: nothing to show)\n"
    summ, cov, terms = table.attrs["summary"], table.attrs["coverage"], table.attrs["terms"]
    names = {"sglang": "SGLang", "trtllm": "TensorRT-LLM"}
    lines = []
    for engine in ("sglang", "trtllm"):
        c = cov[cov.engine == engine]
        total, ok = int(c.rows.sum()), int(c[c.reason == "expressible"].rows.sum())
        others = "; ".join(f"{r.reason}: {r.rows}" for r in c.itertuples()
                           if r.reason != "expressible")
        lines.append(f"{names[engine]}: {ok} of {total} rows simulated ({others}).")
    lines += ["", "| engine | kernels | rows | median abs. TTFT error % (signed) | median abs. "
              "TPOT error % (signed) | worst group TTFT / TPOT % |", "|---|---|---|---|---|---|"]
    for r in summ.itertuples():
        lines.append(f"| {names[r.engine]} | {r.kernels} | {r.expressible} | "
                     f"{_pct(r.ttft_error)} ({_pct(r.ttft_bias)}) | {_pct(r.tpot_error)} "
                     f"({_pct(r.tpot_bias)}) | {_pct(r.worst_ttft_group)} / "
                     f"{_pct(r.worst_tpot_group)} |")
    default = summ[summ.kernels == "default"]
    claim(bool((default.ttft_bias < 0).all()), "TTFT is simulated too short for both engines")
    lines += ["", "One named term per engine fitted on that engine's rows (default kernels, first "
              "order; reported, not shipped), median abs. error %: before, in-sample, leaving one "
              "(GPU, model) group out:", "",
              "| engine | term | fitted value | before | in-sample | leave-one-group-out |",
              "|---|---|---|---|---|---|"]
    for r in terms[terms.kernels == "default"].itertuples():
        value = (f"{r.value_ms:.1f} ms" if r.term != "kernel_per_layer"
                 else f"{1e3 * r.value_ms:.0f} us")
        lines.append(f"| {names[r.engine]} | `{r.term}` ({r.metric.upper()}) | {value} | "
                     f"{_pct(r.before)} | {_pct(r.in_sample)} | {_pct(r.loo)} |")
    return "\n".join(lines) + "\n"


def engines_aic_runs(runs) -> str:
    """experiments.aic_runs: AIConfigurator's own runs per engine under each serving
    assumption (its generator's deployment and client, or InferenceX's client and defaults)."""
    from tools.docs.doc_format import claim

    table = runs.get("aic_runs")
    if table.empty:
        return "(the silicon rows are not beside this checkout: nothing to show)\n"
    summ, grp = table.attrs["summary"], table.attrs["groups"]
    names = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
    lines = ["| engine | served as | rows | median abs. TTFT error % (signed) | median abs. TPOT "
             "error % (signed) |", "|---|---|---|---|---|"]
    for r in summ.itertuples():
        lines.append(f"| {names[r.engine]} | {r.variant} | {r.rows} | {_pct(r.ttft_error)} "
                     f"({_pct(r.ttft_bias)}) | {_pct(r.tpot_error)} ({_pct(r.tpot_bias)}) |")
    by = {(r.engine, r.variant): r for r in summ.itertuples()}
    claim(by["sglang", "generator"].ttft_error < by["sglang", "inferencex"].ttft_error,
          "the generator's deployment brings SGLang's TTFT closer")
    claim(by["trtllm", "generator"].ttft_error < by["trtllm", "inferencex"].ttft_error,
          "the generator's deployment brings TensorRT-LLM's TTFT closer")
    lines += ["", "Per (GPU, model), SGLang (median abs. TTFT / TPOT error %, signed in "
              "brackets):", "", "| GPU | model | rows | " + " | ".join(
                  v for v in ("generator", "generator, mixed chunk on",
                              "generator, mixed chunk off", "inferencex")) + " |",
              "|---|---|---|---|---|---|---|"]
    sg = grp[grp.backend == "sglang"]
    for (gpu, model), part in sg.groupby(["gpu", "model"], sort=False):
        cells = []
        for v in ("generator", "generator, mixed chunk on", "generator, mixed chunk off",
                  "inferencex"):
            r = part[part.variant == v].iloc[0]
            cells.append(f"{_pct(r.ttft_error)} ({_pct(r.ttft_bias)}) / {_pct(r.tpot_error)}")
        lines.append(f"| {gpu} | {model} | {int(part.rows.iloc[0])} | " + " | ".join(cells) + " |")
    reused = "generator, 100 prompts reused"
    for engine in ("sglang", "trtllm"):
        claim(by[engine, reused].tpot_error > by[engine, "generator"].tpot_error,
              f"aiperf's reused prompts take {engine}'s TPOT further off")
    lines += ["", "Per (GPU, model), every engine: a prompt per request (`generator`) or "
              "aiperf's 100 prompts reused (median abs. TTFT / TPOT error %, signed in "
              "brackets):", "", "| engine | GPU | model | rows | generator | 100 prompts "
              "reused |", "|---|---|---|---|---|---|"]
    for (engine, gpu, model), part in grp.groupby(["backend", "gpu", "model"], sort=False):
        cells = []
        for v in ("generator", reused):
            r = part[part.variant == v].iloc[0]
            cells.append(f"{_pct(r.ttft_error)} ({_pct(r.ttft_bias)}) / {_pct(r.tpot_error)} "
                         f"({_pct(r.tpot_bias)})")
        lines.append(f"| {names[engine]} | {gpu} | {model} | {int(part.rows.iloc[0])} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def engines_terms_transfer(runs) -> str:
    """experiments.terms_transfer: vLLM's fitted silicon terms on the SGLang and TensorRT-LLM
    rows (held out: fitted on vLLM's rows only)."""
    from tools.docs.doc_format import claim

    table = runs.get("terms_transfer")
    if table.empty:
        return "(the silicon rows are not beside this checkout: nothing to show)\n"
    summ, grp = table.attrs["summary"], table.attrs["groups"]
    names = {"sglang": "SGLang", "trtllm": "TensorRT-LLM"}
    lines = ["| engine | terms | rows | median abs. TTFT error % (signed) | median abs. TPOT "
             "error % (signed) |", "|---|---|---|---|---|"]
    for r in summ.itertuples():
        label = "without them" if r.variant == "without" else "vLLM's fitted terms added"
        lines.append(f"| {names[r.engine]} | {label} | {r.rows} | {_pct(r.ttft_error)} "
                     f"({_pct(r.ttft_bias)}) | {_pct(r.tpot_error)} ({_pct(r.tpot_bias)}) |")
    by = {(r.engine, r.variant): r for r in summ.itertuples()}
    sg_ship, sg_terms = by["sglang", "without"], by["sglang", "vllm terms"]
    claim(sg_terms.ttft_error < sg_ship.ttft_error and sg_terms.tpot_error < sg_ship.tpot_error,
          "vLLM's terms bring SGLang's TTFT and TPOT closer")
    claim(by["trtllm", "vllm terms"].ttft_error > by["trtllm", "without"].ttft_error,
          "vLLM's terms make TensorRT-LLM's TTFT worse")
    lines += ["", "Signed median error % per (engine, GPU, model, layout), without vLLM's terms "
              "-> with them:", "",
              "| engine | GPU | model | layout | rows | TTFT | TPOT |", "|---|---|---|---|---|---|---|"]
    for r in grp.to_dict("records"):
        ttft, tpot = (f"{_pct(r[m + ' without'])} -> {_pct(r[m + ' vllm terms'])}"
                      for m in ("ttft", "tpot"))
        lines.append(f"| {names[r['backend']]} | {r['gpu']} | {r['model']} | {r['layout']} | "
                     f"{r['rows']} | {ttft} | {tpot} |")
    return "\n".join(lines) + "\n"
