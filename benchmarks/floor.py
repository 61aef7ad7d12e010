"""simsched against a bare lazy-decode SimPy loop on the same trace and cost model (the floor).

``python -m benchmarks.floor [--quick] [--repeat N] [--instructions] [--preset NAME]``

The floor is the least a SimPy continuous-batching simulator can do per iteration: one GPU
process, one counter advancing every decode (the lazy-decode idea simsched uses), a token budget
and a sequence cap, FCFS admission with chunked prefill, KV blocks reserved for the whole request
at admission (so it never preempts), one SimPy process per request woken at its first token and
completion, and only first-token and finish times recorded. No policies, no preemption, no
invariants, no iteration log, no result frames. simsched replays the same trace with its default
config (FCFS, the calibrated model and its default engine profile, ``vllm_v1``: async
scheduling and quiet runs on), or ``--preset``'s; both loops are timed (wall clock: reading this process's
CPU clock costs a system call, more than a floor iteration's work) between their first and last
cost-model call, so start-up and frame building are excluded from
both, on a timed copy of the cost model that keeps its engine profile and promises
(:func:`benchmarks.common.timed_as_is`: a wrapper without them would time a synchronous run
without quiet runs, which is not what the default runs). Ratios are measured within one run,
best of N.
:func:`floor_loop` also runs several replicas on one clock (``num_replicas``, round robin), which
:mod:`benchmarks.cluster` uses as the floor of a cluster.

``--instructions`` counts instead of timing (needs valgrind): each loop runs under cachegrind once
and three times, and the difference over two gives one call's instructions, first-level data-cache
misses and mispredicted branches (``simulate`` whole, frames included; ``floor_loop`` whole).
Counts do not depend on the machine's load, so they show where a wall-time ratio comes from.
"""

from __future__ import annotations

import argparse
import math
from collections import deque

import numpy as np
import simpy

from benchmarks.common import cachegrind_per_call, print_count_ratios, timed_as_is
from benchmarks.common import add_record_option, record
from simsched import SimConfig, simulate
from simsched.cost.base import Batch
from simsched.cost.factory import make_cost_model
from simsched.cost.hardware import kv_capacity_blocks
from simsched.workloads.workload import WorkloadConfig, generate


def floor_loop(arrival, prompt, output, cost, budget: int, max_seqs: int, num_blocks: int,
               block_size: int, num_replicas: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Run the bare loop; return (first_token_at, finished_at) per request.

    ``num_replicas`` > 1: that many GPU processes on one clock, requests dealt round robin (the
    least routing there is), each replica with its own queue, KV blocks and decode counter.
    """
    env = simpy.Environment()
    n = len(arrival)
    first_at = np.full(n, math.nan)
    finish_at = np.full(n, math.nan)
    events: dict[int, tuple] = {}

    def replica():
        """Start one replica's GPU process; return the function that queues a request on it."""
        waiting: deque = deque()
        state = {"idle": None, "free": num_blocks}
        prefilling: dict[int, int] = {}      # id -> prompt tokens computed
        decoding: dict[int, int] = {}        # id -> finish step
        finish_due: dict[int, list] = {}
        ctx_base_sum = [0]
        ctx_base: dict[int, int] = {}
        step = [0]

        def add(i):
            waiting.append(i)
            if state["idle"] is not None and not state["idle"].triggered:
                state["idle"].succeed()

        def gpu():
            while True:
                if not (waiting or prefilling or decoding):
                    state["idle"] = env.event()
                    yield state["idle"]
                    state["idle"] = None
                    continue
                n_dec = len(decoding)
                left = budget - n_dec
                planned = []
                for i, done in prefilling.items():
                    if left <= 0:
                        break
                    c = min(prompt[i] - done, left)
                    planned.append((i, c, done))
                    left -= c
                while waiting and left > 0 and len(prefilling) + n_dec < max_seqs:
                    i = waiting[0]
                    need = -(-(prompt[i] + output[i]) // block_size)
                    if need > state["free"]:
                        break
                    waiting.popleft()
                    state["free"] -= need
                    prefilling[i] = 0
                    c = min(prompt[i], left)
                    planned.append((i, c, 0))
                    left -= c
                s = step[0] + 1
                batch = Batch([c for _, c, _ in planned], [d for _, _, d in planned], n_dec,
                              ctx_base_sum[0] + n_dec * s if n_dec else 0)
                yield env.timeout(cost.iteration_time(batch))
                now = env.now
                if n_dec:
                    step[0] = s
                    for i in finish_due.pop(s, ()):
                        del decoding[i]
                        ctx_base_sum[0] -= ctx_base.pop(i)
                        state["free"] += -(-(prompt[i] + output[i]) // block_size)
                        finish_at[i] = now
                        events.pop(i)[1].succeed()
                for i, c, d in planned:
                    if d + c < prompt[i]:
                        prefilling[i] = d + c
                        continue
                    del prefilling[i]
                    first_at[i] = now
                    events[i][0].succeed()
                    if output[i] == 1:
                        state["free"] += -(-(prompt[i] + output[i]) // block_size)
                        finish_at[i] = now
                        events.pop(i)[1].succeed()
                        continue
                    s1 = step[0] + 1
                    fin = s1 + output[i] - 2
                    decoding[i] = fin
                    finish_due.setdefault(fin, []).append(i)
                    ctx_base[i] = prompt[i] - s1
                    ctx_base_sum[0] += ctx_base[i]

        env.process(gpu())
        return add

    adds = [replica() for _ in range(num_replicas)]
    add = adds[0]

    def request(i):
        first, done = env.event(), env.event()
        events[i] = (first, done)
        if num_replicas == 1:
            add(i)
        else:
            adds[i % num_replicas](i)
        yield first
        yield done

    def arrivals():
        for i in range(n):
            delay = arrival[i] - env.now
            if delay > 0:
                yield env.timeout(delay)
            env.process(request(i))

    env.process(arrivals())
    env.run()
    return first_at, finish_at


def _setup(quick: bool, preset: str | None = None):
    """The benchmark's config (the default, or ``preset``'s), its trace (requests the floor can
    serve) and the floor's inputs."""
    workload = WorkloadConfig.preset("azure-conv", duration=600.0 if quick else None)
    cfg = SimConfig(workload=workload) if preset is None else SimConfig.preset(
        preset, workload=workload)
    table = generate(cfg.workload, np.random.default_rng(cfg.seed))
    fits = table["num_prompt_tokens"] + table["num_output_tokens"] <= 4096
    table = table[fits].reset_index(drop=True)   # the floor has no rejection path
    return (cfg, table) + floor_inputs(cfg, table)


def floor_inputs(cfg: SimConfig, table) -> tuple[tuple, tuple]:
    """:func:`floor_loop`'s arguments for ``table`` under ``cfg``: (arrival times, prompt and
    output lengths as lists) and (token budget, sequence cap, KV blocks, block size)."""
    sch, block_size = cfg.scheduler, cfg.cache.block_size
    args = (table["arrival_at"].to_numpy().tolist(),
            table["num_prompt_tokens"].to_numpy().tolist(),
            table["num_output_tokens"].to_numpy().tolist())
    opts = (sch.max_num_batched_tokens, sch.max_num_seqs,
            kv_capacity_blocks(cfg.hardware, block_size), block_size)
    return args, opts


def count_instructions(quick: bool, preset: str | None = None) -> dict:
    """Print one call's counts of each loop (three calls minus one, halved) and their ratios."""
    extra = (["--quick"] if quick else []) + (["--preset", preset] if preset else [])
    per_call = {loop: cachegrind_per_call("benchmarks.floor", ["--only", loop] + extra)
                for loop in ("floor", "simsched")}
    print(f"Azure conversation trace{' (first 600 s)' if quick else ''}: one call of each loop "
          f"under cachegrind (simulated caches and branch predictor); simsched "
          f"{'SimConfig.preset(' + repr(preset) + ')' if preset else 'SimConfig()'}")
    print_count_ratios(per_call["floor"], per_call["simsched"], "floor", "simsched")
    return per_call


def main(argv=None) -> None:
    """Time both loops (best of --repeat) and print the ratio (or count, --instructions)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first 600 s of the trace only")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions, cache misses and mispredicts (valgrind)")
    parser.add_argument("--preset", help="simsched with SimConfig.preset(NAME), e.g. vllm_v1 "
                        "(default: SimConfig()'s defaults)")
    parser.add_argument("--only", choices=("floor", "simsched"), help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=1, help=argparse.SUPPRESS)
    add_record_option(parser)     # variants: full, quick (first 600 s), instructions (--quick)
    args = parser.parse_args(argv)
    if args.record and args.instructions and not args.quick:
        parser.error("--record keeps --instructions' figures with --quick only")
    if args.instructions:
        counts = count_instructions(args.quick, args.preset)
        if args.record:
            f, s = counts["floor"], counts["simsched"]
            record("floor", "instructions", {
                "floor_instructions_m": f["instructions"] / 1e6,
                "simsched_instructions_m": s["instructions"] / 1e6,
                "instructions_ratio": s["instructions"] / f["instructions"],
                "floor_d1_misses_m": f["D1 misses"] / 1e6,
                "simsched_d1_misses_m": s["D1 misses"] / 1e6,
                "d1_ratio": s["D1 misses"] / f["D1 misses"],
                "floor_mispredicts_m": f["mispredicted branches"] / 1e6,
                "simsched_mispredicts_m": s["mispredicted branches"] / 1e6,
                "mispredicts_ratio": s["mispredicted branches"] / f["mispredicted branches"]})
        return
    cfg, table, floor_args, floor_opts = _setup(args.quick, args.preset)
    hw = cfg.hardware
    if args.only is not None:      # one loop, untimed (what --instructions counts)
        model = make_cost_model(hw)
        for _ in range(args.calls):
            if args.only == "floor":
                floor_loop(*floor_args, model, *floor_opts)
            else:
                simulate(cfg, requests=table, cost_model=model)
        return
    best = {"floor": math.inf, "simsched": math.inf}
    iters = {}
    for _ in range(args.repeat):
        timed = timed_as_is(make_cost_model(hw))
        floor_loop(*floor_args, timed, *floor_opts)
        best["floor"] = min(best["floor"], timed.last_at - timed.first_at)
        iters["floor"] = timed.num_calls
        timed = timed_as_is(make_cost_model(hw))
        res = simulate(cfg, requests=table, cost_model=timed)
        best["simsched"] = min(best["simsched"], timed.last_at - timed.first_at)
        iters["simsched"] = len(res.iterations)   # quiet runs time many in one call
    print(f"Azure conversation trace{' (first 600 s)' if args.quick else ''}: {len(table)} "
          f"requests, FCFS, calibrated Llama-2-7B on A100-80GB, simsched "
          f"{'SimConfig.preset(' + repr(args.preset) + ')' if args.preset else 'SimConfig()'}, "
          f"best of {args.repeat}")
    for name in ("floor", "simsched"):
        print(f"  {name:<9} loop {best[name]:7.3f} s  {iters[name]:>7} iterations  "
              f"{best[name] / iters[name] * 1e6:6.1f} us/iteration")
    print(f"  simsched / floor: {best['simsched'] / best['floor']:.2f}x wall "
          f"({best['simsched'] / iters['simsched'] / (best['floor'] / iters['floor']):.2f}x "
          f"per iteration)")
    if args.record:
        us = {name: best[name] / iters[name] * 1e6 for name in best}
        record("floor", "quick" if args.quick else "full", {
            "ratio": best["simsched"] / best["floor"], "repeat": args.repeat,
            "ratio_per_iteration": us["simsched"] / us["floor"],
            "simsched_us_per_iteration": us["simsched"], "floor_us_per_iteration": us["floor"]})


if __name__ == "__main__":
    main()
