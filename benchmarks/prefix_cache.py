"""What prefix caching costs in wall time: trace replays on vs off, and lookup cost vs cache size.

``python -m benchmarks.prefix_cache [--quick] [--repeat N]``

1. The bundled Mooncake synthetic trace (3,993 requests with ``hash_ids``, Llama-3.1-8B, one
   A100-80GB), replayed at its recorded rate and at 0.5 req/s, caching on vs off. Target: on costs
   at most 2x off.
2. The Azure 2023 conversation trace (19,366 requests, no hashes: nothing can be shared), FCFS on
   Llama-2-7B, caching on vs off. Target: on within 1.1x of off.
3. One lookup (``PrefixCache.match``) of a 1,000-block prompt (20 segments) against caches of
   10^3 to 10^6 blocks filled with other prefixes: the time must not grow with the cache.

Each replay is timed ``--repeat`` times (default 3, after one warm-up that reads the trace) in CPU
seconds of this process (``time.process_time``: other processes on a shared machine do not count)
and the fastest is reported.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from simsched import SimConfig, simulate
from simsched.engine.kv.prefix_cache import PrefixCache
from simsched.request import Content, Request
from simsched.workloads.hash_ids import merged_hash_segments
from simsched.workloads.workload import WorkloadConfig, generate
from benchmarks.common import add_record_option, record, refuse_quick_record


def best_time(cfg: SimConfig, repeat: int) -> tuple[float, int]:
    """Fewest CPU seconds of ``repeat`` runs (after a warm-up) and the iteration count."""
    res = simulate(cfg)
    times = []
    for _ in range(repeat):
        started = time.process_time()
        simulate(cfg)
        times.append(time.process_time() - started)
    return min(times), len(res.iterations)


def replay(name: str, cfg: SimConfig, repeat: int) -> float:
    """Print one on/off comparison; return the ratio."""
    off, it_off = best_time(cfg.replace(**{"cache.enable_prefix_caching": False}), repeat)
    on, it_on = best_time(cfg.replace(**{"cache.enable_prefix_caching": True}), repeat)
    print(f"{name:<34}{off:>9.2f}{on:>9.2f}{on / off:>8.2f}{it_off:>12}{it_on:>12}")
    return on / off


def lookup_us(num_blocks: int, calls: int = 2000) -> float:
    """Mean microseconds of one ``match`` of a 1,000-block prompt against a full cache."""
    block = 16
    kv = PrefixCache(num_blocks, block)
    # Fill the cache with released 20-block prefixes that share nothing with the probe.
    for i in range(num_blocks // 20):
        content = Content.from_segments([((9, i), 20 * block)], (0, i))
        r = Request(i, 0.0, 20 * block, 1, content=content)
        kv.acquire(r, 0)
        kv.allocate(i, 20 * block)
        kv.free(i, 20 * block)
    segments = [((7, s), 50 * block) for s in range(20)]
    owner = Request(-1, 0.0, 1000 * block, 1, content=Content.from_segments(segments, (0, -1)))
    probe = Request(-2, 0.0, 1000 * block + 5, 1,
                    content=Content.from_segments(segments + [((8, 0), 5)], (0, -2)))
    kv.acquire(owner, 0)
    kv.allocate(-1, 1000 * block)              # the probe's 1,000 blocks are cached (evicting)
    kv.free(-1, 1000 * block)
    assert kv.match(probe)[1] == 1000
    started = time.perf_counter()
    for _ in range(calls):
        kv.match(probe)
    return (time.perf_counter() - started) / calls * 1e6


def main(argv=None) -> dict:
    """Run the three comparisons and print their figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="first 1,000 Mooncake requests, 10 "
                                                        "minutes of Azure, smaller caches")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per case (default 3)")
    add_record_option(p)
    args = p.parse_args(argv)
    refuse_quick_record(p, args)
    lookups = []
    warnings.simplefilter("ignore")     # ten Mooncake prompts exceed the context: rejected
    n = 1000 if args.quick else None
    print(f"{'replay (CPU s, caching off vs on)':<34}{'off s':>9}{'on s':>9}{'ratio':>8}"
          f"{'iters off':>12}{'iters on':>12}")
    ratios = {}
    moon = SimConfig(workload=WorkloadConfig.preset("mooncake", num_requests=n))
    moon = moon.replace(model="llama-3.1-8b")
    ratios["mooncake"] = replay("mooncake, recorded rate", moon, args.repeat)
    ratios["mooncake_0.5"] = replay("mooncake, 0.5 req/s", moon.replace(rate=0.5), args.repeat)
    azure = SimConfig(workload=WorkloadConfig.preset("azure-conv",
                                                     duration=600.0 if args.quick else None))
    ratios["azure_conv"] = replay("azure-conv (no hashes), FCFS", azure, args.repeat)
    print(f"\n{'cache blocks':>12}{'us per lookup (1,000-block prompt)':>38}")
    for size in ((10**3, 10**4, 10**5) if args.quick else (10**3, 10**4, 10**5, 10**6)):
        lookups.append(lookup_us(max(size, 1000)))
        print(f"{size:>12}{lookups[-1]:>38.2f}")
    table = generate(WorkloadConfig.preset("mooncake"), np.random.default_rng(0))
    merged = merged_hash_segments(table["hash_ids"].tolist(), table["num_prompt_tokens"], 512)
    print(f"\nMooncake prompt: {table['hash_ids'].map(len).mean():.1f} trace blocks, "
          f"{np.mean([len(m) for m in merged]):.2f} segments after path compression")
    print(f"\nMooncake on/off {ratios['mooncake']:.2f}x (target <= 2), "
          f"at 0.5 req/s {ratios['mooncake_0.5']:.2f}x; "
          f"Azure conv on/off {ratios['azure_conv']:.2f}x (target <= 1.1)")
    if args.record:
        record("prefix_cache", "full", {**ratios, "lookup_us_min": min(lookups),
                                        "lookup_us_max": max(lookups)})
    return ratios


if __name__ == "__main__":
    main()
