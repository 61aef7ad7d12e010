"""``load_sweep --concurrency``: what a fixed-concurrency benchmark measures, and what the old
stand-in for it got wrong.

``vllm bench serve --max-concurrency C`` (as InferenceX runs it: the random dataset, here 1,024
input and 128 output tokens at range ratio 0, infinite request rate, ``--ignore-eos``, 2C
warm-ups left out) on the default engine, for C from 1 to 128; next to it the stand-in simsched
had before its benchmark clients: every request at t = 0 with ``max_num_seqs = C``, which counts
TTFT from t = 0 instead of from the client's send. Prints, per C, the client's TTFT (p50, p99),
TPOT p50, output throughput and the most requests in flight, and the stand-in's TTFT p50; writes
the table and each run's requests::

    python -m experiments.load_sweep --concurrency [--out out/load_sweep] [--quick]
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pandas as pd

from experiments._common import print_table, write_frames
from simsched import SimConfig
from simsched.api import simulate
from simsched.config import ClientConfig

__all__ = ["client_config", "concurrency_sweep", "stand_in_config"]


def client_config(concurrency: int, num_prompts: int) -> SimConfig:
    """``vllm bench serve --max-concurrency C`` over the random dataset (1,024 -> 128)."""
    return SimConfig().replace(client=ClientConfig(
        client_type="concurrency", max_concurrency=concurrency, dataset="random",
        random_input_len=1024, random_output_len=128, num_prompts=num_prompts,
        num_warmups=2 * concurrency))


def stand_in_config(concurrency: int, num_prompts: int) -> SimConfig:
    """The same prompts all arriving at t = 0, the engine capped at C sequences."""
    return SimConfig().replace(name="custom", arrival="deterministic", rate=1e12,
                               num_requests=num_prompts, lengths="fixed", prompt_len=1024,
                               output_len=128, max_num_seqs=concurrency)


def concurrency_sweep(args) -> pd.DataFrame:
    """Run the sweep (``args``: load_sweep's parsed flags); return its table, one row per C
    (``--quick``: C = 1, 4, 16 with 48 prompts each)."""
    out = Path(args.out)
    warnings.simplefilter("ignore")
    levels = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128]
    t0 = time.time()
    rows, frames = [], []
    for conc in levels:
        num_prompts = 48 if args.quick else max(200, 10 * conc)
        res = simulate(client_config(conc, num_prompts))
        s = res.summary()
        old = simulate(stand_in_config(conc, num_prompts)).summary()
        rows.append({"max_concurrency": conc, "num_prompts": num_prompts,
                     "ttft_p50": s["ttft_p50"], "ttft_p99": s["ttft_p99"],
                     "tpot_p50": s["tpot_p50"], "output_throughput": s["output_throughput"],
                     "max_num_in_flight": res.info["client"]["max_num_in_flight"],
                     "stand_in_ttft_p50": old["ttft_p50"]})
        frames.append(res.requests.assign(max_concurrency=conc))
    table = pd.DataFrame(rows)
    print(f"{2 * len(levels)} runs in {time.time() - t0:.0f} s; TTFT and TPOT in seconds, "
          "output throughput in tokens/s")
    print_table(table, digits=4)
    write_frames(out, concurrency=table, requests=pd.concat(frames, ignore_index=True))
    print(f"wrote {out}/")
    return table
