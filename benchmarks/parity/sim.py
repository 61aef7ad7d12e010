"""Run a parity case in simsched and read its decisions from the public per-step record.

One step is one unit of time (:class:`~simsched.cost.base.UnitCostModel`), requests arrive at
whole steps, and simsched reads the case's blocks without vLLM's null block. Only
``Results.steps`` (``simulate(..., record_steps=True)``) is read, never the scheduler's state.

A step's decisions, as both sides report them (:func:`steps_of`): ``[time, scheduled, preempted,
finished]`` where ``scheduled`` is ``[[request, tokens, cached], ...]`` (tokens scheduled, prompt
and decode together; prompt tokens the prefix cache served, non-zero only at an admission),
``preempted`` and ``finished`` sorted request indices.
"""

from __future__ import annotations

import pandas as pd

import simsched
from simsched import SimConfig, UnitCostModel

from benchmarks.parity.cases import MAX_MODEL_LEN, Case


def sim_config(case: Case, **overrides) -> SimConfig:
    """The simsched config of ``case``: the ``vllm_v1`` preset at the case's limits and knobs
    (``plan_ahead`` for vLLM's async scheduler). ``overrides`` (flat or dotted field names)
    change it further."""
    fields = dict(policy=case.policy, max_num_seqs=case.max_num_seqs,
                  max_num_batched_tokens=case.max_num_batched_tokens,
                  reserve_full_isl=case.reserve_full_isl, plan_ahead=case.async_scheduling,
                  block_size=case.block_size, num_blocks=case.num_blocks - 1,
                  enable_prefix_caching=case.enable_prefix_caching, watermark=case.watermark,
                  max_model_len=MAX_MODEL_LEN)
    fields.update(overrides)
    return SimConfig.preset("vllm_v1", **fields)


def sim_requests(case: Case) -> pd.DataFrame:
    """The case's requests as a simsched request table (hash ids in the case's block size)."""
    df = pd.DataFrame({
        "arrival_at": [float(r.arrival) for r in case.requests],
        "num_prompt_tokens": [r.num_prompt_tokens for r in case.requests],
        "num_output_tokens": [r.num_output_tokens for r in case.requests],
        "priority": [r.priority for r in case.requests],
        "hash_ids": [list(r.hash_ids) for r in case.requests],
    })
    df.attrs["hash_block_size"] = case.hash_block_size
    return df


def steps_of(frame: pd.DataFrame) -> list:
    """``Results.steps`` as the comparison's step list (see the module docstring)."""
    out: list = []
    if frame is None or frame.empty:
        return out
    columns = zip(*(frame[c].tolist() for c in (
        "step", "started_at", "request_id", "num_prefill_tokens", "num_decode_tokens",
        "num_cached_tokens", "preempted", "finished")))
    current = None
    for step, at, rid, prefill, decode, cached, preempted, finished in columns:
        if current is None or current[0] != step:
            current = [step, [int(round(at)), [], [], []]]
            out.append(current[1])
        record = current[1]
        if prefill + decode:
            record[1].append([rid, prefill + decode, cached])
        if preempted:
            record[2].append(rid)
        if finished:
            record[3].append(rid)
    for record in out:          # the frame is sorted by step, then request id
        record[1].sort()
    return out


def effects_of(res, case: Case) -> dict:
    """What the run's decisions did besides the steps, as :func:`benchmarks.parity.engine.
    effects_of` has vLLM's: free blocks after each step's plan (vLLM's count: empty plus
    evictable cached blocks), cached blocks evicted in each step (from the iteration log) and each
    request's ``num_preemptions`` (from the request frame)."""
    it = res.iterations
    free = (case.num_blocks - 1 - it["kv_blocks_used"]).tolist()
    evicted = it["num_evicted_blocks"].tolist() if "num_evicted_blocks" in it else [0] * len(it)
    pre = res.requests.sort_values("request_id")["num_preemptions"].tolist()
    return {"free_blocks": [int(x) for x in free], "evicted_blocks": [int(x) for x in evicted],
            "num_preemptions": [int(x) for x in pre]}


def run_sim_effects(case: Case, **overrides) -> tuple[list, dict]:
    """simsched's steps for ``case`` and their effects (:func:`effects_of`)."""
    res = simsched.simulate(sim_config(case, **overrides), sim_requests(case),
                            cost_model=UnitCostModel(), record_steps=True)
    return steps_of(res.steps), effects_of(res, case)


def run_sim(case: Case, **overrides) -> list:
    """simsched's steps for ``case`` (see :func:`steps_of`)."""
    return run_sim_effects(case, **overrides)[0]
