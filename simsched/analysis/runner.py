"""Run one simulation: ``simulate(config, requests=None, cost_model=None) -> Results``.

Lives below the executors so sweeps can run it; :mod:`simsched.api` re-exports it."""

from __future__ import annotations

import ctypes
import sys
import warnings
from typing import Iterable

import numpy as np
import pandas as pd

from simsched.config import SimConfig
from simsched.cost import hardware
from simsched.cluster.cluster import Cluster, replica_specs
from simsched.cluster.lazy import LazyRequests
from simsched.cluster.autoscaler import TIMELINE_COLUMNS
from simsched.cluster.retries import ATTEMPT_COLUMNS
from simsched.analysis.attempts import split_attempts
from simsched.cluster.records import LORA_FIELDS
from simsched.cluster.sessions import build_sessions, is_closed_loop
from simsched.analysis import stream
from simsched.analysis.client_runs import (add_client_columns, client_info, client_plan,
                                           client_table)
from simsched.analysis.fleet_metrics import FleetResults, migrations_column, removal_info
from simsched.analysis.frames import build_requests_frame
from simsched.analysis.metrics import Results, build_replicas_frame, rejection_note
from simsched.analysis.progress import RunWatcher
# make_requests is re-exported (simsched.api and callers import it from here).
from simsched.analysis.request_table import (as_frame, make_requests, request_columns,
                                             validated_sessions)
from simsched.analysis.sharded import refuse_unshardable, sharded_cluster
from simsched.engine.kv.tiers import tier_summary
from simsched.engine.log import concat_frames, decode_step_ends
from simsched.engine.lora import check_adapters, lora_info
from simsched.engine.scheduler.speculative import merge_stats
from simsched.engine.steps import StepRecorder, steps_frame
from simsched.workloads.traces import apply_long_prompt_policy
from simsched.workloads.workload import generate


class RejectionWarning(UserWarning):
    """Some requests of a run were rejected (they can never fit the model's context or cache)."""


_MALLOC_TUNED = False


def return_freed_buffers() -> None:
    """Have glibc give freed multi-megabyte buffers back to the OS at once (once per process).

    glibc raises its mmap threshold each time a large buffer is freed (up to 32 MiB); buffers
    below it then come from the heap and, once freed, mostly stay in the process. A big run
    frees many such buffers (the workload table, per-run temporaries) before building its
    frames, which then peak about 90 MiB higher at a million requests. A fixed threshold (glibc's
    initial 128 KiB) keeps large buffers mapped, and freeing one unmaps it. Elsewhere a no-op.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(ctypes.c_int(-3), ctypes.c_int(128 * 1024))   # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass                                                          # not glibc


def workload_requests(config: SimConfig) -> pd.DataFrame:
    """The request table of ``config``'s workload, drawn from its seed.

    With ``long_prompt_policy`` ``clip`` or ``drop`` the workload is also fitted to the model's
    context: a request whose prompt plus output exceeds the context length (``max_model_len``)
    is clipped or dropped, as an over-long prompt is. With ``error`` such requests are left to
    the engine, which rejects them with a reason. With a benchmark client (``config.client``)
    the table is the client's prompts, in the order it sends them (their ``arrival_at`` unused).
    """
    table = generate(config.workload, np.random.default_rng(config.seed)) \
        if config.client.is_open else client_table(config)
    policy = config.workload.long_prompt_policy
    if policy != "error" and len(table):
        load_report = table.attrs.get("load_report")
        table, _ = apply_long_prompt_policy(table, None, policy,
                                            f"workload {config.workload.name!r}",
                                            max_total_tokens=hardware.max_model_len(
                                                config.hardware))
        if load_report is not None:
            table.attrs["load_report"] = load_report
    return table


def _run_streaming(config, handed: list, block, prefix, cost_model, path, progress, other,
                   sharding: dict):
    """:func:`run` writing its records under ``path`` as it goes (simsched.analysis.stream).

    ``handed`` holds the request frame and is emptied (the caller keeps no reference)."""
    frame = handed.pop()
    if other or config.check_invariants or config.cluster.disaggregated \
            or is_closed_loop(frame) or not config.client.is_open:
        raise ValueError("stream_to supports plain runs: no closed-loop sessions, benchmark "
                         "client, disaggregation, check_invariants, record_steps or "
                         "keep_engine")
    # The columns are read in place; the table goes before the store copies them compactly
    # (what the columns do not view, e.g. a tenant column without tenants, is freed first).
    columns = list(request_columns(frame, block, lazy=True, copy=False))
    del frame
    if columns.pop() is not None:
        # request_columns marks prefix columns and an adapter column alike (objects needed).
        raise ValueError("stream_to supports plain workloads: no prefix-cache content "
                         "(hash_ids, shared prefixes) and no LoRA adapters (adapter column)")
    reqs = stream.StreamingRequests.taking(path, columns, prefix)
    del columns
    if cost_model is not None and not callable(getattr(cost_model, "iteration_time", None)):
        raise ValueError("cost_model must have an iteration_time(batch) method")
    specs = replica_specs(config, cost_model)
    if sharding.get("shards") is not None:
        engine = sharded_cluster(config, reqs, specs, stream_to=path, **sharding)
    else:
        engine = Cluster(config, reqs, specs=specs)
    reqs.bind(engine)
    if progress:
        with RunWatcher(engine, len(reqs)):
            engine.run()
    else:
        engine.run()
    reqs.finish()
    sim_time = engine.env.now
    info = {"num_requests": len(reqs), "sim_time": sim_time, "num_events": engine.num_events,
            "num_shed": engine.num_shed, "num_replicas": len(engine.replicas),
            "replica_num_blocks": [s.num_blocks for s in specs]}
    if sharding.get("shards") is not None:
        info["sharding"] = engine.figures()
    extra = {}
    if engine.fleet is not None:
        fleet = FleetResults(engine.fleet.units_frame(sim_time), engine.autoscaler.frame(),
                             sim_time)
        info.update(fleet_cost=fleet.cost, fleet_replica_hours=fleet.replica_hours)
        info.update(removal_info(engine.fleet)[0])
        extra = {"fleet_units": fleet.units, "fleet_timeline": fleet.timeline}
    return stream.write_end(reqs, extra, info)


def _joined(step_ends: list) -> np.ndarray:
    """The replicas' step-end arrays as one, emptying ``step_ends`` (the caller keeps none)."""
    joined = step_ends[0] if len(step_ends) == 1 else np.concatenate(step_ends)
    step_ends.clear()
    return joined


def simulate(config: SimConfig | None = None, requests: Iterable | pd.DataFrame | None = None,
             cost_model=None, progress: bool = False, record_steps: bool = False,
             stream_to=None, ensemble: int | None = None, confidence: float = 0.9,
             shards: int | None = None, shard_workers: str = "process",
             ray_address: str | None = None):
    """Run one simulation and return its :class:`~simsched.analysis.metrics.Results`.

    ``requests`` overrides the configured workload (a table or tuples, see
    :func:`make_requests`; an empty one raises ValueError); ``cost_model`` overrides the one
    named by ``config.hardware``. ``progress`` shows the requests arrived and the simulated
    time while the run lasts more than a second (a bar on a terminal, a line every 30 s
    otherwise; see :mod:`simsched.analysis.progress`); it never changes the results.
    ``record_steps`` also records every scheduling step (``Results.steps``: one row per request
    per step, see :mod:`simsched.engine.steps`); off, it costs nothing.
    The same config and seed give identical frames.

    ``stream_to`` (a directory) streams the run's records to Parquet as it goes and returns a
    :class:`~simsched.analysis.stream.StreamedRun` instead of Results (see
    :mod:`simsched.analysis.stream`; plain workloads only).

    ``ensemble`` (N >= 2, with ``hardware.profile`` a calibrated profile) runs N coefficient
    sets drawn from the profile's posterior, each with its own seed, and returns an
    :class:`~simsched.analysis.ensemble.Ensemble`: every summary metric with its mean and a
    ``confidence`` prediction interval (:mod:`simsched.analysis.ensemble`).

    ``shards`` (N >= 1) splits a cluster's replicas across N shards run side by side
    (``shard_workers``: ``"process"``, local worker processes; ``"ray"``, Ray actors on the
    cluster at ``ray_address`` or a local one; ``"inline"``, this process), synchronised at
    every snapshot refresh: the same results as one process, bit for bit
    (:mod:`simsched.cluster.shards`; what cannot be exact is refused with a ValueError).
    """
    if ensemble is not None:
        from simsched.analysis.ensemble import ensemble as run_ensemble

        if cost_model is not None or stream_to is not None:
            raise ValueError("ensemble draws its own cost models and returns summaries: it "
                             "takes neither cost_model nor stream_to")
        if shards is not None:
            raise ValueError("ensemble and shards cannot be combined")
        return run_ensemble(simulate, config or SimConfig(), ensemble, confidence, requests,
                            progress=progress, record_steps=record_steps)
    return run(config, requests, cost_model, progress=progress, record_steps=record_steps,
               stream_to=stream_to, shards=shards, shard_workers=shard_workers,
               ray_address=ray_address)[0]


def run(config: SimConfig | None = None, requests: Iterable | pd.DataFrame | None = None,
        cost_model=None, keep_engine: bool = False,
        from_workload: bool | None = None,
        progress: bool = False, record_steps: bool = False,
        stream_to=None, shards: int | None = None, shard_workers: str = "process",
        ray_address: str | None = None) -> tuple[Results, Cluster | None]:
    """:func:`simulate`, also returning the finished engine when ``keep_engine`` (for checks).

    ``from_workload`` says ``requests`` is the config's own workload table (drawn ahead by the
    caller), so a rejection warning may suggest the workload's ``long_prompt_policy``.
    """
    config = config or SimConfig()
    return_freed_buffers()
    if not isinstance(config, SimConfig):
        raise ValueError(f"config must be a SimConfig, got {type(config).__name__}")
    if stream_to is not None and config.faults.enabled:
        raise ValueError("stream_to: a run with faults (client timeouts, retries, replica "
                         "failures) is not streamed yet; run it without stream_to")
    if shards is not None:
        refuse_unshardable(config, shards, record_steps, keep_engine)
    if stream_to is not None:
        stream_to = stream.prepare_target(stream_to)    # before the workload is drawn
    from_workload = requests is None if from_workload is None else from_workload
    # A table the caller drew from the workload (a sweep) is used as given, not drawn again.
    table = workload_requests(config) if requests is None else requests
    sessions = None
    frame = as_frame(table)
    if not from_workload and not len(frame):
        raise ValueError("requests is empty: give at least one request, or requests=None to "
                         "draw the config's workload")
    # Prefix-cache columns in the frames only where they can say something (memory of big runs).
    prefix = config.cache.enable_prefix_caching or any(
        c in frame.columns for c in ("hash_ids", "prefix_group", "session_id"))
    block = int(frame.attrs.get("hash_block_size", config.workload.hash_block_size))
    lora = "adapter" in frame.columns and check_adapters(config, frame)
    if stream_to is not None:
        # The table is handed over: a drawn workload's frame goes once its columns are read
        # (a streamed day holds its requests' columns once, not twice).
        handed = [frame]
        del table, frame
        return _run_streaming(config, handed, block, prefix, cost_model, stream_to, progress,
                              keep_engine or record_steps,
                              dict(shards=shards, workers=shard_workers,
                                   ray_address=ray_address)), None
    plan = None
    if not config.client.is_open:
        # A benchmark client: requests are created as it sends them (appended to reqs).
        plan, reqs = client_plan(config, frame, block), []
    elif is_closed_loop(frame):
        # Closed-loop sessions: turns are created as they arrive (appended to reqs).
        sessions, reqs = build_sessions(validated_sessions(frame), block), []
    elif config.check_invariants or keep_engine or config.faults.enabled:
        # The checks read every request object; retries copy theirs.
        reqs = make_requests(frame, block)
    else:
        columns = request_columns(frame, block, lazy=True)
        if columns[-1] is None:
            # Plain requests: created at arrival and recorded into arrays when done, so a big
            # run holds only the requests in flight.
            reqs = LazyRequests(*columns[:-1])
        else:
            reqs = make_requests(frame, block)
        del columns
    del table, frame  # the Request objects now hold everything; keep a big run's peak memory down
    if cost_model is not None and not callable(getattr(cost_model, "iteration_time", None)):
        raise ValueError("cost_model must have an iteration_time(batch) method")
    specs = replica_specs(config, cost_model)
    if shards is not None:
        engine = sharded_cluster(config, reqs, specs, shards, shard_workers, ray_address)
    else:
        engine = Cluster(config, reqs, specs=specs, sessions=sessions, client=plan)
    # Installed before the run starts (the GPU loops look the scheduler's methods up once),
    # and on each replica an autoscaled fleet adds, as it is made.
    recorders = None
    if record_steps:
        recorders = [StepRecorder(r.scheduler, r.index) for r in engine.replicas]
        engine.on_replica_added = lambda r: recorders.append(StepRecorder(r.scheduler, r.index))
    if progress:
        # Closed-loop sessions create their turns as they go: no total to show.
        with RunWatcher(engine, None if sessions is not None or plan is not None
                        else len(reqs)):
            engine.run()
    else:
        engine.run()
    steps = None
    if recorders is not None:
        steps = steps_frame([row for rec in recorders for row in rec.rows])
        del recorders
    replicas = engine.replicas
    info = {"num_blocks": sum(s.num_blocks for s in specs),
            "replica_num_blocks": [s.num_blocks for s in specs],
            "num_events": engine.num_events, "num_shed": engine.num_shed,
            "num_waiting_at_end": sum(r.num_waiting for r in replicas),
            "num_running_at_end": sum(len(r.scheduler.running) for r in replicas),
            "kv_blocks_used_at_end": sum(r.kv.num_used for r in replicas)}
    tiers = tier_summary([r.kv for r in replicas])     # tiered KV cache: per-tier totals
    if tiers:
        info["kv_tiers"] = tiers
    spec_stats = merge_stats(replicas)
    if spec_stats is not None:      # speculative decoding: simsched.analysis.speculative
        info["speculative"] = spec_stats
    described = [{"model": s.config.hardware.model, "gpu": s.config.hardware.gpu,
                  "tensor_parallel_size": s.config.hardware.tensor_parallel_size,
                  "num_blocks": s.num_blocks} for s in specs]
    iterations = concat_frames([r.iteration_rows for r in replicas])
    for r in replicas:
        r.iteration_rows = None
    step_ends = decode_step_ends(iterations, len(replicas))
    sim_time = engine.env.now
    fleet = moves = None
    if engine.fleet is not None:
        # (A fixed cluster whose replicas fail has a fleet but no autoscaler: no timeline.)
        timeline = engine.autoscaler.frame() if engine.autoscaler is not None \
            else pd.DataFrame(columns=list(TIMELINE_COLUMNS))
        fleet = FleetResults(engine.fleet.units_frame(sim_time), timeline, sim_time)
        info["fleet_cost"] = fleet.cost
        info["fleet_replica_hours"] = fleet.replica_hours
        removed, moves = removal_info(engine.fleet)
        info.update(removed)
    disagg = engine.disagg.columns() if engine.disagg is not None else None
    clients = engine.clients
    failures = engine.failures.frame() if engine.failures is not None else None
    links = transfers = None
    if engine.link_faults is not None:      # degraded links: timelines, transfer attempts
        links, transfers = (engine.link_faults.links_frame(sim_time),
                            engine.link_faults.transfers_frame())
        info.update(engine.link_faults.info())
    if failures is not None:
        info["num_replica_failures"] = len(failures)
        lost = getattr(engine.failures, "num_aborted_kv_tokens", None)
        if lost is not None:    # a disaggregated pool's failures: the KV its requests lost
            info["num_aborted_kv_tokens"] = info.get("num_aborted_kv_tokens", 0) + lost
    if clients is not None:
        info.update(num_retries=clients.num_retries,
                    num_retries_refused=clients.num_budget_refusals)
    info["num_gpus"] = sum(s.config.hardware.tensor_parallel_size for s in specs)
    if shards is not None:
        info["sharding"] = engine.figures()     # the synchronisation's cost
    if lora:
        info.update(lora_info(engine.replicas))
        waited = info.pop("lora_waited")
    if engine.replica_of is None:
        owner = np.zeros(len(reqs), dtype=np.int64)
    else:
        owner = np.frombuffer(engine.replica_of, dtype=np.int32).astype(np.int64)
        if len(owner) < len(reqs):
            # Attempts sent late (retries) and never routed (shed, or no replica up).
            owner = np.concatenate([owner, np.full(len(reqs) - len(owner), -1)])
    if plan is not None:
        # The ready check and the warm-ups (the first requests sent) are not measured.
        skip = plan.num_warmup_requests
        reqs, owner = reqs[skip:], owner[skip:]
        info["client"] = client_info(plan, sim_time)
    step_offset = None
    if len(step_ends) > 1:
        # Each request's decode steps index its own replica's array: shift them into one.
        starts = np.cumsum([0] + [len(s) for s in step_ends[:-1]])
        step_offset = starts[np.maximum(owner, 0)]
    del replicas
    # Without end-of-run checks nothing needs the request objects once read: let them go while
    # the request frame is built, so a big run's peak memory is the simulation's, not twice it.
    release = not (config.check_invariants or keep_engine)
    if release:
        del engine
    delays = np.array([float(getattr(s.cost_model, "output_delay", 0.0)) for s in specs])
    # Client-side token times where an engine profile has an output path (vllm_v1); a request
    # that never reached a replica (shed) has no tokens to delay.
    delay = delays[np.maximum(owner, 0)] if delays.any() else None
    # The step ends are handed over (_joined keeps no reference): the builder drops them as
    # soon as it has read them, before the frame's columns come.
    req_df, itl, causes = build_requests_frame(reqs, _joined(step_ends), release=release,
                                               step_offset=step_offset, prefix=prefix,
                                               replica=owner, output_delay=delay,
                                               extra_fields=LORA_FIELDS if lora else ())
    del step_offset, delay, owner, reqs
    if lora:
        ids = req_df["request_id"].to_numpy()
        # TTFT = queue time + lora_load_time (adapter loads in its prefill's steps) + the rest.
        req_df["lora_load_time"] = [waited.get(i, 0.0) for i in ids.tolist()]
    if plan is not None:
        add_client_columns(req_df, plan)
    if moves is not None:       # removed replicas' requests migrated (autoscaling)
        req_df["num_migrations"] = migrations_column(req_df["request_id"].to_numpy(), moves)
    if disagg is not None:
        ids = req_df["request_id"].to_numpy()
        for k, (name, values) in enumerate(disagg.items()):
            req_df.insert(2 + k, name, np.asarray(values)[ids])
    attempts = None
    if clients is not None:
        # One row per attempt, and the user's view: one row per request (its deciding attempt).
        req_df, attempts = split_attempts(req_df, clients.attempts, ATTEMPT_COLUMNS)
        del clients
    results = Results(req_df, iterations, itl, causes, config=config, sim_time=sim_time,
                      info=info, replicas=build_replicas_frame(req_df, iterations, described),
                      steps=steps)
    results.fleet = fleet
    results.attempts = attempts
    results.failures = failures
    results.links, results.transfers = links, transfers
    note = rejection_note(req_df, hint=from_workload)
    if note:
        warnings.warn(note, RejectionWarning, stacklevel=3)
    return results, (None if release else engine)
