"""Long fuzz run: thousands of random configurations and workloads, every invariant checked.

Each case draws a scheduler configuration (queue and victim policies as registered at run time,
style, preemption, budgets, chunking), a KV cache down to the smallest that fits one request,
and a small adversarial workload (bursts, identical and zero-gap arrivals, one-token outputs,
prompts at the budget or a block boundary, impossible requests), then runs it with
:func:`simsched.api.simulate_checked`. With ``--cluster P`` a share P of the cases also become
clusters (2-5 replicas, any registered router, fresh load or a snapshot of any allowed age, a
queue cap that sheds, replicas of different caches, limits and GPUs, prefill/decode roles) and
most of those share prompt prefixes with prefix caching on; the cluster draws come from their
own stream, so a case index means the same base case with or without it. Every request is then
checked against what the replicas' sizes and roles allow (:func:`servable`), and some cases check
that a config refuses a snapshot interval below the bound. Usage::

    python -m benchmarks.fuzz --n 10000 --workers 2 --seed 0 [--cluster 0.3] [--faults 0.5]

With ``--faults P`` a share P of the cases also get client deadlines, cancellations, retries,
hedges and replica failures (:func:`faults_variant`), or, disaggregated ones, degraded
KV-transfer links (:func:`links_variant`: scheduled and drawn slow-downs and outages, retried or
recomputed), from a stream of their own; every attempt must then end exactly once, every request
be finished, given up after its last attempt, cancelled or rejected, and KV and work balance
through aborts, failures, failed transfers and recomputations.

Prints the number of configurations run, the failures (with the case index to reproduce with
``--only``) and the wall time.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import time
import traceback

import numpy as np
import pandas as pd

from simsched.cluster.routers import ROUTERS
from simsched.config import (LINK_PRESETS, PREEMPTION_MODES, ROLES, SCHEDULER_STYLES,
                             CacheConfig, HardwareConfig, SchedulerConfig, SimConfig)
from simsched.config.cluster import MIN_REFRESH_INTERVAL
from simsched.api import simulate_checked
from simsched.engine.invariants import check_final_state
from simsched.engine.result_checks import check_results
from simsched.policies import QUEUE_POLICIES, VICTIM_POLICIES
from simsched.workloads.workload import WorkloadConfig

from benchmarks.common import add_record_option, record
from benchmarks.fuzz_faults import faults_margin, faults_variant, links_variant

MODEL_CONTEXT = 4096  # llama-2-7b, the default model


def _choice(rng: np.random.Generator, options):
    options = list(options)
    return options[int(rng.integers(len(options)))]


def _arrivals(rng: np.random.Generator, n: int) -> np.ndarray:
    kind = _choice(rng, ("same_time", "bursts", "poisson", "zero_gap", "spread"))
    if kind == "same_time":
        return np.full(n, float(rng.uniform(0, 2)))
    if kind == "bursts":
        starts = np.sort(rng.uniform(0, 20, size=int(rng.integers(1, 5))))
        return np.sort(rng.choice(starts, size=n))
    if kind == "zero_gap":
        times = np.cumsum(rng.exponential(0.5, size=n))
        times[rng.random(n) < 0.5] = 0.0  # many gaps of exactly zero after the cumsum below
        return np.maximum.accumulate(np.cumsum(times * (rng.random(n) < 0.5)))
    if kind == "poisson":
        return np.cumsum(rng.exponential(1 / rng.uniform(0.1, 50), size=n))
    return np.sort(rng.uniform(0, 100, size=n))


def _length(rng: np.random.Generator, budget: int, block_size: int, high: int) -> int:
    kind = rng.random()
    if kind < 0.15:
        return budget                                    # exactly the token budget
    if kind < 0.3:
        return block_size * int(rng.integers(1, 8)) + int(rng.integers(-1, 2))  # block boundary
    if kind < 0.4:
        return 1
    return int(rng.integers(1, high + 1))


def random_case(rng: np.random.Generator) -> tuple[SimConfig, list[tuple]]:
    """One random (config, requests) pair; requests are (arrival, prompt, output, priority)."""
    max_num_seqs = int(rng.integers(1, 17))
    budget = max_num_seqs if rng.random() < 0.1 else int(rng.integers(max_num_seqs, 257))
    block_size = int(rng.integers(1, 33))
    sched = SchedulerConfig(
        style=_choice(rng, SCHEDULER_STYLES), policy=_choice(rng, sorted(QUEUE_POLICIES)),
        victim_policy=_choice(rng, sorted(VICTIM_POLICIES)), preemption=bool(rng.random() < 0.5),
        preemption_mode=_choice(rng, PREEMPTION_MODES) if rng.random() < 0.3 else "recompute",
        max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
        max_num_prefills=None if rng.random() < 0.7 else int(rng.integers(1, 5)),
        enable_chunked_prefill=bool(rng.random() < 0.7),
        max_num_preemptions=int(rng.integers(0, 9)))
    n = int(rng.integers(1, 41))
    # Dyadic arrival times: env.now + (arrival - env.now) is then exact. Arbitrary floats can
    # put a request's start an ulp before its arrival (reported separately; see the tests).
    times = np.round(_arrivals(rng, n) * 1024) / 1024
    prompts = [max(1, _length(rng, budget, block_size, 300)) for _ in range(n)]
    outputs = [1 if rng.random() < 0.2 else max(1, _length(rng, budget, block_size, 120))
               for _ in range(n)]
    priorities = rng.integers(0, 3, size=n)
    # The cache is sized from the largest request, from exactly fitting to roomy.
    peak = max(p + o - 1 for p, o in zip(prompts, outputs))
    watermark = 0.0 if rng.random() < 0.5 else float(rng.uniform(0, 0.2))
    fit = -(-peak // block_size)
    extra = 0 if rng.random() < 0.3 else int(rng.geometric(0.1))
    num_blocks = fit + extra
    num_blocks += math.ceil(watermark * num_blocks) + 1 if watermark else 0
    max_model_len = None if rng.random() < 0.7 else int(rng.integers(max(2, peak // 2),
                                                                     peak + 20))
    for i in range(n):
        if rng.random() < 0.05:  # impossible: larger than the whole cache
            prompts[i] = num_blocks * block_size + int(rng.integers(1, 50))
    cfg = SimConfig(
        scheduler=sched,
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks, watermark=watermark),
        hardware=HardwareConfig(cost_model=_choice(rng, ("unit", "linear")),
                                max_model_len=max_model_len),
        workload=WorkloadConfig(num_requests=n),
        max_sim_time=math.inf if rng.random() < 0.9 else float(rng.uniform(1, 50)))
    requests = [(float(t), int(p), int(o), int(pr))
                for t, p, o, pr in zip(times, prompts, outputs, priorities)]
    return cfg, requests


def cluster_variant(rng: np.random.Generator, cfg: SimConfig,
                    requests: list[tuple]) -> tuple[SimConfig, pd.DataFrame]:
    """The case as a cluster, its requests as a table (with shared prefixes, mostly).

    Replicas may differ (``cluster.replicas`` overrides of num_blocks, down to a quarter of the
    cache that fits the largest request, max_num_seqs, max_num_batched_tokens and gpu), have
    prefill/decode roles, and see load as a snapshot of any allowed age.
    """
    n = int(rng.integers(2, 6))
    changes = {"cluster.num_replicas": n, "cluster.router": _choice(rng, sorted(ROUTERS))}
    if rng.random() < 0.3:
        changes["cluster.refresh_interval"] = float(_choice(rng, REFRESH_INTERVALS))
    if rng.random() < 0.2:
        changes["cluster.max_num_queued_per_replica"] = int(rng.integers(1, 6))
    if rng.random() < 0.4:
        changes["cluster.replicas"] = _replica_overrides(rng, cfg, n)
    if rng.random() < 0.3:
        changes.update(_roles(rng, n))
    # Both routers take router_options: weights only where no other router is asked them.
    if changes["cluster.router"] == "weighted" and rng.random() < 0.5 \
            and changes.get("cluster.decode_router") in (None, "weighted"):
        weights = {k: float(rng.choice([0.0, 0.5, 1.0, 3.0])) for k in ("prefix", "queue", "kv")}
        weights["queue"] = weights["queue"] or 1.0      # some weight must be positive
        changes["cluster.router_options"] = {"weights": weights}
    prefix = rng.random() < 0.7
    if prefix:
        changes["cache.enable_prefix_caching"] = True
        if cfg.scheduler.style == "static":     # the block pool is refused there (config)
            changes["cache.prefix_cache_model"] = "segments"
    table = pd.DataFrame(requests, columns=["arrival_at", "num_prompt_tokens",
                                            "num_output_tokens", "priority"])
    if prefix:
        table["prefix_group"] = rng.integers(0, 4, size=len(table))
        table["prefix_len"] = [int(rng.integers(1, p + 1)) for p in table["num_prompt_tokens"]]
    return cfg.replace(**changes), table


# Snapshot ages: the smallest allowed (MIN_REFRESH_INTERVAL), a millisecond, ..., longer than
# most runs. Values below the bound are refused (check_refusals).
REFRESH_INTERVALS = (MIN_REFRESH_INTERVAL, 1e-3, 0.05, 0.5, 2.0, 1000.0)
GPUS = ("a100-40gb", "a100-80gb", "h100-sxm", "h200", "l40s")


def _replica_overrides(rng: np.random.Generator, cfg: SimConfig, n: int) -> tuple:
    """Per-replica overrides for up to all ``n`` replicas (some with a count)."""
    entries, left = [], n
    while left and (not entries or rng.random() < 0.6):
        entry: dict = {}
        if rng.random() < 0.7:
            fit = cfg.cache.num_blocks
            entry["num_blocks"] = int(rng.integers(max(1, fit // 4), 2 * fit + 1))
        if rng.random() < 0.4:
            seqs = int(rng.integers(1, 17))
            entry["max_num_seqs"] = seqs
            entry["max_num_batched_tokens"] = int(rng.integers(seqs, 257))
        if rng.random() < 0.3:
            entry["gpu"] = _choice(rng, GPUS)
        count = int(rng.integers(1, left + 1)) if rng.random() < 0.3 else 1
        if count > 1:
            entry["count"] = count
        entries.append(entry)
        left -= count
    return tuple(entries)


def _roles(rng: np.random.Generator, n: int) -> dict:
    """Prefill/decode roles (xPyD or drawn per replica), links and the local-prefill threshold."""
    out: dict = {}
    if rng.random() < 0.4:
        x = int(rng.integers(1, n))
        out["cluster.num_prefill_replicas"] = x
        out["cluster.num_decode_replicas"] = int(rng.integers(1, n - x + 1))
    else:
        roles = [_choice(rng, ROLES) for _ in range(n)]
        roles[int(rng.integers(n))] = "prefill"           # disaggregated: a prefill replica,
        if not any(r != "prefill" for r in roles):         # and a decode or mixed one
            roles[int(rng.integers(n))] = "decode"
        out["cluster.roles"] = tuple(roles)
    if rng.random() < 0.3:
        out["cluster.decode_router"] = _choice(rng, sorted(ROUTERS))
    if rng.random() < 0.3:
        out["cluster.disagg_min_prompt_tokens"] = int(rng.integers(1, 200))
    out["cluster.link"] = _choice(rng, sorted(LINK_PRESETS))
    return out


def check_refusals(rng: np.random.Generator, cfg: SimConfig) -> None:
    """Values a config must refuse with a ValueError naming the field: snapshot intervals below
    the bound (1e-9 s hung a run, 1e-17 s stopped the clock)."""
    bad = float(_choice(rng, (1e-17, 1e-9, 1e-6, MIN_REFRESH_INTERVAL / 2)))
    try:
        cfg.replace(**{"cluster.refresh_interval": bad})
    except ValueError as exc:
        if "cluster.refresh_interval" not in str(exc):
            raise AssertionError(f"refresh_interval={bad} refused without naming the field: "
                                 f"{exc}") from None
    else:
        raise AssertionError(f"refresh_interval={bad} accepted")


def livelock_guard(cfg: SimConfig, requests: list[tuple]) -> float:
    """A simulated-time limit no terminating run reaches: several iterations per token."""
    tokens = sum(p + o for _, p, o, _ in requests)
    shortest = 1.0 if cfg.hardware.cost_model == "unit" else 8e-3  # LinearCostModel overhead
    return max(t for t, *_ in requests) + (10 * tokens + 500) * shortest


def check_case(cfg: SimConfig, requests: list[tuple], table: pd.DataFrame | None = None) -> None:
    """Run one case with every invariant on; also check that comfortably fitting requests ran.

    A run without a time limit gets :func:`livelock_guard` as its limit, so a livelock is
    reported as unfinished requests instead of hanging the campaign. ``table``, if given, is
    what runs (the requests with prefix columns).
    """
    unlimited = math.isinf(cfg.max_sim_time)
    if unlimited:
        guard = livelock_guard(cfg, requests)
        if cfg.faults.enabled:
            guard += faults_margin(cfg)
        cfg = cfg.replace(max_sim_time=guard)
    results, engine = simulate_checked(cfg, requests if table is None else table)
    if unlimited:
        if results.summary()["num_unfinished"]:
            raise AssertionError(f"livelock: {results.summary()['num_unfinished']} requests "
                                 f"unfinished at the guard t={cfg.max_sim_time:.1f}, "
                                 f"{results.summary()['num_preemptions']} preemptions")
        check_final_state(engine)
        check_results(results)
    df = results.requests
    for row in df.itertuples(index=False):
        if row.status == "rejected" and row.reject_reason.startswith("shed"):
            continue
        if row.status == "rejected" and servable(engine, row, comfortably=True):
            raise AssertionError(f"request {row.request_id} ({row.num_prompt_tokens}+"
                                 f"{row.num_output_tokens}) fits but was rejected: "
                                 f"{row.reject_reason}")
        if row.status == "failed" and row.reject_reason.startswith("failed: no replica up"):
            continue        # every replica was down when it was sent
        if row.status not in ("rejected", "pending") and not servable(engine, row, False):
            raise AssertionError(f"request {row.request_id} can never fit but ended {row.status}")
    summary = results.summary()
    given_up = sum(summary.get(f"num_{s}", 0) for s in ("timed_out", "cancelled", "failed"))
    if summary["num_finished"] + summary["num_rejected"] + summary["num_unfinished"] \
            + summary["num_not_arrived"] + given_up != len(df):
        raise AssertionError(f"summary counts do not add up: {summary}")


def _holds(replica, kv_tokens: int, total: int, comfortably: bool) -> bool:
    """Whether ``replica`` can hold ``kv_tokens`` of KV of a request of ``total`` tokens
    (``comfortably``: beyond its watermark, within the model's context)."""
    kv = replica.kv
    limit = replica.scheduler.max_model_len or math.inf
    if comfortably:
        return total <= min(limit, MODEL_CONTEXT) \
            and kv.blocks_for(kv_tokens) <= kv.num_blocks - kv.watermark_blocks
    return total <= limit and kv.blocks_for(kv_tokens) <= kv.num_blocks


def servable(engine, row, comfortably: bool) -> bool:
    """Whether the request of ``row`` can be served (``comfortably``: with room to spare; else at
    all), from the replicas' sizes and roles alone.

    A routed request needs its replica to hold it whole (routers know nothing of sizes). In a
    disaggregated cluster a request needs a mixed replica that holds it whole, or a prefill
    replica holding its prompt and (with more than one output token) a decode or mixed replica
    holding its peak KV; a prompt under the local-prefill threshold needs a decode or mixed
    replica holding it whole.
    """
    prompt, output = row.num_prompt_tokens, row.num_output_tokens
    total = prompt + output
    peak = total if comfortably else total - 1
    replicas = engine.replicas
    d = engine.disagg
    if d is None:
        i = getattr(row, "replica", 0)
        i = i if i >= 0 else 0
        return _holds(replicas[i], peak, total, comfortably)

    def whole(i: int) -> bool:
        return _holds(replicas[i], peak, total, comfortably)

    decode = [i for i, role in enumerate(d.roles) if role != "prefill"]
    if prompt < d.min_prompt:
        return any(whole(j) for j in decode)
    if any(whole(i) for i, role in enumerate(d.roles) if role == "mixed"):
        return True
    first = [i for i, role in enumerate(d.roles) if role == "prefill"
             and _holds(replicas[i], prompt + 1 if comfortably else prompt, total, comfortably)]
    return bool(first) and (output == 1 or any(whole(j) for j in decode))


def run_one(args: tuple) -> tuple[int, str, str]:
    """Run case ``index`` of seed ``seed`` (a cluster with probability ``cluster``); return
    (index, error text or '', the case's kind: ``plain``, ``faults`` or ``links``)."""
    seed, index, cluster, faults = args
    rng = np.random.default_rng([seed, index])
    table = None
    kind = "plain"
    try:
        cfg, requests = random_case(rng)
        more = np.random.default_rng([seed, index, 1])
        if more.random() < cluster:
            cfg, table = cluster_variant(more, cfg, requests)
            if more.random() < 0.1:
                check_refusals(more, cfg)
        # Faults from a stream of their own (a case index names the same base case), where
        # they are supported: with prefill/decode roles, degraded links only.
        wrong = np.random.default_rng([seed, index, 2])
        if wrong.random() < faults:
            kind = "links" if cfg.cluster.disaggregated else "faults"
            cfg = links_variant(wrong, cfg, requests) if kind == "links" \
                else faults_variant(wrong, cfg, requests)
    except Exception:  # a generator bug, not a simulator bug, but report it all the same
        return index, "case generation failed:\n" + traceback.format_exc(), kind
    try:
        check_case(cfg, requests, table)
    except Exception as exc:  # every failure is collected and reported
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return index, f"{detail}\n  config: {cfg.flat()}\n  requests: {requests}", kind
    return index, "", kind


def main(argv=None) -> int:
    """Run the fuzz campaign and print counts; exit status 1 if any case failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10000, help="number of random configurations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", type=int, default=None, help="run only this case index")
    parser.add_argument("--show", type=int, default=5, help="failures to print in full")
    parser.add_argument("--cluster", type=float, default=0.0,
                        help="share of cases also run as clusters with shared prefixes (0)")
    parser.add_argument("--faults", type=float, default=0.0,
                        help="share of cases with client timeouts, cancellations, retries, "
                             "hedges and replica failures (0)")
    add_record_option(parser)     # variants: full (no clusters), cluster (--cluster > 0)
    args = parser.parse_args(argv)
    if args.record and args.only is not None:
        parser.error("--record keeps a campaign's figures: drop --only")
    indices = [args.only] if args.only is not None else range(args.n)
    tasks = [(args.seed, i, args.cluster, args.faults) for i in indices]
    started = time.perf_counter()
    failures = []
    kinds: dict[str, int] = {}
    if args.workers > 1 and len(tasks) > 1:
        with multiprocessing.Pool(args.workers) as pool:
            for done, (index, error, kind) in enumerate(
                    pool.imap_unordered(run_one, tasks, chunksize=20), 1):
                kinds[kind] = kinds.get(kind, 0) + 1
                if error:
                    failures.append((index, error))
                if done % 500 == 0:
                    print(f"... {done} run, {len(failures)} failures, "
                          f"{time.perf_counter() - started:.0f} s", flush=True)
    else:
        for task in tasks:
            index, error, kind = run_one(task)
            kinds[kind] = kinds.get(kind, 0) + 1
            if error:
                failures.append((index, error))
    elapsed = time.perf_counter() - started
    failures.sort()
    for index, error in failures[:args.show]:
        print(f"--- case {index} (seed {args.seed}) failed:\n{error}\n")
    print(f"configurations run: {len(tasks)}; failures: {len(failures)}"
          + (f" (cases {[i for i, _ in failures[:50]]})" if failures else "")
          + f"; time: {elapsed:.1f} s")
    if args.faults > 0:     # how many cases drew faults, and degraded links
        print(f"cases with faults: {kinds.get('faults', 0)}; with degraded links "
              f"(disaggregated): {kinds.get('links', 0)}")
    if args.record:
        record("fuzz", "faults" if args.faults > 0 else "cluster" if args.cluster > 0
               else "full",
               {"cases": len(tasks), "failures": len(failures), "wall_s": elapsed,
                "seed": args.seed, "workers": args.workers, "cluster_share": args.cluster,
                "faults_share": args.faults})
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
