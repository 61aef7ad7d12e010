"""Step-for-step parity of simsched's SGLang scheduler with SGLang 0.5.9's own classes.

``benchmarks/engines/parity_driver.py`` (run in a venv with SGLang) records the batches SGLang's
``RadixCache``, ``PrefillAdder`` and ``SchedulePolicy`` form on the seeded cases of
:mod:`benchmarks.engines.parity_cases`; this module runs simsched's
:class:`~simsched.engine.engines.sglang.SGLangScheduler` on the same cases, by hand (schedule,
commit, as the GPU loop calls them) and compares batch by batch: the kind (prefill or decode),
the requests and their new tokens, the cached prefix each prefill starts from and the requests
retracted. ``python -m benchmarks.engines.parity --traces traces.json`` prints the share of
identical cases per family; ``--fixtures DIR`` writes a few cases per family for the default
suite (tests/test_sglang_parity.py replays them without SGLang).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.engines.parity_cases import make_case, segment_chains
from simsched.config import SchedulerConfig
from simsched.engine.engines.radix_cache import RadixCache
from simsched.engine.engines.sglang import SGLangScheduler
from simsched.request import Content, Request


def scheduler_of(case: dict) -> SGLangScheduler:
    cfg = SchedulerConfig(engine="sglang", engine_options={
        "schedule_policy": case["policy"], "max_prefill_tokens": case["max_prefill_tokens"],
        "enable_mixed_chunk": case.get("mixed_chunk", False)},
        max_num_batched_tokens=case["chunked_prefill_size"],
        max_num_seqs=case["max_running_requests"])
    sched = SGLangScheduler(cfg, RadixCache(case["num_tokens"], disable=not case["radix"]))
    sched.max_running_requests = case["max_running_requests"]    # as the driver sets it
    return sched


def requests_of(case: dict) -> list[Request]:
    out = []
    for r in case["requests"]:
        segments = [(chain, n) for chain, _, n in segment_chains(r["segments"])]
        prompt = sum(n for _, n in segments)
        out.append(Request(r["id"], float(r["arrival_step"]), prompt, r["output"],
                           content=Content.from_segments(segments, ("out", r["id"]))))
    return out


def run_case(case: dict) -> list[dict]:
    """The batches simsched's SGLang scheduler runs on ``case``, as the driver records them."""
    sched = scheduler_of(case)
    pending = requests_of(case)
    arrival = {r["id"]: r["arrival_step"] for r in case["requests"]}
    trace, batches, now = [], 0, 0.0
    for _ in range(100_000):
        while pending and arrival[pending[0].id] <= batches:
            req = pending.pop(0)
            assert sched.add(req, now), req.reject_reason
        batch = sched.schedule(now)
        if batch.prefill_new_tokens:
            record = {"kind": "prefill",
                      "run": [[rid, chunk] for rid, (_, chunk) in sched.planned.items()],
                      "cached": [[rid, req.num_computed_tokens]
                                 for rid, (req, _) in sched.planned.items()]}
            if batch.num_decode_seqs:             # --enable-mixed-chunk: decodes mixed in
                record["decode"] = sorted(sched.decoding)
        elif batch.num_decode_seqs:
            record = {"kind": "decode", "run": sorted(sched.decoding),
                      "retracted": [r.id for r, _ in sched.preempted]}
        else:
            record = None
        now += 0.01
        sched.commit(now)
        if record is not None:
            trace.append(record)
            batches += 1
        elif not sched.has_work():
            if not pending:
                return trace
            batches = max(batches, arrival[pending[0].id])
    raise RuntimeError("did not drain")


def first_difference(ours: list, theirs: list) -> int | None:
    """The first batch where the traces differ (None: identical)."""
    for k, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return k
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def compare(traces: list[dict]) -> dict:
    """family -> (identical cases, cases, first differing case)."""
    out: dict = {}
    for entry in traces:
        family = entry["family"]
        case = make_case(family, entry["seed"])
        ok = "trace" in entry and first_difference(run_case(case), entry["trace"]) is None
        same, total, first = out.get(family, (0, 0, None))
        if not ok and first is None:
            first = entry["seed"]
        out[family] = (same + ok, total + 1, first)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", required=True, help="the driver's output")
    p.add_argument("--fixtures", help="write a few cases per family here")
    p.add_argument("--per-family", type=int, default=6)
    p.add_argument("--record", action="store_true",
                   help="write the result to benchmarks/engines/sglang_parity.json")
    args = p.parse_args(argv)
    traces = json.loads(Path(args.traces).read_text())
    result = compare(traces)
    same = sum(s for s, _, _ in result.values())
    total = sum(t for _, t, _ in result.values())
    print("| family | identical | cases | first differing seed |\n|---|---|---|---|")
    for family, (s, t, first) in result.items():
        print(f"| {family} | {s} | {t} | {'' if first is None else first} |")
    print(f"| all | {same} ({same / total:.1%}) | {total} | |")
    if args.record:
        path = Path(__file__).parent / "sglang_parity.json"
        steps = sum(len(e.get("trace", ())) for e in traces)
        retracted = sum(len(s.get("retracted", ())) for e in traces for s in e.get("trace", ()))
        path.write_text(json.dumps({
            "sglang_version": "0.5.9", "cases": total, "identical": same, "batches": steps,
            "retractions": retracted,
            "families": {f: {"identical": s, "cases": t} for f, (s, t, _) in result.items()}},
            indent=1) + "\n")
    if args.fixtures:
        out = Path(args.fixtures)
        out.mkdir(parents=True, exist_ok=True)
        kept: dict = {}
        for entry in traces:
            if "trace" in entry and kept.setdefault(entry["family"], 0) < args.per_family:
                kept[entry["family"]] += 1
                name = f"{entry['family']}-{entry['seed']}.json"
                (out / name).write_text(json.dumps(entry, separators=(",", ":")))


if __name__ == "__main__":
    main()
