"""Step-for-step parity of simsched with vLLM's own V1 scheduler (issue 25).

Drives vLLM's real ``Scheduler`` (``--mode sync``, ``scheduler.plan_ahead`` off) or
``AsyncScheduler`` (``--mode async``, ``plan_ahead`` on) and simsched's ``vllm_v1`` preset on the
same seeded cases (:mod:`benchmarks.parity.cases`: light load, token-budget-bound, seq-bound,
KV-bound with preemption storms, shared prefixes with heavy eviction, budgets down to 1, blocks
of 1 to 64 tokens, the priority policy; prefix caching on and off, both admission rules, some
watermarks), one step being one unit of time, and compares every step: which requests are
scheduled with how many tokens, who is preempted, how many prompt tokens hit the prefix cache,
who finishes; and what the decisions did: free KV blocks after each step, cached blocks evicted
in each step, each request's ``num_preemptions`` (a case is identical when both agree). Needs
vLLM on CPU (docs/validation.md), no GPU, no weights::

    VLLM_TARGET_DEVICE=cpu python -m benchmarks.vllm_parity --cases 1000 --mode both
    python -m benchmarks.vllm_parity --fixtures     # re-record tests/fixtures/vllm_parity/

Prints cases and steps identical per mode and family, and the first divergent step of each
differing case. ``--fixtures`` records vLLM's decisions for small cases into compact JSON that
``tests/test_vllm_parity.py`` replays through simsched without vLLM. ``--set FIELD=VALUE``
changes simsched's config (e.g. ``--set prefix_hit_rule=token``) to measure what a rule is worth.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from benchmarks.parity.cases import FAMILIES, make_case  # noqa: E402
from benchmarks.parity.compare import compare, effects, pack, pack_effects  # noqa: E402
from benchmarks.parity.sim import run_sim, run_sim_effects  # noqa: E402
from simsched.cli.configs import parse_pairs, parse_set_value  # noqa: E402

VERIFIED_VLLM = "0.33.0"
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm_parity"
FIXTURE_CASES = 150           # per mode
FIXTURE_SEED = 2025


def _quiet_vllm() -> None:
    import logging

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)


def _check_version(any_version: bool) -> str:
    from benchmarks.parity.engine import vllm_version

    version = vllm_version()
    if version != VERIFIED_VLLM and not any_version:
        sys.exit(f"vllm_parity: vLLM {version} is installed; parity was verified with "
                 f"{VERIFIED_VLLM} (pass --any-version to compare anyway)")
    return version


# Each of vLLM's rules set back to simsched's own default (--ablate): what each is worth.
ABLATIONS = {
    "reserve_full_isl=False": {"reserve_full_isl": False},
    "prefix_hit_rule=token": {"prefix_hit_rule": "token"},
    "prefix_cache_model=segments": {"prefix_cache_model": "segments"},
    "watermark_counts_null_block=False": {"watermark_counts_null_block": False},
    "victim_policy=fewest_generated": {"victim_policy": "fewest_generated"},
    "admit_after_preemption=True": {"admit_after_preemption": True},
    "max_num_preemptions=8": {"max_num_preemptions": 8},
    "simsched's defaults": {"reserve_full_isl": False, "prefix_hit_rule": "token",
                            "prefix_cache_model": "segments",
                            "watermark_counts_null_block": False,
                            "victim_policy": "fewest_generated", "max_num_preemptions": 8,
                            "plan_ahead": False},
}
ASYNC_ABLATIONS = {"plan_ahead=False": {"plan_ahead": False}}


def _coverage(steps: list) -> tuple[int, int]:
    """Preemptions and prefix-cache hits (admissions served from the cache) in vLLM's steps."""
    return (sum(len(s[2]) for s in steps),
            sum(1 for s in steps for _, _, cached in s[1] if cached))


def run_ablations(cases, ablations: dict, out=sys.stdout) -> dict:
    """Run vLLM once per case and simsched once per ablation; print cases identical each."""
    from benchmarks.parity.engine import run_vllm

    counts = dict.fromkeys(ablations, 0)
    for case in cases:
        vllm_steps, _ = run_vllm(case)
        for name, changes in ablations.items():
            counts[name] += compare(vllm_steps, run_sim(case, **changes)).identical
    for name, same in counts.items():
        print(f"  {name:36s} {same:5d} of {len(cases):5d} cases identical", file=out)
    return counts


def run_cases(cases, changes: dict, show: int, out=sys.stdout) -> dict:
    """Compare every case; print a report; return the figures."""
    from benchmarks.parity.engine import StuckError, run_vllm

    # key -> cases, identical (steps and effects), steps, same steps, same effects
    totals = defaultdict(lambda: [0, 0, 0, 0, 0])
    differing = []
    preemptions = hits = evictions = 0
    started = time.perf_counter()
    stuck = []
    for case in cases:
        try:
            vllm_steps, vllm_effects = run_vllm(case)
        except StuckError as exc:       # a case no engine could serve: not compared, reported
            stuck.append(case.case_id)
            print(f"  {case.label()}: vLLM stuck ({exc}), not compared", file=out)
            continue
        p, h = _coverage(vllm_steps)
        preemptions += p
        hits += h
        evictions += sum(vllm_effects["evicted_blocks"])
        sim_steps, sim_effects = run_sim_effects(case, **changes)
        outcome = compare(vllm_steps, sim_steps)
        effects_diff = effects(vllm_effects, sim_effects)
        for key in ("all", case.family, "prefix caching" if case.enable_prefix_caching
                    else "no prefix caching"):
            t = totals[key]
            t[0] += 1
            t[1] += outcome.identical and not effects_diff
            t[2] += outcome.num_steps
            t[3] += outcome.num_same
            t[4] += not effects_diff
        if not outcome.identical or effects_diff:
            differing.append((case, outcome, effects_diff))
    wall = time.perf_counter() - started
    for key in ["all"] + list(FAMILIES) + ["prefix caching", "no prefix caching"]:
        if key in totals:
            n, same, steps, same_steps, same_effects = totals[key]
            print(f"  {key:18s} {same:5d} of {n:5d} cases identical, {same_steps:7,d} of "
                  f"{steps:7,d} steps, effects in {same_effects:5d}", file=out)
    for case, outcome, effects_diff in differing[:show]:
        print(f"\n{case.label()}\n{outcome.diff or 'steps identical'}"
              + (f"\n  effects differ:\n{effects_diff}" if effects_diff else ""), file=out)
    if len(differing) > show:
        print(f"\n... and {len(differing) - show} more differing cases", file=out)
    n, same, steps, same_steps, same_effects = totals["all"]
    print(f"  vLLM preempted {preemptions:,} times, served {hits:,} admissions from the "
          f"prefix cache and evicted {evictions:,} cached blocks in these cases", file=out)
    return {"cases": n, "identical": same, "steps": steps, "identical_steps": same_steps,
            "identical_effects": same_effects, "preemptions": preemptions, "prefix_hits": hits,
            "evicted_blocks": evictions, "differing": [c.case_id for c, _, _ in differing],
            "vllm_stuck": stuck,
            "families": {k: totals[k][:2] for k in FAMILIES if k in totals},
            "wall_s": round(wall, 1)}


# Whole cases (not cut) where a rule of issue 40 decides, found with this harness: (mode, seed,
# family, case index). Async: a victim whose last token is in flight (kv_bound 147), a victim
# scheduled earlier in the step under priority, its newest block cached (bursts 17); sync: the
# same rule, which moves evictions (tiny_kv_priority 2 and 5).
WITNESSES = (("async", 4001, "kv_bound", 147), ("async", 4003, "bursts", 17),
             ("sync", 4061, "tiny_kv_priority", 2), ("sync", 4061, "tiny_kv_priority", 5))


def record_fixtures(version: str, num_cases: int, out=sys.stdout) -> list[Path]:
    """Record vLLM's steps and effects for small cases of both modes, and the
    :data:`WITNESSES`, into :data:`FIXTURES`."""
    from benchmarks.parity.engine import run_vllm

    FIXTURES.mkdir(parents=True, exist_ok=True)
    written = []
    for mode in ("sync", "async"):
        records = []
        cases = [small_case(make_case(i, FIXTURE_SEED, async_scheduling=mode == "async"))
                 for i in range(num_cases)]
        cases += [make_case(i, seed, family, async_scheduling=mode == "async")
                  for m, seed, family, i in WITNESSES if m == mode]
        for case in cases:
            steps, eff = run_vllm(case)
            records.append({"case": case.to_json(), "steps": pack(steps),
                            "effects": pack_effects(eff)})
        data = {"vllm_version": version, "mode": mode, "seed": FIXTURE_SEED,
                "scheduler": "AsyncScheduler" if mode == "async" else "Scheduler",
                "regenerate": "python -m benchmarks.vllm_parity --fixtures",
                "cases": records}
        path = FIXTURES / f"{mode}.json"
        path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        written.append(path)
        print(f"wrote {path} ({len(records)} cases, {path.stat().st_size:,} bytes)", file=out)
    return written


def small_case(case):
    """``case`` cut to at most 8 requests (fixtures stay small and fast to replay)."""
    if len(case.requests) <= 8:
        return case
    return dataclasses.replace(case, requests=case.requests[:8])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=1000, help="cases per mode (default 1000)")
    p.add_argument("--start", type=int, default=0, help="first case index")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", choices=["sync", "async", "both"], default="both")
    p.add_argument("--family", choices=FAMILIES, help="only this family's cases")
    p.add_argument("--only", type=int, action="append", help="only this case index (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change simsched's config (flat field names)")
    p.add_argument("--show", type=int, default=20, help="differing cases to print (default 20)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--record", action="store_true",
                   help="write the figures to benchmarks/results/vllm_parity.json (variant "
                        "seedS) and re-render benchmarks/README.md")
    p.add_argument("--fixtures", action="store_true",
                   help=f"record {FIXTURE_CASES} small cases per mode into {FIXTURES}")
    p.add_argument("--ablate", action="store_true",
                   help="also set each of vLLM's rules back to simsched's default, one at a "
                        "time, and count the cases still identical")
    p.add_argument("--any-version", action="store_true",
                   help=f"run with a vLLM other than {VERIFIED_VLLM}")
    args = p.parse_args(argv)
    if args.record and (args.only or args.family or args.set or args.start
                        or args.mode != "both"):
        p.error("--record keeps a whole run's figures (both modes, every family)")
    _quiet_vllm()
    version = _check_version(args.any_version)
    if args.fixtures:
        record_fixtures(version, FIXTURE_CASES)
        return 0
    changes = {k: parse_set_value(k, v) for k, v in parse_pairs(args.set, "--set")}
    figures = {"vllm_version": version, "seed": args.seed, "changes": changes}
    for mode in (["sync", "async"] if args.mode == "both" else [args.mode]):
        ids = args.only or range(args.start, args.start + args.cases)
        cases = [make_case(i, args.seed, args.family, async_scheduling=mode == "async")
                 for i in ids]
        print(f"vLLM {version} {'AsyncScheduler' if mode == 'async' else 'Scheduler'} vs "
              f"simsched (vllm_v1 preset{', plan_ahead' if mode == 'async' else ''}"
              f"{', ' + str(changes) if changes else ''}), seed {args.seed}:")
        figures[mode] = run_cases(cases, changes, args.show)
        print(f"  ({figures[mode]['wall_s']} s)\n")
        if args.ablate:
            print("  each rule set back to simsched's default:")
            figures[f"{mode}_ablations"] = run_ablations(
                cases, {**ABLATIONS, **(ASYNC_ABLATIONS if mode == "async" else {})})
            print()
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    if args.record:
        from benchmarks.common import record

        record("vllm_parity", f"seed{args.seed}", figures)
    return 0 if all(figures[m]["identical"] == figures[m]["cases"]
                    for m in ("sync", "async") if m in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
