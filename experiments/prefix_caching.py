"""Prefix caching: hit rate, TTFT, throughput across cache sizes; FCFS vs LPM; multi-turn sessions.

Four studies, each caching off vs on (vLLM V1 automatic prefix caching semantics)::

    python -m experiments.prefix_caching [--out out/prefix_caching] [--quick]

1. ``mooncake``: the bundled Mooncake synthetic trace (3,993 requests, mean prompt 15.3k tokens,
   shared prefixes named by ``hash_ids``) on Llama-3.1-8B / one A100-80GB, replayed at 0.5 req/s
   (the recorded 3.9 req/s is far beyond one GPU), with caches of 1x to 32x the GPU's 19,477
   blocks (the larger ones stand for a CPU/SSD-backed KV store such as Mooncake's) and one that
   never evicts.
2. ``mooncake_policy``: FCFS vs LPM on that trace at 4x the GPU cache, two replay rates.
3. ``shared_prefix``: 64 groups, each a 2,048-token system prompt, + 128-token questions and
   128-token outputs, Poisson 6 req/s, Llama-2-7B / A100; the groups' prompts (8,192 blocks)
   exceed every cache tried, so the order of service decides what stays cached: FCFS vs LPM.
4. ``sessions``: closed-loop conversations with 1 to 32 turns (new user tokens uniform 50-300,
   outputs uniform 50-400, think time exponential with mean 5 s), 960 requests offered at
   3 req/s in total (sessions arrive at 3/turns per second), Llama-3.1-8B / A100.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import simsched
from experiments.load_sweep import print_table, write_frames
from simsched import SimConfig
from simsched.workloads.workload import WorkloadConfig, generate
from experiments._common import parser as make_parser

GPU_BLOCKS = 19477      # Llama-3.1-8B on one A100-80GB at 90 % memory, 16-token blocks
METRICS = ("prefix_hit_rate", "ttft_p50", "ttft_p99", "request_throughput",
           "num_evicted_blocks")


def run(cfg: SimConfig, **labels) -> dict:
    """One simulation: its labels and the summary metrics of interest."""
    started = time.perf_counter()
    res = simsched.simulate(cfg)
    s = res.summary()
    s["ttft_p50"] = s.get("ttft_p50", s.get("ttft_median"))
    row = dict(labels)
    row.update({m: s.get(m) for m in METRICS})
    row.update(num_finished=s["num_finished"], num_rejected=s["num_rejected"],
               mean_prompt_tokens=float(res.requests["num_prompt_tokens"].mean()),
               wall_s=time.perf_counter() - started)
    return row


def caching(on: bool) -> dict:
    """The config change for prefix caching on or off."""
    return {"cache.enable_prefix_caching": on}


def mooncake(quick: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Caching off/on across cache sizes, then FCFS vs LPM."""
    n = 1200 if quick else None
    wl = WorkloadConfig.preset("mooncake", rate=0.5, num_requests=n)
    base = SimConfig.preset("classic", workload=wl).replace(model="llama-3.1-8b")
    sizes = (1, 4, 16) if quick else (1, 2, 4, 8, 16, 32)
    rows = [run(base.replace(**caching(on), **{"cache.num_blocks": k * GPU_BLOCKS}),
                cache_x_gpu=k, num_blocks=k * GPU_BLOCKS, caching="on" if on else "off")
            for k in sizes for on in (False, True)]
    # A cache that never evicts: the trace's own bound at these arrival times.
    table = generate(wl, np.random.default_rng(0))
    unbounded = int((table["num_prompt_tokens"] + table["num_output_tokens"]).sum()) // 16 + 1
    rows.append(run(base.replace(**caching(True), **{"cache.num_blocks": unbounded}),
                    cache_x_gpu=unbounded / GPU_BLOCKS, num_blocks=unbounded, caching="on"))
    policy = [run(base.replace(rate=rate, policy=pol, **caching(True),
                               **{"cache.num_blocks": 4 * GPU_BLOCKS}),
                  rate=rate, policy=pol)
              for rate in ((0.5,) if quick else (0.5, 1.0)) for pol in ("fcfs", "lpm")]
    return pd.DataFrame(rows), pd.DataFrame(policy)


def shared_prefix(quick: bool) -> pd.DataFrame:
    """Caching off, on with FCFS, on with LPM, across cache sizes."""
    n = 600 if quick else 1500
    wl = WorkloadConfig(name="shared-prefix", system_prompt_len=2048, num_prefix_groups=64,
                        prompt_len=128, output_len=128, rate=6.0, num_requests=n)
    base = SimConfig.preset("classic", workload=wl).replace(max_sim_time=2 * n / 6.0 + 60)
    sizes = (2048, 7422) if quick else (1024, 2048, 4096, 7422)
    variants = {"off": (False, "fcfs"), "on fcfs": (True, "fcfs"), "on lpm": (True, "lpm")}
    return pd.DataFrame([run(base.replace(policy=pol, **caching(on), **{"cache.num_blocks": b}),
                             num_blocks=b, variant=name)
                         for b in sizes for name, (on, pol) in variants.items()])


def sessions(quick: bool) -> pd.DataFrame:
    """TTFT against turns per session, caching off vs on, at a fixed offered request rate."""
    total, rate = (320 if quick else 960), 3.0
    rows = []
    for turns in ((1, 4, 16) if quick else (1, 2, 4, 8, 16, 32)):
        wl = WorkloadConfig(name="sessions", num_turns=turns, rate=rate / turns,
                            num_requests=total // turns, think_time=("exponential", 5.0),
                            lengths="uniform", prompt_range=(50, 300), output_range=(50, 400))
        base = SimConfig.preset("classic", workload=wl).replace(model="llama-3.1-8b")
        rows += [run(base.replace(**caching(on)), turns=turns, caching="on" if on else "off")
                 for on in (False, True)]
    return pd.DataFrame(rows)


def main(argv=None) -> dict[str, pd.DataFrame]:
    """Run the four studies; print and write their tables."""
    p = make_parser("prefix_caching", __doc__, "fewer sizes, shorter runs")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")   # ten Mooncake prompts exceed 128k tokens: rejected, noted
    out = Path(args.out)
    t0 = time.time()
    tables = {}
    tables["mooncake"], tables["mooncake_policy"] = mooncake(args.quick)
    tables["shared_prefix"] = shared_prefix(args.quick)
    tables["sessions"] = sessions(args.quick)
    write_frames(out, **tables)
    for name, table in tables.items():
        print(f"\n== {name}")
        print_table(table.drop(columns=["wall_s"]), out)
    print(f"\n{time.time() - t0:.0f} s")
    return tables


if __name__ == "__main__":
    main()
