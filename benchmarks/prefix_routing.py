"""Cache-aware routing on a large cluster: prefix_affinity with and without its prefix index.

``python -m benchmarks.prefix_routing [--replicas N] [--num-requests N]``

A shared-prefix workload (a 1,024-token system prompt per group, 256 groups) on 64 replicas with
prefix caching, routed by ``prefix_affinity``. With the index (``PrefixHolders``, fed by the
caches' node events) the router scores only the replicas caching the prompt's first blocks;
without it, every replica. Both runs route identically (checked); the script prints the CPU time
of each whole ``simulate`` call and their ratio.
"""

from __future__ import annotations

import argparse
import time

from simsched import SimConfig, simulate
from simsched.cluster import state
from simsched.workloads.workload import WorkloadConfig
from benchmarks.common import add_record_option, record


def main(argv=None) -> None:
    """Run both ways and print CPU times, the ratio and the hit rate."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--num-requests", type=int, default=40_000)
    add_record_option(parser)
    args = parser.parse_args(argv)
    if args.record and (args.replicas, args.num_requests) != (64, 40_000):
        parser.error("--record keeps the default run's figures: drop --replicas/--num-requests")
    wl = WorkloadConfig(name="shared-prefix", system_prompt_len=1024, num_prefix_groups=256,
                        prompt_len=128, output_len=64, rate=20.0 * args.replicas,
                        num_requests=args.num_requests)
    cfg = SimConfig(workload=wl).replace(num_replicas=args.replicas,
                                         enable_prefix_caching=True, router="prefix_affinity")
    started = time.process_time()
    indexed = simulate(cfg)
    with_index = time.process_time() - started
    attach = state.PrefixHolders.attach
    state.PrefixHolders.attach = classmethod(lambda cls, replicas: None)
    try:
        started = time.process_time()
        scanned = simulate(cfg)
        without = time.process_time() - started
    finally:
        state.PrefixHolders.attach = attach
    same = indexed.requests.equals(scanned.requests)
    print(f"{args.replicas} replicas, {args.num_requests:,} shared-prefix requests, "
          f"prefix_affinity: CPU {with_index:.2f} s with the prefix index, {without:.2f} s "
          f"scoring every replica ({without / with_index:.2f}x); prefix hit rate "
          f"{indexed.summary()['prefix_hit_rate']:.3f}; same routing: {same}")
    if args.record:
        record("prefix_routing", "full", {
            "with_index_s": with_index, "without_index_s": without,
            "ratio": without / with_index, "same_routing": bool(same),
            "prefix_hit_rate": indexed.summary()["prefix_hit_rate"]})


if __name__ == "__main__":
    main()
