"""simsched reproduces vLLM's own scheduler step for step, on recorded vLLM decisions (issue 25).

``tests/fixtures/vllm_parity/{sync,async}.json`` hold vLLM 0.33.0's per-step decisions
(``Scheduler`` and ``AsyncScheduler``) for small seeded cases of every family, recorded by
``python -m benchmarks.vllm_parity --fixtures`` (needs vLLM; see the README). Here they are
replayed through simsched's ``vllm_v1`` preset and its public per-step record, without vLLM;
with their effects (free blocks after each step, cached blocks evicted per step, each request's
``num_preemptions``), and issue 40's witnesses: whole cases where a victim's last token is in
flight (async) or a victim scheduled earlier in the step keeps its newest block cached.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.parity.cases import FAMILIES, Case
from benchmarks.parity.compare import compare, effects, unpack, unpack_effects
from benchmarks.parity.sim import run_sim, run_sim_effects
from benchmarks.vllm_parity import WITNESSES
from simsched.config import field_names

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm_parity"

# Recorded cases simsched's vllm_v1 preset does not reproduce, each with the config field that
# makes the difference and why: (mode, case id) -> (field, reason). None today; an entry must
# name a documented config field, and a case listed here must really differ (stale entries fail).
KNOWN_DIFFERENCES: dict[tuple[str, int], tuple[str, str]] = {}


def _fixture(mode: str) -> dict:
    return json.loads((FIXTURES / f"{mode}.json").read_text())


def _cases(mode: str):
    for record in _fixture(mode)["cases"]:
        yield Case.from_json(record["case"]), unpack(record["steps"])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_fixtures_say_what_made_them(mode):
    data = _fixture(mode)
    assert data["vllm_version"] == "0.33.0"
    assert data["scheduler"] == ("AsyncScheduler" if mode == "async" else "Scheduler")
    assert data["regenerate"] == "python -m benchmarks.vllm_parity --fixtures"
    cases = [Case.from_json(r["case"]) for r in data["cases"]]
    assert len(cases) >= 150 and all(c.async_scheduling == (mode == "async") for c in cases)
    # Every family, both prefix-caching settings, both admission rules, both queue policies.
    assert {c.family for c in cases} == set(FAMILIES)
    for knob in ("enable_prefix_caching", "reserve_full_isl"):
        assert {getattr(c, knob) for c in cases} == {True, False}
    assert {c.policy for c in cases} == {"fcfs", "priority"}
    assert {c.block_size for c in cases} >= {1, 64} and min(c.max_num_batched_tokens
                                                            for c in cases) <= 2
    steps = [s for _, steps in _cases(mode) for s in steps]
    assert any(s[2] for s in steps)                                 # preemptions
    assert any(c for s in steps for _, _, c in s[1])                # prefix-cache hits


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_simsched_reproduces_every_recorded_step(mode):
    failures, stale, num_steps = [], [], 0
    for record in _fixture(mode)["cases"]:
        case, vllm_steps = Case.from_json(record["case"]), unpack(record["steps"])
        sim_steps, sim_effects = run_sim_effects(case)
        outcome = compare(vllm_steps, sim_steps)
        effects_diff = effects(unpack_effects(record["effects"]), sim_effects)
        num_steps += outcome.num_steps
        if (mode, case.case_id) in KNOWN_DIFFERENCES:
            if outcome.identical and not effects_diff:
                stale.append(case.case_id)
            continue
        if not outcome.identical or effects_diff:
            failures.append(f"{case.label()}\n{outcome.diff}{effects_diff}")
    assert not failures, f"{len(failures)} cases differ from vLLM:\n\n" + "\n\n".join(failures[:5])
    assert not stale, f"listed as differing but identical now: {stale}"
    assert num_steps > 1000


def test_known_differences_name_documented_options():
    for (mode, _), (field, reason) in KNOWN_DIFFERENCES.items():
        assert mode in ("sync", "async") and field in field_names() and reason


def _preempts(steps) -> bool:
    return any(s[2] for s in steps)


# Each of vLLM's rules is a switch, on by default (issue 40) and off in the classic preset. Set
# back to the classic value, each must change some recorded case, and only cases where its rule can apply (outside
# them it has no effect by construction: no prefix cache, no watermark, nothing preempted...).
SWITCHES = [
    ("sync", "prefix_hit_rule", "token", lambda c, s: c.enable_prefix_caching),
    ("sync", "prefix_cache_model", "segments", lambda c, s: c.enable_prefix_caching),
    ("sync", "watermark_counts_null_block", False, lambda c, s: c.watermark > 0),
    ("sync", "reserve_full_isl", False, lambda c, s: c.reserve_full_isl),
    ("sync", "victim_policy", "fewest_generated", lambda c, s: _preempts(s)),
    ("sync", "admit_after_preemption", True, lambda c, s: _preempts(s)),
    ("async", "plan_ahead", False, lambda c, s: True),
]


@pytest.mark.parametrize("mode, field, value, applies", SWITCHES,
                         ids=[f"{f}={v}" for _, f, v, _ in SWITCHES])
def test_each_vllm_rule_matters_where_it_applies(mode, field, value, applies):
    changed = 0
    for case, vllm_steps in _cases(mode):
        if not applies(case, vllm_steps):
            continue
        changed += not compare(vllm_steps, run_sim(case, **{field: value})).identical
    assert changed, f"{field}={value!r} changes no recorded case: the switch is untested"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_witnesses_are_recorded_whole(mode):
    """Issue 40's witnesses are in the fixtures, uncut, and show what they witness: async, a
    request preempted in a step after the one it finished in; sync, preemptions under the
    priority policy with prefix caching (where the newest-block rule moves evictions)."""
    records = _fixture(mode)["cases"][150:]
    wanted = [(family, i) for m, _, family, i in WITNESSES if m == mode]
    got = [(Case.from_json(r["case"]).family, Case.from_json(r["case"]).case_id) for r in records]
    assert got == wanted
    for record in records:
        steps = unpack(record["steps"])
        assert sum(record["effects"]["num_preemptions"]) == sum(len(s[2]) for s in steps) > 0
    if mode == "async":
        done, late = set(), 0
        for step in unpack(records[0]["steps"]):
            late += sum(r in done for r in step[2])
            done.update(step[3])
        assert late > 0
