"""Speculative decoding, step for step: simsched's grants against vLLM's real V1 scheduler.

The parity cases of :mod:`benchmarks.vllm_parity` (sync mode) are run with K proposals per
decoder on both sides. vLLM's ``Scheduler`` gets the proposals through
``update_draft_token_ids`` after each step and the verification's result through the sampled
tokens of ``update_from_output`` (1 + accepted tokens); simsched runs its ``vllm_v1`` preset with
``scheduler.speculative`` and an acceptance trace holding the same accepted counts (request i's
v-th verification accepts ``accepted(i, v)``), so both sides see identical acceptances. Compared
per step: which requests are scheduled with how many tokens (prefill, decode and spec tokens
together), who is preempted, who finishes; and their effects: free KV blocks after each step
(vLLM keeps the blocks of rejected proposals and fills them with the next step's tokens; so
does simsched), cached blocks evicted per step, each request's preemptions. Needs vLLM on CPU (see benchmarks/vllm_parity.py)::

    VLLM_TARGET_DEVICE=cpu python -m benchmarks.spec_parity --cases 60 --k 3

The drafter proposes at most ``remaining output - 1`` tokens (simsched's rule: vLLM's own
drafters propose K and the tokens past ``max_tokens`` are dropped after verification).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from benchmarks.parity.cases import MAX_MODEL_LEN, make_case  # noqa: E402
from benchmarks.parity.compare import compare  # noqa: E402
from benchmarks.parity.engine import (OUTPUT_BASE, StuckError, _Recorder,  # noqa: E402
                                      _run_sync, effects_of, make_requests, make_scheduler)
from benchmarks.parity.sim import run_sim_effects  # noqa: E402

from benchmarks.parity.cases import FAMILIES  # noqa: E402
from benchmarks.parity.compare import effects, pack, pack_effects  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "spec_parity" \
    / "sync.json"
FIXTURE_SEED = 2027
FIXTURE_KS = (1, 3, 5)


def accepted(rid: int, v: int, k: int) -> int:
    """The accepted proposals of request ``rid``'s ``v``-th verification (a fixed pattern)."""
    return (rid * 7 + v * 5 + (v * v) % 3) % (k + 1)


def write_trace(path: Path, num_requests: int, k: int, max_verifications: int = 400) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["request_id", "num_accepted"])
        for rid in range(num_requests):
            for v in range(max_verifications):
                w.writerow([rid, accepted(rid, v, k)])


class _SpecRecorder(_Recorder):
    """The parity recorder with a drafter and a verifier: before each schedule the requests that
    sampled in the last step get their proposals (``update_draft_token_ids``); each scheduled
    verification samples 1 + :func:`accepted` tokens."""

    def __init__(self, sched, k: int, max_tokens: dict) -> None:
        super().__init__(sched)
        self.k = k
        self.max_tokens = max_tokens
        self.verifications: dict[str, int] = defaultdict(int)
        self.sampled: list[str] = []            # requests that sampled in the last step
        self.model_output = self._verify

    def schedule(self, now: int):
        from vllm.v1.outputs import DraftTokenIds

        ids, drafts = [], []
        for rid in self.sampled:
            req = self.sched.requests.get(rid)
            if req is None or req.is_finished():
                continue
            n = min(self.k, self.max_tokens[rid] - req.num_output_tokens - 1)
            if n > 0:
                ids.append(rid)
                drafts.append([7] * n)
        if ids:
            self.sched.update_draft_token_ids(DraftTokenIds(ids, drafts))
        return super().schedule(now)

    def _verify(self, sched, out, counts: dict):
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            if sched.requests[rid].is_prefill_chunk:
                sampled.append([])
                continue
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            a = 0
            if drafts:
                a = min(accepted(int(rid), self.verifications[rid], self.k), len(drafts))
                self.verifications[rid] += 1
            n0 = counts.get(rid, 0)
            counts[rid] = n0 + 1 + a
            sampled.append([OUTPUT_BASE + int(rid) * MAX_MODEL_LEN + n0 + j for j in range(1 + a)])
        self.sampled = [rid for rid, toks in zip(ids, sampled) if toks]
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled)


def run_vllm_spec_effects(case, k: int, max_steps: int = 100_000) -> tuple[list, dict]:
    """vLLM's steps for ``case`` with K proposals per decoder (see the module docstring) and
    their effects (:func:`benchmarks.parity.engine.effects_of`)."""
    sched = make_scheduler(case)
    requests = make_requests(case)
    rec = _SpecRecorder(sched, k, {r.request_id: r.max_tokens for r in requests})
    _run_sync(sched, requests, rec, max_steps)
    return rec.steps, effects_of(rec, requests)


def run_vllm_spec(case, k: int, max_steps: int = 100_000) -> list:
    """vLLM's steps for ``case`` with K proposals per decoder."""
    return run_vllm_spec_effects(case, k, max_steps)[0]


def sim_steps_effects(case, k: int, trace_dir: Path) -> tuple[list, dict]:
    """simsched's steps for ``case`` with K proposals and :func:`accepted`'s acceptances, and
    their effects (:func:`benchmarks.parity.sim.effects_of`)."""
    trace = trace_dir / f"accepted-{case.case_id}-{k}.csv"
    write_trace(trace, len(case.requests), k)
    return run_sim_effects(case, speculative={"method": "ngram", "num_speculative_tokens": k,
                                              "acceptance_trace": str(trace)})


def sim_steps(case, k: int, trace_dir: Path) -> list:
    """simsched's steps for ``case`` with K proposals and :func:`accepted`'s acceptances."""
    return sim_steps_effects(case, k, trace_dir)[0]


# Whole cases where issue 40's rules decide, found with this command: (seed, family, case
# index, K). vLLM keeps a verification's rejected slots' blocks (its block table only grows) and
# the next steps fill them, which a trimmed grant makes visible (kv_bound 7 and 30); a victim
# granted slots earlier in the step keeps its blocks of every known token cached
# (tiny_kv_priority 0).
WITNESSES = ((4053, "kv_bound", 7, 5), (4053, "kv_bound", 30, 5),
             (4051, "tiny_kv_priority", 0, 3))


def record_fixture(version: str, cases_per_family: int) -> Path:
    """vLLM's steps and effects for small cases of every family, K cycling through FIXTURE_KS,
    and the :data:`WITNESSES`."""
    from benchmarks.vllm_parity import small_case

    runs = [(small_case(make_case(i, FIXTURE_SEED, family=family)),
             FIXTURE_KS[i % len(FIXTURE_KS)])
            for family in FAMILIES for i in range(cases_per_family)]
    runs += [(make_case(i, seed, family=family), k) for seed, family, i, k in WITNESSES]
    records = []
    for case, k in runs:
        steps, eff = run_vllm_spec_effects(case, k)
        records.append({"k": k, "case": case.to_json(), "steps": pack(steps),
                        "effects": pack_effects(eff)})
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps({"vllm_version": version, "scheduler": "Scheduler",
                                   "regenerate": "python -m benchmarks.spec_parity --fixtures",
                                   "cases": records}, separators=(",", ":")) + "\n")
    return FIXTURE


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.spec_parity",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=50, help="cases per family")
    p.add_argument("--k", type=int, default=3, help="proposals per decoder")
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--seed", type=int, default=27)
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--show", type=int, default=2, help="differences to print per family")
    p.add_argument("--fixtures", action="store_true",
                   help="record vLLM's steps for small cases into tests/fixtures/spec_parity/")
    args = p.parse_args(argv)
    import logging

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)
    if args.fixtures:
        from benchmarks.parity.engine import vllm_version

        print(f"wrote {record_fixture(vllm_version(), 10)}")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="spec-parity-"))
    figures = {}
    for family in args.families.split(","):
        cases_same = steps_same = steps_all = effects_same = shown = 0
        for i in range(args.cases):
            case = make_case(i, seed=args.seed, family=family)
            try:
                ours, our_effects = sim_steps_effects(case, args.k, tmp)
                theirs, their_effects = run_vllm_spec_effects(case, args.k)
            except StuckError as exc:
                print(f"{family} case {i}: vLLM stuck ({exc})")
                continue
            outcome = compare(theirs, ours)
            effects_diff = effects(their_effects, our_effects)
            steps_all += outcome.num_steps
            steps_same += outcome.num_same
            effects_same += not effects_diff
            if outcome.first_diff is None and not effects_diff:
                cases_same += 1
            elif shown < args.show:
                shown += 1
                print(f"{family} case {i} ({case.label()}): {outcome.diff or 'steps identical'}"
                      + (f"\n  effects differ:\n{effects_diff}" if effects_diff else "") + "\n")
        print(f"{family}: {cases_same}/{args.cases} cases identical, "
              f"{steps_same}/{steps_all} steps identical, effects in {effects_same}", flush=True)
        figures[family] = {"cases": args.cases, "identical": cases_same, "steps": steps_all,
                           "identical_steps": steps_same, "identical_effects": effects_same}
    if args.json:
        Path(args.json).write_text(json.dumps({"k": args.k, "seed": args.seed,
                                               "families": figures}, indent=1) + "\n")
    return 0 if all(f["identical"] == f["cases"] for f in figures.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
