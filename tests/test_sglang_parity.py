"""Replays batches SGLang 0.5.9's own scheduling classes formed (benchmarks/engines/parity_driver.py)
against simsched's SGLang scheduler, without SGLang installed: every batch identical."""

import json
from pathlib import Path

import pytest

from benchmarks.engines.parity import first_difference, run_case
from benchmarks.engines.parity_cases import make_case

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "sglang_parity").glob("*.json"))


def test_fixtures_cover_every_family_and_retraction():
    entries = [json.loads(p.read_text()) for p in FIXTURES]
    assert {e["family"] for e in entries} == {"light", "budget", "kv_retract", "prefix_evict",
                                              "mixed"}
    assert any(step.get("retracted") for e in entries for step in e["trace"])
    # --enable-mixed-chunk: prefill batches that decode the running requests too.
    assert any(step["kind"] == "prefill" and step.get("decode") for e in entries
               for step in e["trace"])
    assert any(c for e in entries for step in e["trace"] if step["kind"] == "prefill"
               for _, c in step["cached"])


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_simsched_forms_sglangs_batches(path):
    entry = json.loads(path.read_text())
    ours = run_case(make_case(entry["family"], entry["seed"]))
    k = first_difference(ours, entry["trace"])
    assert k is None, f"batch {k}: simsched {ours[k] if k < len(ours) else None} vs " \
                      f"SGLang {entry['trace'][k] if k < len(entry['trace']) else None}"
