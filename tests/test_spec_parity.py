"""Speculative decoding step for step against vLLM's own V1 scheduler (issue 27), on recorded
decisions: ``tests/fixtures/spec_parity/sync.json`` holds vLLM 0.33.0's steps for small cases of
every parity family with K = 1, 3 or 5 proposals per decoder (``update_draft_token_ids``), every
verification accepting :func:`benchmarks.spec_parity.accepted` proposals; recorded by
``python -m benchmarks.spec_parity --fixtures`` (needs vLLM). Replayed here through simsched's
``vllm_v1`` preset with the same acceptances as a trace, without vLLM."""

from __future__ import annotations

import json

from benchmarks.parity.cases import FAMILIES, Case
from benchmarks.parity.compare import compare, effects, unpack, unpack_effects
from benchmarks.spec_parity import FIXTURE, WITNESSES, sim_steps_effects


def test_simsched_grants_what_vllm_grants_with_speculation(tmp_path):
    data = json.loads(FIXTURE.read_text())
    assert data["vllm_version"] == "0.33.0" and data["scheduler"] == "Scheduler"
    records = data["cases"]
    cases = [Case.from_json(r["case"]) for r in records]
    assert {c.family for c in cases} == set(FAMILIES)
    assert {r["k"] for r in records} == {1, 3, 5}
    # Issue 40's witnesses, whole: the last records.
    assert [(c.family, c.case_id, r["k"]) for c, r in zip(cases[-len(WITNESSES):],
                                                          records[-len(WITNESSES):])] \
        == [(family, i, k) for _, family, i, k in WITNESSES]
    failures, num_steps, spec_steps, trimmed = [], 0, 0, 0
    for record, case in zip(records, cases):
        k = record["k"]
        theirs = unpack(record["steps"])
        num_steps += len(theirs)
        decodes = [n for step in theirs for _, n, _ in step[1] if 1 < n <= k + 1]
        spec_steps += len(decodes)
        trimmed += sum(1 for n in decodes if n < k + 1)
        ours, our_effects = sim_steps_effects(case, k, tmp_path)
        outcome = compare(theirs, ours)
        effects_diff = effects(unpack_effects(record["effects"]), our_effects)
        if outcome.first_diff is not None or effects_diff:
            failures.append(f"case {case.case_id} [{case.family}] K={k}: {outcome.diff}"
                            f"{effects_diff}")
    assert not failures, "\n\n".join(failures[:3])
    assert num_steps > 1000 and spec_steps > 1000 and trimmed > 20   # spec grants, some trimmed
