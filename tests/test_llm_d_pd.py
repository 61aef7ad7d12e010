"""llm-d's P/D profile handler and deciders: the Go tests' tables, the YAML, and runs on
simsched's disaggregated pools (decode first, prefill only for enough uncached tokens)."""

import json
from pathlib import Path

import pytest

from simsched import SimConfig, simulate
from simsched.cluster.epp.config import parse
from simsched.cluster.epp.pd import AlwaysDisaggPDDecider, PrefixBasedPDDecider

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "llm_d_plugins.json").read_text())


@pytest.mark.parametrize("case", FIXTURES["pd_decider"], ids=lambda c: c["test"])
def test_prefix_based_decider_matches_go_tables(case):
    decider = PrefixBasedPDDecider(nonCachedTokens=case["nonCachedTokens"])
    got = decider.disaggregate(case["input_tokens"], case["matched_blocks"], case["block_size"])
    assert got is case["want"]


def test_decider_counts_blocks_times_block_size_and_always_decider():
    d = PrefixBasedPDDecider(nonCachedTokens=100)
    assert d.disaggregate(200, 6, 16)           # 200 - 96 = 104 uncached
    assert not d.disaggregate(200, 7, 16)       # 200 - 112 = 88
    assert AlwaysDisaggPDDecider().disaggregate(1, 1, 1)
    with pytest.raises(ValueError, match="cannot be negative"):
        PrefixBasedPDDecider(nonCachedTokens=-1)


def _pd_config(threshold, decider="prefix-based-pd-decider", handler=None):
    """llm-d's deploy/config/pd-epp-config.yaml, with ``nonCachedTokens`` = ``threshold``."""
    return {
        "apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "prefix-cache-scorer",
             "parameters": {"maxPrefixBlocksToMatch": 256, "lruCapacityPerServer": 31250}},
            {"type": "queue-scorer"}, {"type": "prefill-filter"}, {"type": "decode-filter"},
            {"type": "max-score-picker"},
            {"type": decider, **({"parameters": {"nonCachedTokens": threshold}}
                                 if decider == "prefix-based-pd-decider" else {})},
            handler or {"type": "disagg-profile-handler",
                        "parameters": {"deciders": {"prefill": decider}}}],
        "schedulingProfiles": [
            {"name": role, "plugins": [
                {"pluginRef": f"{role}-filter"}, {"pluginRef": "max-score-picker"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2},
                {"pluginRef": "queue-scorer", "weight": 1}]}
            for role in ("prefill", "decode")]}


def test_yaml_profiles_handler_and_refusals():
    pipe = parse(_pd_config(16))
    assert [p.name for p in pipe.profiles] == ["decode", "prefill"]     # decode is the primary
    assert pipe.handler.decider.non_cached_tokens == 16
    legacy = parse(_pd_config(16, handler={"type": "pd-profile-handler",
                                           "parameters": {"primaryPort": 8000}}))
    assert legacy.handler.decider is legacy.plugins["prefix-based-pd-decider"]
    bad = [
        ({"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "nope"}}},
         "deciders.prefill plugin not found: nope"),
        ({"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "x"},
                                                           "decodeProfile": "decode"}},
         "cannot mix"),
        ({"type": "disagg-profile-handler", "parameters": {"profiles": {"decode": "dec"}}},
         "profile named 'dec'"),
        ({"type": "pd-profile-handler", "parameters": {"primaryPort": 70000}}, "primaryPort"),
        ({"type": "disagg-profile-handler",
          "parameters": {"deciders": {"prefill": "queue-scorer"}}}, "is not a decider"),
    ]
    for handler, words in bad:
        with pytest.raises(ValueError, match=words):
            parse(_pd_config(16, handler=handler))
    two = _pd_config(16)
    two["plugins"] = two["plugins"][:-1]
    with pytest.raises(ValueError, match="profile handler"):
        parse(two)


def _run(config, **cluster):
    cfg = SimConfig().replace(num_replicas=4, roles=("prefill", "prefill", "decode", "decode"),
                              router="llm-d", router_options={"config": config},
                              num_requests=120, **cluster)
    return simulate(cfg).requests


def test_decode_first_prefill_only_for_long_uncached_prompts():
    df = _run(_pd_config(128))
    local = df.prefill_replica == df.decode_replica
    assert local.any() and (~local).any()
    # Decode-only requests are served whole on a decode replica; disaggregated ones are
    # prefilled on a prefill replica and moved.
    assert df[local].decode_replica.isin([2, 3]).all()
    assert (df[local].kv_transfer_bytes == 0).all()
    assert df[~local].prefill_replica.isin([0, 1]).all() and df[~local].decode_replica.isin(
        [2, 3]).all()
    assert (df[~local].kv_transfer_bytes > 0).all()
    # Nothing is cached on the decode replicas in this workload's first blocks beyond what
    # the index recorded, so disaggregated prompts are at least the threshold long; prompts
    # under it never are.
    assert (df[~local].num_prompt_tokens >= 128).all()
    assert (df[df.num_prompt_tokens < 128].prefill_replica
            == df[df.num_prompt_tokens < 128].decode_replica).all()


def test_threshold_zero_never_and_always_decider_always_disaggregates():
    never = _run(_pd_config(0))
    assert (never.prefill_replica == never.decode_replica).all()
    always = _run(_pd_config(0, decider="always-disagg-pd-decider"))
    assert (always.prefill_replica != always.decode_replica).all()
    assert always.prefill_replica.isin([0, 1]).all()


def test_pd_handler_needs_a_disaggregated_cluster_and_no_second_threshold():
    with pytest.raises(ValueError, match="needs a disaggregated cluster"):
        simulate(SimConfig().replace(num_replicas=2, router="llm-d", num_requests=5,
                                     router_options={"config": _pd_config(16)}))
    with pytest.raises(ValueError, match="disagg_min_prompt_tokens"):
        _run(_pd_config(16), disagg_min_prompt_tokens=10)
