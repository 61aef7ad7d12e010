"""A run with a benchmark client (``SimConfig.client``): its prompts, its plan, its records.

:func:`client_table` is the client's dataset as a request table (what
:func:`~simsched.analysis.runner.workload_requests` returns for such a config, so sweeps draw
it too); :func:`client_plan` turns a table into the
:class:`~simsched.cluster.clients.ClientPlan` the cluster runs; :func:`add_client_columns`
adds the client's columns to the measured requests' frame and :func:`client_info` its summary
(``Results.info["client"]``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from simsched.analysis.request_table import make_requests
from simsched.cluster.clients import ClientPlan
from simsched.workloads.benchmark_clients import random_dataset
from simsched.workloads.workload import generate

__all__ = ["add_client_columns", "client_info", "client_plan", "client_table"]


def client_table(config) -> pd.DataFrame:
    """The prompts ``config.client`` sends, in order, as a request table.

    A random dataset draws ``num_prompts`` (or the stages' total) prompts from the run's seed
    (see :func:`~simsched.workloads.benchmark_clients.random_dataset`); ``dataset='workload'``
    draws the workload, asking it for the number of prompts the client needs when the client
    names one (``num_prompts``, stages, or ``num_unique_prompts`` for a cycled pool).
    """
    client = config.client
    pool = client.num_unique_prompts
    # Warm-ups drawn from the dataset come ahead of the measured prompts.
    ahead = client.num_warmups if client.warmup_prompts == "dataset" else 0
    if client.dataset != "workload":
        n = pool or client.resolved_num_prompts() + ahead
        return random_dataset(n, config.seed, client.random_input_len, client.random_output_len,
                              client.random_range_ratio, client.random_prefix_len,
                              client.num_special_tokens,
                              "vllm" if client.dataset == "random" else "inferencex")
    workload = config.workload
    wanted = pool or (client.resolved_num_prompts() + ahead
                      if client.client_type == "staged" or client.num_prompts is not None
                      else None)
    if wanted is not None:
        workload = dataclasses.replace(workload, num_requests=wanted, duration=None)
    return generate(workload, np.random.default_rng(config.seed))


def client_plan(config, frame: pd.DataFrame, block: int) -> ClientPlan:
    """The plan of ``config.client`` over the prompts of ``frame`` (rows in arrival order:
    a drawn workload's order; the client sends them in that order, at its own times)."""
    if "session_id" in frame.columns and "think_time" in frame.columns:
        raise ValueError("client: a benchmark client sends independent requests; closed-loop "
                         "sessions (workload 'sessions', a think_time column) have their own "
                         "loop: set client.client_type='open'")
    return ClientPlan(config.client, make_requests(frame, block), config.seed)


def add_client_columns(df: pd.DataFrame, plan: ClientPlan) -> None:
    """Add ``scheduled_at`` (when the client meant to send each request), ``client_queue_time``
    (``arrival_at - scheduled_at``: waiting for a free slot, vLLM's ``client_queue_time``) and,
    for inference-perf's stages, ``stage`` to the measured requests' frame (in place)."""
    ids = df["request_id"].to_numpy()
    scheduled = np.asarray(plan.scheduled_at, dtype=float)[ids]
    at = df.columns.get_loc("arrival_at") + 1
    df.insert(at, "scheduled_at", scheduled)
    df.insert(at + 1, "client_queue_time", df["arrival_at"].to_numpy() - scheduled)
    if plan.client.client_type == "staged":
        df.insert(at + 2, "stage", np.asarray(plan.stage_of, dtype=np.int64)[ids])


def client_info(plan: ClientPlan, sim_time: float) -> dict:
    """The client's part of ``Results.info``: its type, the warm-ups left out, when the measured
    requests started, the most requests it had in flight, and how often it reused a prompt
    (``num_distinct_prompts`` sent in all, warm-ups included; ``num_repeated_prompts``:
    measured requests whose prompt had been sent before, which a prefix cache may serve)."""
    seen = {k for phase in plan.warmups for k in phase}
    repeated = 0
    for stage in plan.stages:
        for k in stage.prompts:
            repeated += k in seen
            seen.add(k)
    return {"client_type": plan.client.client_type,
            "num_warmup_requests": plan.num_warmup_requests,
            "benchmark_start_at": plan.benchmark_start_at,
            "benchmark_duration": sim_time - plan.benchmark_start_at,
            "max_concurrency": plan.max_concurrency,
            "max_num_in_flight": plan.max_num_in_flight,
            "num_distinct_prompts": len(seen),
            "num_repeated_prompts": repeated}
