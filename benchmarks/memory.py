"""Peak memory of a run with 1,000,000 requests (target <= 512 MiB peak RSS).

``python -m benchmarks.memory [--num-requests N]``

The lesson workload at a load the engine sustains (Llama-2-7B, one A100-80GB, 256 sequences);
per-token gaps are kept as per-step arrays, never one Python object per token. Requests are
created at arrival and recorded into arrays when done (simsched.cluster.lazy). The peak includes
``summary()``. pyarrow (pandas' string columns) allocates from its own pool, mimalloc by default,
which keeps some freed memory: the line says which pool ran (``ARROW_DEFAULT_MEMORY_POOL=system``
selects the system allocator).
"""

from __future__ import annotations

import argparse
import time

from benchmarks.common import peak_rss_mb
from benchmarks.common import add_record_option, record
from simsched import SimConfig, simulate


def main(argv=None) -> None:
    """Run once and print wall time, tokens, ITL samples and peak RSS."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=40.0)
    add_record_option(parser)
    args = parser.parse_args(argv)
    if args.record and (args.num_requests, args.rate) != (1_000_000, 40.0):
        parser.error("--record keeps the default run's figures: drop --num-requests/--rate")
    before = peak_rss_mb()
    cfg = SimConfig().replace(num_requests=args.num_requests, rate=args.rate)
    started = time.perf_counter()
    res = simulate(cfg)
    wall = time.perf_counter() - started
    s = res.summary()
    try:
        import pyarrow
        pool = pyarrow.default_memory_pool().backend_name
    except ImportError:
        pool = "none"
    print(f"{args.num_requests} requests, {int(res.requests['num_generated_tokens'].sum())} output "
          f"tokens, {len(res.iterations)} iterations, {res.num_itl_samples} ITL samples; "
          f"wall {wall:.1f} s; finished {s['num_finished']}; "
          f"peak RSS {peak_rss_mb():.0f} MiB (interpreter and imports: {before:.0f} MiB; "
          f"pyarrow pool {pool})")
    if args.record:     # one variant per install: with pyarrow (its memory pool) or without
        record("memory", "plain" if pool == "none" else "pyarrow", {
            "peak_rss_mib": peak_rss_mb(), "import_rss_mib": before, "wall_s": wall,
            "requests": args.num_requests, "iterations_m": len(res.iterations) / 1e6,
            "output_tokens_m": int(res.requests["num_generated_tokens"].sum()) / 1e6,
            "itl_samples_m": res.num_itl_samples / 1e6})


if __name__ == "__main__":
    main()
